"""edgetrain.data: the synthetic dataset, the image-folder and CIFAR readers, bad data, the factory, the caches."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch import nn

from edgetrain.data import (
    CachingReader,
    CifarBinary,
    CorruptSampleError,
    DataError,
    DatasetFormatError,
    DatasetNotFoundError,
    DatasetSpecError,
    DatasetTooLargeError,
    ImageFolder,
    InputKindError,
    LRUCache,
    MinIOCache,
    ThrottledReader,
    TooFewClassesError,
    TooFewSamplesError,
    find_cifar_files,
    first_batch,
    generate_synthetic,
    make_loader,
    open_dataset,
    read_manifest,
    replay_epochs,
    train_val_split,
)
from edgetrain.data import cache as data_cache
from edgetrain.data.generated import BLOCK_BYTES
from edgetrain.errors import EdgetrainError
from edgetrain.train import TrainConfig, train

logger = logging.getLogger(__name__)

RECORD = 3073


# -- helpers ------------------------------------------------------------------------------------
def _digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root``, by relative path."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _solid_png(path: Path, rgb: tuple[int, int, int], size: int = 8, mode: str = "RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.new("RGB", (size, size), rgb)
    (image.convert("L") if mode == "L" else image).save(path, format="PNG")
    return path


def _cifar_record(label: int, offset: int) -> bytes:
    """One CIFAR-10 record: label byte, then R, G and B planes of a known pattern."""
    pattern = (np.arange(1024) + offset) % 256
    planes = [pattern, (pattern + 85) % 256, (pattern + 170) % 256]  # R, G, B
    return bytes([label]) + b"".join(plane.astype(np.uint8).tobytes() for plane in planes)


def _assert_one_line(error: BaseException, *words: str) -> None:
    """The CLI shows ``str(error)`` as the whole message: one line, naming the problem."""
    assert isinstance(error, EdgetrainError)
    assert "\n" not in str(error)
    for word in words:
        assert word in str(error)


def _write_cifar(path: Path, labels: list[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(_cifar_record(label, k) for k, label in enumerate(labels)))
    return path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small synthetic dataset shared by the read-only tests."""
    return generate_synthetic(tmp_path_factory.mktemp("data") / "shapes", samples=60, image_size=16,
                              classes=4, seed=3)


# -- synthetic dataset --------------------------------------------------------------------------
def test_synthetic_layout_and_manifest(shapes: Path) -> None:
    manifest = json.loads((shapes / "manifest.json").read_text())

    assert manifest["spec"] == {"samples": 60, "image_size": 16, "classes": 4, "seed": 3,
                                "image_format": "png", "val_fraction": 0.2}
    assert manifest["split_sizes"] == {"train": 48, "val": 12}  # 15 per class: 12 train + 3 val
    assert manifest["class_names"] == ["00-red-circle", "01-green-square", "02-blue-triangle", "03-yellow-cross"]
    for split in ("train", "val"):
        assert sorted(p.name for p in (shapes / split).iterdir()) == manifest["class_names"]
    images = sorted(shapes.rglob("*.png"))
    assert len(images) == 60
    assert all(Image.open(p).size == (16, 16) and Image.open(p).mode == "RGB" for p in images)


def test_synthetic_split_is_disjoint_and_covers_every_sample(shapes: Path) -> None:
    files = read_manifest(shapes)["files"]  # type: ignore[index]

    train_ids = {Path(f).stem for f in files["train"]}
    val_ids = {Path(f).stem for f in files["val"]}
    assert not train_ids & val_ids
    assert train_ids | val_ids == {f"{i:06d}" for i in range(60)}


def test_synthetic_is_deterministic_and_seed_dependent(shapes: Path, tmp_path: Path) -> None:
    again = generate_synthetic(tmp_path / "again", samples=60, image_size=16, classes=4, seed=3)
    other = generate_synthetic(tmp_path / "other", samples=60, image_size=16, classes=4, seed=4)

    assert _digest(again) == _digest(shapes)
    assert _digest(other) != _digest(shapes)


def test_synthetic_reuses_a_complete_dataset_without_writing(tmp_path: Path) -> None:
    root = generate_synthetic(tmp_path / "ds", samples=20, image_size=8, classes=2, seed=0)
    before = {p: p.stat().st_mtime_ns for p in root.rglob("*")}
    time.sleep(0.01)

    assert generate_synthetic(root, samples=20, image_size=8, classes=2, seed=0) == root
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == before


