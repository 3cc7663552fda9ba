"""The command line a benchmark records is one that reruns it with the same options."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from edgetrain.bench.stats import Spread, rerun_command, spread


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["single"])
    parser.add_argument("--seeds", type=lambda s: [int(v) for v in s.split(",")], default=[0])
    parser.add_argument("--read", type=lambda s: s.split(","), default=[])
    parser.add_argument("--cpus-per-node", type=float, default=None)
    parser.add_argument("--local-batch-norm", action="store_true")
    parser.add_argument("--margin", type=float, default=0.005)
    parser.add_argument("--out", type=Path, default=Path("out/x.json"))
    return parser


def test_the_recorded_command_parses_back_to_the_options_it_was_made_from() -> None:
    for argv in ([], ["--modes", "single,fp16", "--seeds", "3,4", "--local-batch-norm", "--cpus-per-node", "0.5",
                      "--read", "a.json,b.json", "--out", "elsewhere.json"]):
        args = _parser().parse_args(argv)
        command = rerun_command("benchmarks/x.py", vars(args), leave_out=("out",))
        words = shlex.split(command)
        assert words[:2] == ["python", "benchmarks/x.py"]
        again = vars(_parser().parse_args(words[2:]))
        assert {**again, "out": args.out} == vars(args)
        assert "--out" not in words and ("--cpus-per-node" in words) == (args.cpus_per_node is not None)


def test_a_spread_read_back_from_its_dict_is_the_spread_and_one_value_has_no_cov() -> None:
    many = spread([1.0, 2.0, 3.0, 4.0, 5.0])
    assert Spread.from_dict(many.to_dict()) == many
    assert many.cov_text == "52.7%"
    one = Spread.from_dict(spread([2.5]).to_dict())
    assert (one.n, one.median, one.cov_pct, one.cov_text) == (1, 2.5, None, "-")
    assert one.text() == "2.5 (IQR 0, CoV -, n=1)"
