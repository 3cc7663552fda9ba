"""A Python process in which some top-level modules cannot be imported, as on a device without an extra installed."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

__all__ = ["BLOCKER", "blocking_environment"]

BLOCKER = """\
import sys
from importlib.abc import MetaPathFinder

BLOCKED = {blocked!r}


class _Block(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)", name=name)
        return None


sys.meta_path.insert(0, _Block())
"""
"""A ``sitecustomize`` module (format it with ``blocked``, a set of names) that makes importing those modules fail
as if they were not installed, whatever is on ``sys.path``."""


def blocking_environment(blocked: Collection[str], folder: Path,
                         environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Python process that cannot import the top-level modules ``blocked``.

    Writes :data:`BLOCKER` as ``folder/sitecustomize.py`` and puts ``folder`` first on ``PYTHONPATH``
    (of ``environ``, by default this process's environment); Python imports ``sitecustomize`` at start-up.
    """
    environ = dict(os.environ if environ is None else environ)
    (folder / "sitecustomize.py").write_text(BLOCKER.format(blocked=set(blocked)))
    environ["PYTHONPATH"] = os.pathsep.join([str(folder.resolve()), *filter(None, [environ.get("PYTHONPATH", "")])])
    return environ