def test_synthetic_regenerates_when_the_manifest_differs(tmp_path: Path) -> None:
    root = generate_synthetic(tmp_path / "ds", samples=20, image_size=8, classes=2, seed=0)

    generate_synthetic(root, samples=30, image_size=12, classes=3, seed=1)

    assert read_manifest(root)["spec"]["samples"] == 30  # type: ignore[index]
    assert len(list(root.rglob("*.png"))) == 30
    assert all(Image.open(p).size == (12, 12) for p in root.rglob("*.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no temporary or old folders left


def test_synthetic_regenerates_an_incomplete_dataset(tmp_path: Path) -> None:
    root = generate_synthetic(tmp_path / "ds", samples=20, image_size=8, classes=2, seed=0)
    expected = _digest(root)
    victim = next(root.rglob("*.png"))
    victim.unlink()

    generate_synthetic(root, samples=20, image_size=8, classes=2, seed=0)

    assert _digest(root) == expected


def test_synthetic_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.txt").write_text("precious")

    with pytest.raises(DataError, match="refusing"):
        generate_synthetic(tmp_path / "mine", samples=20, image_size=8, classes=2)
    assert (tmp_path / "mine" / "thesis.txt").read_text() == "precious"


def test_synthetic_jpeg_format_reads_back(tmp_path: Path) -> None:
    root = generate_synthetic(tmp_path / "jpg", samples=10, image_size=16, classes=2, image_format="jpeg")

    data = ImageFolder(root / "train", image_size=16)
    assert all(p.suffix == ".jpg" for p, _ in data.samples)
    assert data[0][0].shape == (3, 16, 16)


@pytest.mark.parametrize("kwargs", [{"classes": 65}, {"classes": 1}, {"samples": 3, "classes": 4},
                                    {"image_size": 4}, {"image_format": "gif"}, {"val_fraction": 1.0}])
def test_synthetic_rejects_impossible_specs(tmp_path: Path, kwargs: dict[str, object]) -> None:
    with pytest.raises(DatasetSpecError) as caught:
        generate_synthetic(tmp_path / "bad", **kwargs)  # type: ignore[arg-type]
    _assert_one_line(caught.value)
    assert isinstance(caught.value, ValueError) and not (tmp_path / "bad").exists()


def test_synthetic_refuses_zero_samples_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(DatasetSpecError) as caught:
        open_dataset("synthetic", samples=0, root=tmp_path)
    _assert_one_line(caught.value, "samples must be at least 1, got 0")


def test_synthetic_refuses_an_image_too_large_to_draw_with_the_numbers(tmp_path: Path) -> None:
    with pytest.raises(DatasetTooLargeError) as caught:
        open_dataset("synthetic", image_size=100_000, samples=32, root=tmp_path)

    _assert_one_line(caught.value, "100000x100000", "of memory", "available")
    assert caught.value.needed_bytes == 400 * 100_000 ** 2  # numpy working set of drawing one image
    assert caught.value.available_bytes < caught.value.needed_bytes
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_synthetic_refuses_a_set_larger_than_the_free_disk(tmp_path: Path) -> None:
    with pytest.raises(DatasetTooLargeError) as caught:
        generate_synthetic(tmp_path / "huge", samples=10**9, image_size=8, classes=2)

    _assert_one_line(caught.value, "1000000000 synthetic 8x8 images", "free")
    assert caught.value.needed_bytes == 10**9 * BLOCK_BYTES  # an 8 px PNG fits one block
    assert caught.value.available_bytes < caught.value.needed_bytes
    assert not (tmp_path / "huge").exists()


@pytest.mark.usefixtures("one_thread")
def test_a_small_cnn_learns_synthetic_well_above_chance(tmp_path: Path) -> None:
    torch.manual_seed(0)
    train, val, n_classes = open_dataset("synthetic", image_size=16, samples=400, seed=0, root=tmp_path, classes=4)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(32, n_classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    for epoch in range(4):
        for pixels, labels in make_loader(train, batch_size=32, seed=epoch):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(pixels), labels).backward()
            optimizer.step()
    with torch.no_grad():
        correct = sum(int((model(x).argmax(1) == y).sum()) for x, y in make_loader(val, batch_size=80, shuffle=False))

    accuracy = correct / len(val)
    logger.info("val accuracy after 4 epochs: %.3f (chance 0.25)", accuracy)
    assert accuracy >= 0.5


# -- image folder ---------------------------------------------------------------------------------
def test_image_folder_normalises_resizes_and_labels_by_sorted_class(tmp_path: Path) -> None:
    _solid_png(tmp_path / "b_dog" / "1.png", (255, 0, 51), size=10)
    _solid_png(tmp_path / "a_cat" / "1.png", (0, 102, 255), size=6)
    _solid_png(tmp_path / "a_cat" / "2.png", (128, 128, 128), size=8, mode="L")

    data = ImageFolder(tmp_path, image_size=(4, 5))

    assert data.classes == ["a_cat", "b_dog"] and data.targets == [0, 0, 1]
    pixels, label = data[2]
    assert label == 1 and pixels.dtype == torch.float32 and pixels.shape == (3, 4, 5)
    expected = torch.tensor([255, 0, 51]) / 255 * 2 - 1  # (x/255 - 0.5) / 0.5
    torch.testing.assert_close(pixels, expected.view(3, 1, 1).expand(3, 4, 5))
    grey, _ = data[1]
    assert grey.shape == (3, 4, 5)  # greyscale becomes three channels
    torch.testing.assert_close(data[-1][0], pixels)


def test_image_folder_keeps_given_classes_for_a_partial_split(tmp_path: Path) -> None:
    _solid_png(tmp_path / "zebra" / "1.png", (1, 2, 3))

    data = ImageFolder(tmp_path, image_size=8, classes=["ant", "zebra"])

    assert data.num_classes == 2 and data[0][1] == 1


def test_image_folder_leaves_out_empty_class_folders_with_a_warning(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    _solid_png(tmp_path / "a" / "0.png", (255, 0, 0))
    (tmp_path / "b_empty").mkdir()
    _solid_png(tmp_path / "c" / "0.png", (0, 0, 255))

    with caplog.at_level(logging.WARNING, logger="edgetrain.data"):
        data = ImageFolder(tmp_path, image_size=8)

    assert data.classes == ["a", "c"] and data.targets == [0, 1]
    assert "b_empty has no images; it is not counted as a class" in caplog.text


def test_open_dataset_refuses_fewer_than_two_classes(tmp_path: Path) -> None:
    for k in range(3):
        _solid_png(tmp_path / "only" / f"{k}.png", (k, 0, 0))
    (tmp_path / "empty").mkdir()

    with pytest.raises(TooFewClassesError) as caught:
        open_dataset(tmp_path, image_size=8)
    _assert_one_line(caught.value, "1 class with samples ('only')", "at least two")


def test_first_batch_passes_over_corrupt_samples(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "0_bad.png").write_bytes(b"not a png")  # index 0: the first sample
    _solid_png(tmp_path / "a" / "1.png", (10, 0, 0))
    _solid_png(tmp_path / "b" / "2.png", (20, 0, 0))
    _solid_png(tmp_path / "b" / "3.png", (30, 0, 0))
    data = ImageFolder(tmp_path, image_size=8, skip_corrupt=True)

    pixels, labels = first_batch(data, 3)

    assert pixels.shape == (3, 3, 8, 8) and labels.tolist() == [0, 1, 1]
    assert pixels[:, 0, 0, 0].tolist() == pytest.approx([(v / 255 - 0.5) / 0.5 for v in (10, 20, 30)])
    assert data.corrupt_indices == [0] and data.corrupt_count == 1
    with pytest.raises(TooFewSamplesError) as caught:
        first_batch(data, 4)
    _assert_one_line(caught.value, "only 3 of 4 samples are readable (1 corrupt)", "one batch of 4")


def test_first_batch_skips_a_cifar_record_with_a_bad_label(tmp_path: Path) -> None:
    data = CifarBinary([_write_cifar(tmp_path / "data_batch_1.bin", [200, 1, 2])], skip_corrupt=True)

    _, labels = first_batch(data, 2)

    assert labels.tolist() == [1, 2] and data.corrupt_indices == [0]


@pytest.mark.usefixtures("one_thread")
def test_train_with_skip_corrupt_in_the_first_batch_trains(tmp_path: Path) -> None:
    (tmp_path / "data" / "train" / "a").mkdir(parents=True)
    (tmp_path / "data" / "train" / "a" / "0_truncated.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    for k in range(1, 11):
        split = "val" if k > 8 else "train"
        _solid_png(tmp_path / "data" / split / "ab"[k % 2] / f"{k}.png", (25 * k, 0, 0), size=32)

    summary = train(TrainConfig(model="resnet18", data=str(tmp_path / "data"), batch=4, image=32, epochs=1,
                                run_dir=tmp_path / "run", skip_corrupt=True, save_every=100))

    assert (summary.train_samples, summary.val_samples, summary.steps) == (9, 2, 2)  # 9 // 4 steps
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["steps"] == 2


def test_train_val_split_is_stratified_disjoint_and_seeded(shapes: Path) -> None:
    whole = ImageFolder(shapes / "train", image_size=16)

    train, val = train_val_split(whole, val_fraction=0.25, seed=7)
    again, _ = train_val_split(whole, val_fraction=0.25, seed=7)
    other, _ = train_val_split(whole, val_fraction=0.25, seed=8)

    assert len(train) + len(val) == len(whole)
    assert not {p for p, _ in train.samples} & {p for p, _ in val.samples}  # type: ignore[attr-defined]
    assert sorted(val.targets) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]  # 12 per class, 3 held out
    assert again.samples == train.samples and other.samples != train.samples  # type: ignore[attr-defined]


# -- bad data -------------------------------------------------------------------------------------
@pytest.fixture
def with_corrupt(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A folder with 6 good images and 2 bad ones: garbage bytes, and a truncated PNG."""
    for k in range(6):
        _solid_png(tmp_path / f"c{k % 2}" / f"{k}.png", (10 * k, 20, 30))
    garbage = tmp_path / "c0" / "garbage.png"
    garbage.write_bytes(b"this is not an image")
    truncated = tmp_path / "c1" / "truncated.png"
    full = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    full.save(truncated, format="PNG")
    truncated.write_bytes(truncated.read_bytes()[:400])
    return tmp_path, [garbage, truncated]


def test_corrupt_image_raises_a_clear_error_naming_the_file(with_corrupt: tuple[Path, list[Path]]) -> None:
    root, bad = with_corrupt
    data = ImageFolder(root, image_size=8)

    for path in bad:
        index = [p for p, _ in data.samples].index(path)
        with pytest.raises(CorruptSampleError, match=path.name) as caught:
            data[index]
        assert caught.value.path == path and isinstance(caught.value, EdgetrainError)


@pytest.mark.parametrize("workers", [0, 2])
def test_skip_corrupt_skips_counts_and_logs(with_corrupt: tuple[Path, list[Path]], workers: int,
                                            caplog: pytest.LogCaptureFixture) -> None:
    root, bad = with_corrupt
    data = ImageFolder(root, image_size=8, skip_corrupt=True)

    with caplog.at_level(logging.WARNING, logger="edgetrain.data"):
        batches = list(make_loader(data, batch_size=3, workers=workers, seed=0))
        count = data.log_corrupt_summary()

    assert sum(len(labels) for _, labels in batches) == 6
    assert count == data.corrupt_count == 2
    assert sorted(data.samples[i][0] for i in data.corrupt_indices) == sorted(bad)
    assert "2 of 8 samples were corrupt" in caplog.text
    if workers == 0:  # worker processes log to their own handlers
        assert all(p.name in caplog.text for p in bad)


def test_all_corrupt_batch_comes_out_as_none(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.png").write_bytes(b"nope")

    data = ImageFolder(tmp_path, image_size=8, skip_corrupt=True)

    assert list(make_loader(data, batch_size=4)) == [None]


def test_empty_or_missing_folders_give_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "no_images" / "cls").mkdir(parents=True)
    (tmp_path / "no_images" / "cls" / "notes.txt").write_text("hi")

    with pytest.raises(DatasetFormatError, match="no class subfolders"):
        ImageFolder(tmp_path / "empty")
    with pytest.raises(DatasetFormatError, match="no image files"):
        ImageFolder(tmp_path / "no_images")
    with pytest.raises(DatasetNotFoundError, match="missing"):
        ImageFolder(tmp_path / "missing")


# -- CIFAR-10 binary ------------------------------------------------------------------------------
def test_cifar_reader_decodes_labels_and_rgb_planes(tmp_path: Path) -> None:
    path = _write_cifar(tmp_path / "data_batch_1.bin", [3, 9, 0])

    data = CifarBinary([path])

    assert len(data) == 3 and data.targets == [3, 9, 0] and data.classes[3] == "cat"
    pixels, label = data[1]
    assert label == 9 and pixels.shape == (3, 32, 32)
    pattern = torch.tensor(((np.arange(1024) + 1) % 256).reshape(32, 32), dtype=torch.float32)
    for channel, shift in enumerate((0, 85, 170)):
        torch.testing.assert_close(pixels[channel], ((pattern + shift) % 256) / 255 * 2 - 1)


def test_cifar_reader_resizes(tmp_path: Path) -> None:
    path = _write_cifar(tmp_path / "data_batch_1.bin", [1])

    assert CifarBinary([path], image_size=16)[0][0].shape == (3, 16, 16)


def test_truncated_cifar_file_raises_or_skips(tmp_path: Path) -> None:
    path = _write_cifar(tmp_path / "data_batch_1.bin", [1, 2, 3])
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(DatasetFormatError, match=r"data_batch_1.bin") as caught:
        CifarBinary([path])
    assert "truncated" in str(caught.value) and caught.value.path == path

    data = CifarBinary([path], skip_corrupt=True)
    assert len(data) == 2 and data.corrupt_count == 1 and data[1][1] == 2


def test_cifar_bad_label_byte_is_a_corrupt_record(tmp_path: Path) -> None:
    path = _write_cifar(tmp_path / "data_batch_1.bin", [1, 200])

    with pytest.raises(CorruptSampleError, match="label byte 200"):
        CifarBinary([path])[1]
    skipping = CifarBinary([path], skip_corrupt=True)
    assert next(iter(make_loader(skipping, batch_size=2, shuffle=False)))[1].tolist() == [1]
    assert skipping.corrupt_count == 1


def test_open_dataset_reads_a_cifar_folder(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-bin"
    _write_cifar(folder / "data_batch_1.bin", list(range(10)) * 2)
    _write_cifar(folder / "data_batch_2.bin", list(range(10)))
    _write_cifar(folder / "test_batch.bin", [4, 5])

    train, val, n_classes = open_dataset(tmp_path, image_size=32)  # the folder above it works too

    assert (len(train), len(val), n_classes) == (30, 2, 10)
    assert isinstance(train, CifarBinary) and val[1][1] == 5
    assert find_cifar_files(tmp_path)[1] == [folder / "test_batch.bin"]


def test_open_dataset_refuses_a_cifar_folder_with_only_the_test_batch(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "test_batch.bin", list(range(10)))

    with pytest.raises(DatasetFormatError) as caught:
        open_dataset(tmp_path)
    _assert_one_line(caught.value, "only the CIFAR-10 test batch (test_batch.bin)", "data_batch_*.bin")


def test_open_dataset_refuses_images_for_a_token_model(shapes: Path, tmp_path: Path) -> None:
    _write_cifar(tmp_path / "data_batch_1.bin", list(range(10)))

    for folder in (shapes, tmp_path):
        with pytest.raises(InputKindError) as caught:
            open_dataset(folder, vocab_size=1000)
        _assert_one_line(caught.value, str(folder), "token ids", "--data synthetic")


def test_open_dataset_splits_cifar_without_a_test_batch(tmp_path: Path) -> None:
    _write_cifar(tmp_path / "data_batch_1.bin", list(range(10)) * 5)

    train, val, _ = open_dataset(tmp_path, seed=1)

    assert (len(train), len(val)) == (40, 10) and sorted(val.targets) == list(range(10))


# -- factory --------------------------------------------------------------------------------------
def test_open_dataset_synthetic_generates_under_root_then_reuses(tmp_path: Path) -> None:
    train, val, n_classes = open_dataset("synthetic", image_size=16, samples=50, seed=2, root=tmp_path)
    folders = list(tmp_path.iterdir())
    again, _, _ = open_dataset("synthetic", image_size=16, samples=50, seed=2, root=tmp_path)

    assert (len(train), len(val), n_classes) == (40, 10, 10)
    assert train[0][0].shape == (3, 16, 16)
    assert list(tmp_path.iterdir()) == folders and again.samples == train.samples  # type: ignore[attr-defined]


def test_open_dataset_uses_train_and_val_subfolders(shapes: Path) -> None:
    train, val, n_classes = open_dataset(shapes, image_size=8)

    assert (len(train), len(val), n_classes) == (48, 12, 4)
    assert train[0][0].shape == (3, 8, 8)


def test_open_dataset_splits_a_plain_image_folder(shapes: Path) -> None:
    train, val, n_classes = open_dataset(shapes / "train", image_size=16, val_fraction=0.25)

    assert (len(train), len(val), n_classes) == (36, 12, 4)


def test_open_dataset_unknown_names_and_files_are_clear_errors(tmp_path: Path) -> None:
    (tmp_path / "file.txt").write_text("x")

    with pytest.raises(DatasetNotFoundError, match=r"'imagenet'.*synthetic"):
        open_dataset("imagenet")
    with pytest.raises(DatasetFormatError, match="is a file"):
        open_dataset(tmp_path / "file.txt")


# -- caches ---------------------------------------------------------------------------------------
def test_minio_keeps_the_cache_fraction_every_epoch_lru_thrashes() -> None:
    item_bytes = [1000] * 400
    capacity_bytes = sum(item_bytes) // 2  # 50% of the items

    minio = replay_epochs(MinIOCache(capacity_bytes), item_bytes, epochs=5, seed=0)
    lru = replay_epochs(LRUCache(capacity_bytes), item_bytes, epochs=5, seed=0)

    logger.info("hit rates per epoch at 50%% capacity: MinIO %s, LRU %s", minio, lru)
    assert minio[0] == 0.0 and all(rate >= 0.49 for rate in minio[1:])
    assert all(rate < 0.4 for rate in lru[1:]) and max(lru[1:]) < min(minio[1:])


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=60), capacity_bytes=st.integers(0, 400),
       seed=st.integers(0, 3))
def test_caches_never_exceed_their_byte_budget(sizes: list[int], capacity_bytes: int, seed: int) -> None:
    minio, lru = MinIOCache(capacity_bytes), LRUCache(capacity_bytes)
    first_kept: set[int] | None = None
    for epoch in range(3):
        replay_epochs(minio, sizes, epochs=1, seed=seed + epoch)
        replay_epochs(lru, sizes, epochs=1, seed=seed + epoch)
        kept = {i for i in range(len(sizes)) if i in minio}
        first_kept = kept if first_kept is None else first_kept
        assert kept == first_kept  # MinIO never evicts
        for cache in (minio, lru):
            assert cache.used_bytes <= capacity_bytes
            assert cache.used_bytes == sum(sizes[i] for i in range(len(sizes)) if i in cache)


def test_lru_evicts_the_least_recently_used() -> None:
    cache = LRUCache(capacity_bytes=20)
    cache.put("a", b"", 10)
    cache.put("b", b"", 10)
    cache.get("a")

    cache.put("c", b"", 10)

    assert "a" in cache and "c" in cache and "b" not in cache and cache.stats.evicted == 1


def test_caching_reader_under_an_image_folder_hits_the_cached_fraction(shapes: Path) -> None:
    plain = ImageFolder(shapes / "train", image_size=16)
    file_bytes = [p.stat().st_size for p, _ in plain.samples]
    cache = MinIOCache(capacity_bytes=sum(sorted(file_bytes)[: len(file_bytes) // 2]))
    data = plain.with_reader(CachingReader(cache))

    for epoch in range(2):
        cache.stats.reset()
        for pixels, _ in make_loader(data, batch_size=8, seed=epoch):
            assert pixels.shape[1:] == (3, 16, 16)

    assert 0.25 <= cache.stats.hit_rate <= 0.75 and cache.stats.evicted == 0
    assert cache.stats.hit_rate == pytest.approx(len(cache) / len(data))


class _Clock:
    """A clock that moves only when slept on: what a read takes is what it waits, whatever the machine's load."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def perf_counter(self) -> float:
        return self.now_s

    def sleep(self, seconds: float) -> None:
        self.now_s += seconds


def test_throttled_reader_takes_bytes_over_read_bps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"x" * 20_000)
    reader = ThrottledReader(read_bps=1e6, latency_s=0.005)
    clock = _Clock()
    monkeypatch.setattr(data_cache, "time", clock)

    data = reader.read(path, offset=5_000, size=10_000)

    assert data == b"x" * 10_000
    assert clock.now_s == pytest.approx(0.005 + 10_000 / 1e6, rel=1e-12)  # 5 ms latency + 10 kB at 1 MB/s
    with pytest.raises(ValueError):
        ThrottledReader(read_bps=0)
