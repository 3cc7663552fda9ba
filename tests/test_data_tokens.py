"""The synthetic token dataset, and the clean-up of temporaries that killed generators leave."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from edgetrain.cli import app
from edgetrain.data import (
    CorruptSampleError,
    DatasetSpecError,
    TokenRecords,
    analyze_stalls,
    generate_synthetic_tokens,
    open_dataset,
    read_token_manifest,
    remove_stale_temporaries,
)
from edgetrain.data.generated import LOCK_NAME, _swap_in
from edgetrain.data.tokens import KEYWORD_RATE, SyntheticTokenSpec, class_keywords

runner = CliRunner()


def _digest(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _dead_pid() -> int:
    """The PID of a process that has exited (and been reaped)."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


# -- the token dataset ----------------------------------------------------------------------------
def test_open_dataset_gives_token_ids_for_a_token_model(tmp_path: Path) -> None:
    train, val, n_classes = open_dataset("synthetic", image_size=12, samples=50, seed=1, root=tmp_path,
                                         vocab_size=300, classes=5)

    assert isinstance(train, TokenRecords) and (len(train), len(val), n_classes) == (40, 10, 5)
    ids, _label = train[0]
    assert ids.dtype == torch.int64 and ids.shape == (12,) and int(ids.max()) < 300
    assert sorted(set(train.targets)) == list(range(5))
    assert sorted(train.targets + val.targets) == sorted(i % 5 for i in range(50))


def test_every_sequence_carries_its_class_keywords_and_they_identify_the_class(tmp_path: Path) -> None:
    spec = SyntheticTokenSpec(samples=400, seq_len=16, vocab_size=1000, classes=10, seed=0)
    root = generate_synthetic_tokens(tmp_path / "t", samples=400, seq_len=16, vocab_size=1000, classes=10)
    data = TokenRecords(root / "train.bin", seq_len=16, vocab_size=1000, classes=spec.class_names())
    keywords = class_keywords(spec)  # (10, 8)
    owner = {int(k): c for c, row in enumerate(keywords) for k in row}

    hits, correct = 0, 0
    for i in range(len(data)):
        ids, label = data[i]
        counts = np.bincount([owner[int(t)] for t in ids if int(t) in owner], minlength=10)
        assert counts[label] >= 1  # one keyword for sure
        hits += int(counts[label])
        correct += int(counts.argmax() == label)

    assert len(set(keywords.flatten().tolist())) == 80  # disjoint between classes
    assert hits / (16 * len(data)) == pytest.approx(KEYWORD_RATE + 0.6 / 16, abs=0.03)
    assert correct / len(data) > 0.95  # counting keywords alone separates the classes


def test_token_dataset_is_deterministic_seeded_and_reused(tmp_path: Path) -> None:
    first = generate_synthetic_tokens(tmp_path / "a", samples=30, seq_len=8, seed=2)
    again = generate_synthetic_tokens(tmp_path / "b", samples=30, seq_len=8, seed=2)
    other = generate_synthetic_tokens(tmp_path / "c", samples=30, seq_len=8, seed=3)
    before = {p: p.stat().st_mtime_ns for p in first.iterdir()}

    assert _digest(first) == _digest(again) and _digest(first)["train.bin"] != _digest(other)["train.bin"]
    assert generate_synthetic_tokens(first, samples=30, seq_len=8, seed=2) == first
    assert {p: p.stat().st_mtime_ns for p in first.iterdir()} == before
    assert LOCK_NAME not in _digest(first)


