"""Random heterogeneous chains for the planner tests."""

from __future__ import annotations

import random

from edgetrain import Chain
from edgetrain.core.chain import StageCost
from edgetrain.core.schedule import keep_all
from edgetrain.core.simulator import simulate

MB = 1_000_000


def random_chain(rng: random.Random, length: int) -> Chain:
    """Sizes in whole MB, so a DP grid is exact (a common divisor) and its optimum is exact."""
    stages = []
    for i in range(length):
        out = rng.randint(1, 8) * MB
        stages.append(StageCost(f"s{i}", rng.uniform(0.01, 0.2), rng.uniform(0.02, 0.4), out,
                                out + rng.randint(0, 4) * MB, grad_bytes=rng.randint(0, 2) * MB,
                                fwd_workspace_bytes=rng.randint(0, 1) * MB,
                                input_saved=rng.random() < 0.8, output_saved=rng.random() < 0.5))
    return Chain(tuple(stages), input_bytes=2 * MB, name="random")


def keep_all_peak(chain: Chain) -> int:
    return simulate(chain, keep_all(chain.length)).peak_bytes


def chain_with_output_records(rng: random.Random, max_length: int = 5) -> Chain:
    """Records that hold only their output, no gradients or workspace: where the MILP's model and ours coincide."""
    stages = []
    for i in range(rng.randint(2, max_length)):
        out = rng.randint(1, 4)
        stages.append(StageCost(f"s{i}", rng.choice([0.5, 1.0, 2.0]), rng.choice([1.0, 2.0]), out, out,
                                input_saved=False, output_saved=True))
    return Chain(tuple(stages), input_bytes=1, name="toy")


def around_least(least_bytes: int, top_bytes: int) -> list[int]:
    """The least budget, a few bytes above it, and six steps up to ``top_bytes`` (keep-all's peak)."""
    steps = (least_bytes + (top_bytes - least_bytes) * i // 6 for i in range(7))
    return sorted({least_bytes, least_bytes + 1, least_bytes + 2, least_bytes + 7, least_bytes + 61, *steps})
