"""How long the test suites take: `make test` (the default suite) and `make test-slow` (the long tests).

Each suite runs as its make target does (pytest with two xdist workers), in this checkout, with the wall time
measured around it and the counts and per-test times read from its JUnit report. The default suite's limit is
10 minutes on a 2-core machine; a suite that fails is recorded as failed, not left out.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

TITLE = "The test suites' duration"
IN_QUICK = False   # a quick run cannot time the whole suite, which is what this measures
ROOT = Path(__file__).resolve().parent.parent
SUITES = {"make test": "not slow", "make test-slow": "slow"}
DEFAULT_SUITE_LIMIT_S = 600.0


def time_suite(marker: str) -> dict[str, Any]:
    """Run the tests selected by ``marker`` as the make target does; wall time, counts and the 10 slowest."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "worksteal", "-m", marker,
                               "-p", "no:cacheprovider", f"--junitxml={report}"], cwd=ROOT, capture_output=True,
                              text=True, check=False)
        wall_s = time.perf_counter() - start
        cases = ET.parse(report).getroot().iter("testcase")
        tests = [(f"{case.get('classname')}::{case.get('name')}", float(case.get("time") or 0.0),
                  next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed"))
                 for case in cases]
    outcomes = [outcome for _, _, outcome in tests]
    slowest = sorted(tests, key=lambda test: -test[1])[:10]
    return {"marker": marker, "exit_code": done.returncode, "wall_s": round(wall_s, 1), "tests": len(tests),
            "passed": outcomes.count("passed"), "failed": outcomes.count("failure") + outcomes.count("error"),
            "skipped": outcomes.count("skipped"), "summed_test_s": round(sum(t for _, t, _ in tests), 1),
            "failures": [name for name, _, outcome in tests if outcome in ("failure", "error")],
            "slowest": [{"test": name, "s": round(seconds, 1)} for name, seconds, _ in slowest]}


def run(quick: bool) -> dict[str, Any]:
    """Time both suites (``quick`` changes nothing: the point is the whole suite's time)."""
    suites = {target: time_suite(marker) for target, marker in SUITES.items()}
    return {"limit_s": DEFAULT_SUITE_LIMIT_S, "suites": suites}


def render(result: dict[str, Any]) -> str:
    rows = [f"| `{target}` | {s['tests']} | {s['passed']} | {s['failed']} | {s['skipped']} | {s['wall_s'] / 60:.1f} | "
            f"{s['exit_code']} |" for target, s in result["suites"].items()]
    default = result["suites"]["make test"]
    slowest = "\n".join(f"| `{t['test']}` | {t['s']:.1f} |" for t in default["slowest"])
    verdict = "within" if default["wall_s"] <= result["limit_s"] else "over"
    return (f"`make test` must finish within {result['limit_s'] / 60:.0f} minutes on a 2-core machine; the long "
            f"integration tests are marked `slow` and run by `make test-slow`. Here `make test` took "
            f"{default['wall_s'] / 60:.1f} minutes: {verdict} the limit.\n\n"
            "| target | tests | passed | failed | skipped | wall (min) | exit code |\n|---|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\nThe default suite's slowest tests:\n\n| test | s |\n|---|---|\n" + slowest
            + _failures(result))


def _failures(result: dict[str, Any]) -> str:
    """The tests that failed, by suite; nothing when every test passed."""
    failed = [f"- `{target}`: `{name}`" for target, suite in result["suites"].items()
              for name in suite.get("failures", [])]
    return "\n\nFailed:\n\n" + "\n".join(failed) if failed else ""
