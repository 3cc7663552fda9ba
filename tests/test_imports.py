"""How edgetrain's modules import each other: a light CLI, public names across modules, no cycles."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import edgetrain

SRC = Path(edgetrain.__file__).parent


def _modules() -> dict[str, tuple[Path, ast.Module]]:
    """Dotted name -> (file, syntax tree) of every module of the package (a package by its ``__init__``)."""
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = (path, ast.parse(path.read_text(encoding="utf-8")))
    return found


def _imports(name: str, path: Path, tree: ast.Module) -> list[tuple[ast.ImportFrom | ast.Import, str]]:
    """Every import of a package module in ``tree`` (in functions too, not under ``if TYPE_CHECKING``).

    Returns (node, absolute name of the module it imports from).
    """
    type_only = {id(node) for branch in ast.walk(tree)
                 if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
                 for statement in branch.body for node in ast.walk(statement)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: list[tuple[ast.ImportFrom | ast.Import, str]] = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] == "edgetrain":
                found.append((node, target))
        elif isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names if alias.name.split(".")[0] == "edgetrain"]
    return found


def test_importing_the_cli_does_not_import_torch() -> None:
    # Execute: a fresh interpreter, as the `edgetrain` script starts
    result = subprocess.run([sys.executable, "-c", "import edgetrain.cli, sys; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True, timeout=120)

    # Assert
    assert result.stdout.strip() == "False"


def test_public_api_is_lazy_and_complete() -> None:
    # Execute: a fresh interpreter; the profiling package is imported before the function is read
    code = ("import sys, edgetrain; torch_at_start = 'torch' in sys.modules; import edgetrain.profiling.estimate; "
            "from edgetrain import plan, profile; "
            "print(torch_at_start, all(hasattr(edgetrain, n) for n in edgetrain.__all__), callable(profile), "
            "edgetrain.profile is sys.modules['edgetrain.profiling'].profile, plan.__module__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)

    # Assert
    assert result.stdout.split() == ["False", "True", "True", "True", "edgetrain.planners.choose"]


PUBLIC_NAMES = [
    "Chain", "StageCost", "Schedule", "Stats", "Forward", "Backward", "Discard", "Keep", "PageOut", "PageIn",
    "PageOutRecord", "PageInRecord", "keep_all", "simulate", "validate", "profile", "estimate_memory",
    "measure_training_step", "plan", "Plan", "Checkpointed", "fit_compiled", "Executor", "run_schedule",
    "EdgetrainError", "InfeasibleBudgetError", "ScheduleError", "UnknownNameError", "parse_bytes", "format_bytes",
]


def test_the_public_names_stay() -> None:
    # A name leaves the public API only on purpose: this list changes with it.
    assert edgetrain.__all__ == PUBLIC_NAMES


def test_subpackages_are_attributes_as_in_other_libraries() -> None:
    # Execute: a fresh interpreter that imports only the package
    code = ("import edgetrain; print(edgetrain.planners.plan is edgetrain.plan, edgetrain.runtime.Checkpointed is "
            "edgetrain.Checkpointed, callable(edgetrain.profile), hasattr(edgetrain, 'no_such_module'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)

    # Assert: subpackages load on first read; the function profile keeps its name; unknown names stay unknown
    assert result.stdout.split() == ["True", "True", "True", "False"]


def test_the_root_holds_only_the_entry_the_errors_and_the_units() -> None:
    # Everything else lives in a folder named for what it holds (docs/contributing.md, "Layout")
    assert sorted(path.name for path in SRC.glob("*.py")) == ["__init__.py", "__main__.py", "errors.py", "units.py"]


def test_no_module_imports_a_private_name_of_another() -> None:
    # Prepare
    modules = _modules()

    # Execute
    private = [f"{path.relative_to(SRC.parent)}:{node.lineno} imports {alias.name} from {target}"
               for name, (path, tree) in modules.items() for node, target in _imports(name, path, tree)
               if isinstance(node, ast.ImportFrom) for alias in node.names
               if alias.name.startswith("_") and not alias.name.startswith("__")]

    # Assert
    assert private == [], "a name two modules share wants a public name (in a shared module if need be)"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports (an import of ``a.b.c`` counting as one of ``a.b.c`` and of
    ``a.b``), without a module's imports of its own parent packages."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, (path, tree) in modules.items():
        targets = set()
        for node, target in _imports(name, path, tree):
            names = [alias.name for alias in node.names]
            wanted = [f"{target}.{n}" if f"{target}.{n}" in modules else target for n in names]
            if isinstance(node, ast.Import):
                wanted = [target]
            for module in wanted:
                parts = module.split(".")
                targets |= {".".join(parts[:i]) for i in range(2, len(parts) + 1)}
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}

    return graph


def test_modules_import_each_other_without_cycles() -> None:
    """Lower floors never import higher ones, even inside functions: the import graph has no cycle.

    A module's import of its own parent package is left out: ``__init__`` re-exports its
    submodules, which necessarily import their package first.
    """
    # Prepare
    graph = _import_graph()

    # Execute: depth-first search for a back edge
    state: dict[str, int] = {}   # 1 on the stack, 2 done
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        stack.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target):], target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)

    # Assert
    assert cycles == [], "move the shared constant or function down to the lower floor"


def test_no_folder_imports_one_that_imports_it_back() -> None:
    """The folders stack as floors: where a module of ``a/`` imports one of ``b/``, no module of ``b/`` imports
    one of ``a/``. The root's ``errors`` and ``units`` are the ground floor, ``__main__`` the top."""
    # Prepare: the folder of each module
    def folder(module: str) -> str:
        parts = module.split(".")
        if len(parts) == 2 and not (SRC / parts[1]).is_dir():
            return "__main__" if parts[1] == "__main__" else ""
        return parts[1] if len(parts) > 1 else ""

    # Execute
    edges = {(folder(module), folder(target)) for module, targets in _import_graph().items() for target in targets}
    both_ways = sorted({tuple(sorted(edge)) for edge in edges if edge[0] != edge[1] and edge[::-1] in edges})

    # Assert
    assert both_ways == [], "a folder's module and another's import each other: move one down a floor"
