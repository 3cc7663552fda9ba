"""The benchmarks' entry point: list them, run them into their results files, make the results pages.

    python -m benchmarks list
    python -m benchmarks run NAME... [--quick]      # or --all
    python -m benchmarks pages [--check]

A benchmark is a module of this package, not named ``_*``, with a ``TITLE``, a ``run(quick)`` that returns its result
as plain JSON data, and a ``render(result)`` that turns that result into the body of its results page; the runner
finds every such module. Several benchmarks run each in a child process of its own. Bad input (an unknown benchmark, a
results file of another format) is one line on stderr and exit code 2; a benchmark that fails, exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import pkgutil
import shlex
import sys
from pathlib import Path
from types import ModuleType

from edgetrain.bench import BenchmarkResult, provenance, read_result, write_result
from edgetrain.errors import EdgetrainError

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
PAGES = ROOT / "docs" / "results"


def _registered() -> tuple[str, ...]:
    """Every module of this package that defines a ``TITLE``, by name; the helpers (``_*``) are not benchmarks."""
    names = sorted(info.name for info in pkgutil.iter_modules([str(ROOT / "benchmarks")])
                   if not info.name.startswith("_"))
    return tuple(name for name in names if "\nTITLE = " in (ROOT / "benchmarks" / f"{name}.py").read_text())


BENCHMARKS = _registered()


def load(name: str) -> ModuleType:
    if name not in BENCHMARKS:
        raise EdgetrainError(f"unknown benchmark {name!r}; valid names: {', '.join(BENCHMARKS)}")
    return importlib.import_module(f"benchmarks.{name}")


def results_path(name: str) -> Path:
    return RESULTS / f"{name}.json"


def page_path(name: str) -> Path:
    return PAGES / f"{name}.md"


def page(module: ModuleType, benchmark: BenchmarkResult) -> str:
    """The results page of ``benchmark``: its title, its rendered result and its provenance, from the file alone."""
    rows = "\n".join(f"| {key} | {_cell(value)} |" for key, value in benchmark.provenance.items())
    return (f"# {module.TITLE}\n\n{module.render(benchmark.result).strip()}\n\n## Provenance\n\n"
            f"Made by `python -m benchmarks pages` from `benchmarks/results/{benchmark.name}.json`.\n\n"
            f"| | |\n|---|---|\n{rows}\n")


def _cell(value: object) -> str:
    if isinstance(value, str):
        return f"`{value}`" if value else ""
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "" if value is None else str(value)


def run(names: list[str], quick: bool) -> list[str]:
    """Run ``names`` into their results files and pages; the names of those that failed.

    One benchmark runs in this process; several run each in a child forked from this one, so that what one leaves
    behind (the interpreter's heap, threads, a memory baseline it measured) weighs on no other's figures, and one that
    fails stops none of the rest. Forking shares the imports (seconds each) and nothing else: this process has run
    no benchmark when it forks.
    """
    modules = [load(name) for name in names]   # every name is checked before any benchmark runs
    if len(names) > 1:
        return [name for name in names if not _ran_in_child(name, quick)]
    for name, module in zip(names, modules, strict=True):
        command = shlex.join(["python", "-m", "benchmarks", "run", name, *(["--quick"] if quick else [])])
        print(f"running {name}{' (quick)' if quick else ''}", file=sys.stderr, flush=True)
        result = module.run(quick)
        outputs = tuple(str(folder.relative_to(ROOT)) for folder in (RESULTS, PAGES))
        benchmark = BenchmarkResult(name, result, {**provenance(command, ROOT, outputs), "quick": quick})
        write_result(results_path(name), benchmark)
        page_path(name).parent.mkdir(parents=True, exist_ok=True)
        page_path(name).write_text(page(module, benchmark))
        INDEX.write_text(index_page())
        print(f"{results_path(name).relative_to(ROOT)}, {page_path(name).relative_to(ROOT)}", flush=True)
    return []


def _ran_in_child(name: str, quick: bool) -> bool:
    """Whether benchmark ``name`` ran to its results file in a child forked from this process."""
    child = multiprocessing.get_context("fork").Process(target=_child, args=(name, quick), name=f"benchmark {name}")
    child.start()
    child.join()
    return child.exitcode == 0


def _child(name: str, quick: bool) -> None:
    try:
        run([name], quick)
    except EdgetrainError as exc:
        print(f"error: {name}: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


INDEX = PAGES / "index.md"
# What sits under benchmarks/results/ beside the results files and no benchmark writes: a benchmark's own records are
# its module's ``KEPT_FILES`` (path under benchmarks/results/ -> what it holds), listed under its entry.
COMMAND_RECORDS = {
    "insitu/": "in-situ simulation reports that `edgetrain insitu simulate --json` wrote, with their commands in "
               "`insitu/README.md`",
}


def records(module: ModuleType) -> dict[str, str]:
    """The benchmark's files under benchmarks/results/ beside its results file (its ``KEPT_FILES``)."""
    return dict(getattr(module, "KEPT_FILES", {}))


def index_page() -> str:
    """The results index: every benchmark with a results file, its command and run, then the other records."""
    rows, kept = [], []
    for name in BENCHMARKS:
        if not results_path(name).exists():
            continue
        module = load(name)
        run = "quick" if read_result(results_path(name)).provenance.get("quick") else "full"
        rows.append(f"| [{module.TITLE}]({name}.md) | `python -m benchmarks run {name}` | {run} |")
        kept += [f"| `{path}` | [{name}]({name}.md) | {what} |" for path, what in records(module).items()]
    kept += [f"| `{path}` | `edgetrain` | {what} |" for path, what in COMMAND_RECORDS.items()]
    return ("# Results\n\nEvery figure in this documentation comes with the command that reproduces it. Each page "
            "below is made by `python -m benchmarks pages` from its benchmark's results file, "
            "`benchmarks/results/NAME.json`, which records the command, commit, date, machine, software and load of "
            "its run. A quick run (`--quick`) measures smaller sizes with fewer rounds; its page says so.\n\n"
            "| page | command | committed run |\n|---|---|---|\n" + "\n".join(rows)
            + "\n\n## Other records under `benchmarks/results/`\n\n| path | made by | what it holds |\n|---|---|---|\n"
            + "\n".join(kept) + "\n")


def pages(check: bool) -> int:
    """Make every registered benchmark's page from its results file, and the index; with ``check``, 1 if a committed
    page differs."""
    stale = []
    made = [(page_path(name), page(load(name), read_result(results_path(name))))
            for name in BENCHMARKS if results_path(name).exists()]
    for path, text in [*made, (INDEX, index_page())]:
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(text)
    if stale:
        print(f"results pages differ from their results files: {', '.join(stale)}; run `python -m benchmarks pages`",
              file=sys.stderr)
    return 1 if stale else 0


def _in_quick(name: str) -> bool:
    """Whether ``run --all --quick`` runs the benchmark: one whose measure is the whole of something says not."""
    return bool(getattr(load(name), "IN_QUICK", True))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="the benchmarks and what each measures")
    runner = commands.add_parser("run", help="run benchmarks into their results files and pages")
    runner.add_argument("names", nargs="*", metavar="NAME")
    runner.add_argument("--all", action="store_true", help="every benchmark")
    runner.add_argument("--quick", action="store_true", help="smaller sizes and fewer rounds")
    checker = commands.add_parser("pages", help="make the results pages from the results files")
    checker.add_argument("--check", action="store_true", help="exit 1 if a committed page is not its file's")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            for name in BENCHMARKS:
                print(f"{name}: {load(name).TITLE}")
            return 0
        if args.command == "run":
            if bool(args.names) == args.all:
                parser.error("give benchmark names or --all")
            names = args.names or [name for name in BENCHMARKS if not (args.quick and not _in_quick(name))]
            failed = run(names, args.quick)
            if failed:
                print(f"error: {len(failed)} of {len(names)} benchmarks failed: {', '.join(failed)}", file=sys.stderr)
            return 1 if failed else 0
        return pages(args.check)
    except EdgetrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
