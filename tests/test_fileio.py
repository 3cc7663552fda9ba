"""JSON-lines records as a killed writer leaves them."""

from __future__ import annotations

from pathlib import Path

from edgetrain.sysutil.fileio import read_jsonl


def test_a_line_cut_by_a_kill_is_left_out_and_the_whole_records_before_it_are_read(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.5}\n{"step": 2, "loss": 2.25}\n{"step": 3, "lo')
    assert read_jsonl(path) == [{"step": 1, "loss": 2.5}, {"step": 2, "loss": 2.25}]


def test_a_missing_file_holds_no_records(tmp_path: Path) -> None:
    assert read_jsonl(tmp_path / "metrics.jsonl") == []
