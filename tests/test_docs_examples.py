"""Every shell command and Python snippet in the README and the documentation runs.

Sybil finds the fenced ``sh`` and ``python`` blocks of each page. A page's examples run in order, in
one namespace and one scratch directory, so a later block can use what an earlier one made (a plan
file, a variable). A shell block runs each of its commands with this environment's ``edgetrain``
first on the PATH, and fails on a non-zero exit. A block preceded by ``<!-- skip: next "reason" -->``
is not run, and the reason is shown in the test's report; one without a reason is an error, so no
example is left out silently.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import unittest
from pathlib import Path

import pytest
from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# Pages whose examples take more than about 30 s on 2 cores run with the long tests (`make test-slow`).
LONG_PAGES = {"docs/guide/data.md", "docs/guide/train.md", "docs/guide/fit.md", "docs/guide/plan.md",
              "docs/guide/own-model.md", "docs/guide/paging-energy.md", "docs/guide/reproduce.md",
              "docs/concepts/time-model.md", "docs/guide/workstation.md", "docs/guide/finetune.md"}
SHELL_TIMEOUT_S = 600
_SKIP_WITHOUT_REASON = re.compile(r"<!--\s*skip:\s*next\s*-->")


def shell_commands(source: str) -> list[str]:
    """The commands of a shell block: one a line, ``\\`` continuations joined, blank and comment lines dropped.

    A comment after a command stays: bash reads it as a comment.
    """
    commands, pending = [], ""
    for line in source.splitlines():
        line = pending + line
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        command = line.strip()
        if command and not command.startswith("#"):
            commands.append(command)
    return commands


def run_shell_block(example: Example) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    for command in shell_commands(example.parsed):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                              timeout=SHELL_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{shlex.quote(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")


SYBIL = Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser("sh", evaluator=run_shell_block), SkipParser()])


def _page_param(page: Path) -> object:
    name = str(page.relative_to(ROOT))
    return pytest.param(page, id=name, marks=[pytest.mark.slow] if name in LONG_PAGES else [])


@pytest.mark.parametrize("page", [_page_param(page) for page in PAGES])
def test_page_examples_run(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _SKIP_WITHOUT_REASON.search(page.read_text()), f"{page}: a skip without a reason"
    monkeypatch.chdir(tmp_path)
    skipped = []
    for example in SYBIL.parse(page):
        try:
            example.evaluate()
        except unittest.SkipTest as skip:
            skipped.append(f"line {example.line}: {skip}")
    if skipped:
        print(f"{page.name}: not run: " + "; ".join(skipped))


def test_shell_commands_split_as_a_shell_reads_them() -> None:
    source = "edgetrain plan --model m \\\n  --batch 8  # a comment\n\n# only a comment\nedgetrain train -o 'a #b'\n"
    assert shell_commands(source) == ["edgetrain plan --model m    --batch 8  # a comment", "edgetrain train -o 'a #b'"]


def test_a_failing_command_fails_its_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```sh\nedgetrain memory --model no-such-model\n```\n")
    with pytest.raises(AssertionError, match="exited 2"):
        for example in SYBIL.parse(page):
            example.evaluate()


def test_every_long_page_exists() -> None:
    # A renamed page would otherwise leave the long list quietly, and its examples with it.
    assert {str(page.relative_to(ROOT)) for page in PAGES} >= LONG_PAGES
