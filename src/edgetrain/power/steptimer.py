"""The child of :func:`edgetrain.power.cgroup_modes.time_step_in_mode`: time a training step, print JSON.

``python -m edgetrain.power.steptimer MODEL BATCH SIZE THREADS STEPS WARMUP [CGROUP_PROCS]``: it
imports PyTorch and builds the model first, then (given a cgroup's ``cgroup.procs``) moves itself
into the cgroup, runs the warm-up and the timed steps, and prints ``{"step_times_s": [...]}``.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    import torch

    from ..data.stall import make_step_fn
    from ..models import get_model_spec
    from ..profiling.measure import step_times

    model, batch, size, threads, steps, warmup = argv[0], *(int(x) for x in argv[1:6])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = get_model_spec(model)
    step = make_step_fn(spec.build())
    data = (spec.example_input(batch, size), spec.example_target(batch))
    if len(argv) > 6:
        with open(argv[6], "w") as procs:
            procs.write(str(os.getpid()))  # cgroup v1: moves every thread of this process
    print(json.dumps({"step_times_s": list(step_times(lambda: step(data), steps, warmup=warmup))}))


if __name__ == "__main__":
    main(sys.argv[1:])
