"""Results files and the benchmarks' entry point: provenance kept, pages made from files alone, bad input refused."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.__main__ import BENCHMARKS
from edgetrain.bench import RESULTS_FORMAT, BenchmarkResult, provenance, read_result, write_result
from edgetrain.errors import EdgetrainError

ROOT = Path(__file__).resolve().parent.parent


def _benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, check=False)


def test_a_results_file_reads_back_as_written(tmp_path: Path) -> None:
    # Prepare
    record = BenchmarkResult("demo", {"table": [{"model": "resnet18", "ratio": 0.9}]},
                             provenance("python -m benchmarks run demo", ROOT))
    # Execute
    write_result(tmp_path / "demo.json", record)
    # Assert: the same record, and the provenance a reader of a figure needs
    assert read_result(tmp_path / "demo.json") == record
    assert {"command", "commit", "dirty", "date", "cpu", "cores", "torch", "torch_threads",
            "load_average"} <= record.provenance.keys()
    assert len(record.provenance["commit"]) == 40 and len(record.provenance["load_average"]) == 3


def test_a_checkout_is_dirty_by_its_changes_but_not_by_the_results_a_run_wrote(tmp_path: Path) -> None:
    # Prepare: a repository with a results folder and a source file, both committed
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "a.json").write_text("{}")
    (tmp_path / "source.py").write_text("x = 1\n")
    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "start", "--allow-empty")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "files")

    # Execute: a result rewritten, then the source changed
    (tmp_path / "results" / "a.json").write_text('{"x": 1}')
    after_result = provenance("run", tmp_path, ("results",))["dirty"]
    (tmp_path / "source.py").write_text("x = 2\n")
    after_source = provenance("run", tmp_path, ("results",))["dirty"]

    # Assert
    assert (after_result, after_source) == (False, True)


def test_a_results_file_of_another_format_is_refused_naming_the_rerun(tmp_path: Path) -> None:
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"format": RESULTS_FORMAT + 1, "benchmark": "optimal_speed", "result": {},
                                "provenance": {}}))
    with pytest.raises(EdgetrainError, match=r"old\.json: results format 2.*python -m benchmarks run optimal_speed"):
        read_result(path)
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(EdgetrainError, match=r"bad\.json: not a results file"):
        read_result(tmp_path / "bad.json")


def test_an_unknown_benchmark_is_one_line_and_exit_2() -> None:
    done = _benchmarks("run", "optimal_speed", "no_such_benchmark")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: unknown benchmark 'no_such_benchmark'; valid names: {', '.join(BENCHMARKS)}"]
    assert "running" not in done.stderr   # refused before the first benchmark ran


def test_the_committed_results_pages_are_their_files() -> None:
    # Every page under docs/results/ that a registered benchmark makes equals a regeneration from its committed file.
    done = _benchmarks("pages", "--check")
    assert done.returncode == 0, done.stderr


def _readme_results_rows() -> list[list[str]]:
    """The cells of every row of the README's results table: claim, figure, command, results page."""
    lines = (ROOT / "README.md").read_text().splitlines()
    top = lines.index("| claim | figure | command | results |")
    rows = []
    for line in lines[top + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


# Scripts that still run on their own (`python benchmarks/NAME.py`), without a results file the runner writes.
STANDALONE: frozenset[str] = frozenset()
# Rows whose figure comes from reports kept under benchmarks/results/ (test_insitu checks the guide's table of them).
KEPT_REPORTS = frozenset({"`edgetrain insitu simulate --json`"})


def test_every_readme_figure_is_its_results_files_headline() -> None:
    # Each row cites one benchmark: its command, its results page, and a figure that is the benchmark's own
    # `headline` of the committed results file, character for character.
    rows = _readme_results_rows()
    assert 1 <= len(rows) <= 10   # at most ten headline results
    for claim, figure, command, page in rows:
        script = re.fullmatch(r"`python benchmarks/(\w+)\.py.*`", command)
        if (script and script.group(1) in STANDALONE) or command in KEPT_REPORTS:
            continue
        match = re.fullmatch(r"`python -m benchmarks run (\w+)`", command)
        assert match, f"{claim}: {command} is not a benchmark's command"
        name = match.group(1)
        assert name in BENCHMARKS, name
        assert page == f"[{name}](docs/results/{name}.md)", f"{claim}: {page}"
        module = importlib.import_module(f"benchmarks.{name}")
        assert figure == module.headline(read_result(ROOT / "benchmarks" / "results" / f"{name}.json").result), claim


def test_every_module_of_benchmarks_is_a_benchmark() -> None:
    # A script that the runner does not find would be a figure no command regenerates.
    modules = sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py") if not path.stem.startswith("_"))
    assert sorted([*BENCHMARKS, *STANDALONE]) == modules
    for name in BENCHMARKS:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(module.run) and callable(module.render) and module.TITLE, name
        assert (ROOT / "benchmarks" / "results" / f"{name}.json").exists(), f"{name} has no committed results file"


def test_every_file_under_results_is_a_results_file_or_a_named_record() -> None:
    # A file no benchmark names is a run dump no page explains; a named record that is missing is a broken page.
    from benchmarks.__main__ import COMMAND_RECORDS, load, records

    named = dict(COMMAND_RECORDS)
    for name in BENCHMARKS:
        named.update(records(load(name)))
    results = ROOT / "benchmarks" / "results"
    for path in named:
        assert (results / path).exists(), f"benchmarks/results/{path} is named but missing"
    for file in sorted(p for p in results.rglob("*") if p.is_file()):
        relative = file.relative_to(results).as_posix()
        owned = relative in named or any(path.endswith("/") and relative.startswith(path) for path in named)
        assert owned or (file.parent == results and file.stem in BENCHMARKS and file.suffix == ".json"), relative


def test_every_results_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [name for name in BENCHMARKS if f": results/{name}.md\n" not in nav]
    assert not missing, f"mkdocs.yml's nav lacks the results pages of {', '.join(missing)}"
