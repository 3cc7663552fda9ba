"""How long `make demo` takes after the install, and what it ends at.

The demo runs as `make demo` runs it (`edgetrain demo` on its built-in defaults), into a scratch folder, with the
wall time measured around the process. Its figures (held-out accuracy and loss, the step's tensor peak against its
budget, the process peak against the kernel's count) are read from the run's own summary. The goal is 90 s or
less on a 2-core machine, ending at a held-out accuracy of 0.9 or more.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edgetrain.errors import EdgetrainError

TITLE = "The demo's duration and result"
IN_QUICK = False   # the demo has one size: a quick run would time something else
ROOT = Path(__file__).resolve().parent.parent
LIMIT_S = 90.0
LEAST_ACCURACY = 0.9


def _edgetrain() -> str:
    """The `edgetrain` script of the environment that runs the benchmark: beside its Python, else on PATH."""
    beside = Path(sys.executable).parent / "edgetrain"
    found = str(beside) if beside.exists() else shutil.which("edgetrain")
    if found is None:
        raise EdgetrainError("the `edgetrain` command is not installed in this environment")
    return found


def run(quick: bool) -> dict[str, Any]:
    """Run the demo once; its wall time, exit code and the summary's figures (``quick`` changes nothing)."""
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        done = subprocess.run([_edgetrain(), "demo", "--out", scratch], cwd=ROOT, capture_output=True, text=True,
                              check=False)
        wall_s = time.perf_counter() - start
        summary_path = Path(scratch) / "run" / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    keys = ("accuracy", "chance_accuracy", "val_loss", "measured_peak_bytes", "tensor_budget_bytes",
            "process_peak_bytes", "predicted_process_peak_bytes", "runtime_baseline_bytes", "steps", "epochs")
    return {"limit_s": LIMIT_S, "least_accuracy": LEAST_ACCURACY, "exit_code": done.returncode,
            "wall_s": round(wall_s, 1), **{key: summary.get(key) for key in keys}}


def render(result: dict[str, Any]) -> str:
    mib = 2**20
    within = "within" if result["wall_s"] <= result["limit_s"] else "over"
    if result["accuracy"] is None:
        return (f"`make demo` exited {result['exit_code']} after {result['wall_s']:.0f} s without a summary.")
    return (f"`make demo` must finish within {result['limit_s']:.0f} s after the install on a 2-core machine and end "
            f"at a held-out accuracy of {result['least_accuracy']} or more. Here it took {result['wall_s']:.0f} s "
            f"({within} the limit) and exited {result['exit_code']}.\n\n"
            "| figure | value |\n|---|---|\n"
            f"| held-out accuracy (chance) | {result['accuracy']:.3f} ({result['chance_accuracy']:.3f}) |\n"
            f"| held-out loss after the last epoch | {result['val_loss']:.4f} |\n"
            f"| steps, epochs | {result['steps']}, {result['epochs']} |\n"
            f"| the step's tensors: measured peak / budget | {result['measured_peak_bytes'] / mib:.2f} / "
            f"{result['tensor_budget_bytes'] / mib:.2f} MiB |\n"
            f"| the process (VmHWM): peak / predicted | {result['process_peak_bytes'] / mib:.2f} / "
            f"{result['predicted_process_peak_bytes'] / mib:.2f} MiB |\n"
            f"| the runtime baseline of this run | {result['runtime_baseline_bytes'] / mib:.2f} MiB |\n\n"
            "The runtime baseline (the interpreter, torch and the kernels, before any tensor) varies with the "
            "machine and the torch build; the step's tensors do not.")