def test_a_generator_that_finishes_second_keeps_the_first_ones_copy_under_its_readers(tmp_path: Path) -> None:
    # Prepare: the copy the first of two nodes made, with a reader's file identities; the second node's own copy
    root = generate_synthetic_tokens(tmp_path / "data" / "tokens", samples=30, seq_len=8)
    identities = {p.name: p.stat().st_ino for p in [root, *root.iterdir()]}
    second = tmp_path / "data" / ".tokens.tmp-second"
    shutil.copytree(root, second)
    manifest = read_token_manifest(root)
    assert manifest is not None

    # Execute: the second node swaps its copy in
    _swap_in(second, root, manifest)

    # Verify: the first copy stays where its readers opened it, nothing was moved aside
    assert {p.name: p.stat().st_ino for p in [root, *root.iterdir()]} == identities
    assert sorted(p.name for p in root.parent.iterdir() if ".old-" in p.name) == []


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"samples": 0}, "samples must be at least 1, got 0"),
    ({"vocab_size": 50}, "vocab_size must be in 80..65536"),
    ({"seq_len": 0}, "sequence length must be at least 1, got 0"),
])
def test_token_dataset_refuses_impossible_settings_in_one_line(tmp_path: Path, kwargs: dict[str, int],
                                                              words: str) -> None:
    with pytest.raises(DatasetSpecError) as caught:
        generate_synthetic_tokens(tmp_path / "t", **kwargs)  # type: ignore[arg-type]
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_a_token_record_with_a_bad_label_or_id_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "train.bin"
    np.array([[1, 5, 6], [9, 5, 6], [0, 5, 700]], dtype="<u2").tofile(path)  # label, two ids

    strict = TokenRecords(path, seq_len=2, vocab_size=600, classes=["a", "b"])
    with pytest.raises(CorruptSampleError, match="label 9 at offset 6"):
        strict[1]
    with pytest.raises(CorruptSampleError, match="token id 700 at offset 12"):
        strict[2]
    skipping = TokenRecords(path, seq_len=2, vocab_size=600, classes=["a", "b"], skip_corrupt=True)
    assert skipping[0][1] == 1 and skipping[1] is None and skipping[2] is None and skipping.corrupt_count == 2


def test_stall_analysis_runs_on_token_data(tmp_path: Path) -> None:
    train, _, _ = open_dataset("synthetic", image_size=8, samples=40, root=tmp_path, vocab_size=200, classes=4)
    seen: list[torch.dtype] = []

    report = analyze_stalls(lambda batch: seen.append(batch[0].dtype), train, batch_size=4, workers=(0,),
                            batches=2, drop_cache=False)

    assert report.row(0).batch_size == 4 and set(seen) == {torch.int64} and len(seen) == 3 * 3


def test_cli_refuses_a_folder_for_a_token_model_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()

    result = runner.invoke(app, ["train", "--model", "transformer_small", "--data", str(tmp_path), "--image", "16",
                                 "--run-dir", str(tmp_path / "run")])

    assert result.exit_code == 2 and "token ids" in result.output
    assert "Traceback" not in result.output


# -- temporaries of killed generators -------------------------------------------------------------
def test_open_removes_temporaries_of_dead_generators_only(tmp_path: Path) -> None:
    open_dataset("synthetic", image_size=4, samples=20, root=tmp_path, vocab_size=1000)
    dead = tmp_path / f".other-dataset.tmp-{_dead_pid()}-0123abcd"
    live = tmp_path / f".other-dataset.tmp-{os.getpid()}-89abcdef"  # ours, no lock file: judged by PID
    reused = tmp_path / f".third.tmp-{os.getpid()}-00000000"  # PID alive but its lock is free: reused PID
    foreign = tmp_path / ".not-ours.tmp-12-xyz"
    for folder in (dead, live, reused, foreign):
        folder.mkdir()
        (folder / "000001.png").write_bytes(b"x" * 100)
    (reused / LOCK_NAME).touch()

    open_dataset("synthetic", image_size=4, samples=20, root=tmp_path, vocab_size=1000)  # reuses the dataset

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, foreign.name,
                                                                  "tokens-c10-len4-v1000-n20-seed0"])


def test_a_killed_generators_temporary_is_kept_while_it_runs_and_removed_after(tmp_path: Path) -> None:
    code = ("import sys, time\nfrom pathlib import Path\nfrom edgetrain.data.generated import temporary_folder\n"
            "with temporary_folder(Path(sys.argv[1])) as folder:\n"
            "    (folder / 'big.bin').write_bytes(bytes(1 << 20))\n"
            "    print(folder, flush=True)\n    time.sleep(120)\n")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "ds")], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        folder = Path(child.stdout.readline().strip())
        assert folder.name.startswith(f".ds.tmp-{child.pid}-")
        assert remove_stale_temporaries(tmp_path) == [] and folder.is_dir()  # alive: its lock is held
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()

    assert remove_stale_temporaries(tmp_path) == [folder]
    assert not folder.exists()
