"""Every ``NOTE [ Title ]`` reference names a note that exists, and no title is defined twice.

A note is defined by a line that holds only ``# NOTE [ Title ]`` (a comment block) or ``NOTE [ Title ]`` (in a
docstring, possibly right after its opening quotes), followed by the note's text: a comment line with words for
the first kind, any non-blank line of the docstring for the second. Anything else that says ``NOTE [ Title ]`` is
a reference, and may be wrapped over lines (comment markers, indentation and the quotes of implicitly joined
string literals are dropped where a line breaks). Definitions come from src/, benchmarks/ and tests/; README.md
and docs/**/*.md are read for references only. A pure text scan: no import of the code.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIRS = ("src", "benchmarks", "tests")
SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".sh", ".yml", ".yaml"}
PLACEHOLDERS = {"Title"}  # the notation itself, as text that explains it writes it: ``NOTE [ Title ]``

# `# NOTE [ Title ]` or `NOTE [ Title ]`, alone on its line (a docstring's opening quotes may come first)
_DEFINITION = re.compile(r'^\s*(?P<hash>#+\s*)?(?:[rRbBuU]{0,2}(?:"""|\'\'\'))?\s*NOTE \[ (?P<title>[^\]]+?) \]\s*$')
_REFERENCE = re.compile(r"NOTE\s*\[\s*(?P<title>[^\]]{1,300}?)\s*\]")
_LINE_START = re.compile(r'^(?:#+\s*)?(?:[rRbBfFuU]{0,2}["\'])?')  # a comment marker, or a continued literal's quote
_LINE_END = re.compile(r'"\s*[,)]*\s*$')  # the closing quote of a literal continued on the next line


@dataclass(frozen=True)
class Site:
    path: str
    line: int
    title: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: NOTE [ {self.title} ]"


def _is_definition(lines: list[str], i: int) -> str | None:
    """The title defined at line ``i``, or None where the line is no definition."""
    match = _DEFINITION.match(lines[i])
    if match is None:
        return None
    following = lines[i + 1].strip() if i + 1 < len(lines) else ""
    if match.group("hash"):
        return match.group("title") if following.startswith("#") and following.lstrip("#").strip() else None
    if not following or following.startswith(('"""', "'''", "#")):
        return None
    return match.group("title")


def _joined(lines: list[str]) -> tuple[str, list[int]]:
    """The lines as one text, each stripped of what a line break puts around prose, and where each line starts."""
    parts, starts, at = [], [], 0
    for line in lines:
        text = line.strip()
        text = _LINE_START.sub("", text, count=1)
        text = _LINE_END.sub("", text, count=1)
        starts.append(at)
        parts.append(text)
        at += len(text) + 1
    return " ".join(parts), starts


def scan(path: Path, root: Path, *, definitions: bool) -> tuple[list[Site], list[Site]]:
    """(definitions, references) in one file; with ``definitions=False`` every mention is a reference."""
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    name = path.relative_to(root).as_posix()
    defined: list[Site] = []
    definition_lines: set[int] = set()
    if definitions:
        for i in range(len(lines)):
            title = _is_definition(lines, i)
            if title is not None:
                defined.append(Site(name, i + 1, title))
                definition_lines.add(i)
    text, starts = _joined(lines)
    referenced: list[Site] = []
    line = 0
    for match in _REFERENCE.finditer(text):
        while line + 1 < len(starts) and starts[line + 1] <= match.start():
            line += 1
        if line not in definition_lines:
            referenced.append(Site(name, line + 1, " ".join(match.group("title").split())))
    return defined, referenced


def _files(root: Path) -> Iterable[tuple[Path, bool]]:
    """Every file to scan, and whether it may define notes."""
    me = Path(__file__).resolve()
    for folder in SOURCE_DIRS:
        for path in sorted((root / folder).rglob("*")):
            parts = set(path.relative_to(root).parts)
            if (path.is_file() and path.suffix in SUFFIXES and path.resolve() != me and "__pycache__" not in parts
                    and not any(p.endswith(".egg-info") for p in parts)):
                yield path, True
    readme = root / "README.md"
    if readme.is_file():
        yield readme, False
    yield from ((path, False) for path in sorted((root / "docs").rglob("*.md")))


def _closest(title: str, titles: list[str]) -> str | None:
    """The defined title a broken reference most likely means: the one it shortens, else the most similar."""
    stem = title.rstrip(".…").rstrip()
    if stem != title:
        starting = [t for t in titles if t.startswith(stem)]
        if len(starting) == 1:
            return starting[0]
    close = difflib.get_close_matches(title, titles, n=1, cutoff=0.5)
    return close[0] if close else None


def problems(root: Path) -> list[str]:
    """One line per reference to an undefined title and per title defined more than once."""
    defined: dict[str, list[Site]] = {}
    references: list[Site] = []
    for path, may_define in _files(root):
        found, refs = scan(path, root, definitions=may_define)
        for site in found:
            defined.setdefault(site.title, []).append(site)
        references += refs
    out = []
    for ref in references:
        if ref.title not in defined and ref.title not in PLACEHOLDERS:
            close = _closest(ref.title, list(defined))
            out.append(f"{ref} has no definition" + (f" (did you mean NOTE [ {close} ]?)" if close else ""))
    for title, sites in sorted(defined.items()):
        if len(sites) > 1:
            out.append(f"NOTE [ {title} ] is defined {len(sites)} times: " + ", ".join(f"{s.path}:{s.line}"
                                                                                     for s in sites))
    return out


def test_every_note_reference_has_one_definition() -> None:
    found = problems(ROOT)
    assert not found, "\n".join(found)


def test_the_scan_tells_definitions_from_wrapped_references_and_catches_bad_ones(tmp_path: Path) -> None:
    # Prepare: two defined notes, references wrapped over comment and string lines, one shortened, one duplicate
    (tmp_path / "src").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "src" / "a.py").write_text(
        '"""Module.\n\nNOTE [ The first note ]\nIts text.\n"""\n\n'
        "# NOTE [ The second note ]\n# Its text.\n\n"
        "x = 1  # see NOTE [ The first\n# note ] here\n"
        'HELP = ("a help text (NOTE [ The "\n        "second note ])")\n'
        "y = 2  # NOTE [ The second ... ]\n")
    (tmp_path / "src" / "b.py").write_text('def f() -> None:\n    """Doc.\n\n    NOTE [ The first note ]\n    """\n\n\n'
                                           "# NOTE [ The second note ]\n# Again.\n")
    (tmp_path / "docs" / "page.md").write_text("NOTE [ The first note ]\nText after it is still a reference.\n"
                                               "And NOTE [ Nowhere\ndefined ]. A block starts `NOTE [ Title ]`.\n")
    # Execute
    found = problems(tmp_path)
    # Assert: the shortened and the undefined references, and the title defined twice; nothing else
    assert found == ["src/a.py:14: NOTE [ The second ... ] has no definition (did you mean NOTE [ The second note ]?)",
                     "docs/page.md:3: NOTE [ Nowhere defined ] has no definition",
                     "NOTE [ The second note ] is defined 2 times: src/a.py:7, src/b.py:8"]
