"""scripts/train_example.py: trains from every loader, on the same images, held out honestly."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer import open_store

torch = pytest.importorskip("torch", reason="torch is an optional extra (make install-torch)")

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
import train_example  # noqa: E402

TINY = [
    *("--per-class", "6", "--heldout-per-class", "3", "--batch-size", "8", "--image-size", "16"),
    *("--torch-threads", "1"),  # two threads on two shared cores stall on each other
]


def _args(workdir: Path, *extra: str) -> Any:
    return train_example.parse_args(["--workdir", str(workdir), *TINY, *extra])


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The demo data, tiny: 36 training images, 18 held out, both packed."""
    return train_example.prepare_sources(_args(tmp_path_factory.mktemp("train")))


def _digests(store: Path) -> set[str]:
    return {hashlib.sha256(bytes(r.data)).hexdigest() for r in open_store(store).records()}


def test_no_held_out_image_is_in_the_training_store(sources: Any) -> None:
    train, heldout = _digests(sources.train_store), _digests(sources.heldout_store)
    assert len(train) == 36 and len(heldout) == 18  # every image distinct, all packed
    assert not train & heldout


def test_an_image_in_both_folders_stops_the_run(sources: Any, tmp_path: Path) -> None:
    heldout = tmp_path / "heldout"
    shutil.copytree(sources.heldout_dir, heldout)
    leaked = next(sources.train_dir.glob("circle/*"))
    shutil.copy(leaked, heldout / "circle" / "leaked.png")
    with pytest.raises(SystemExit, match="1 held-out image"):
        train_example.check_disjoint(sources.train_dir, heldout)


def test_the_loaders_read_the_same_images_with_the_same_labels(
    sources: Any, tmp_path: Path
) -> None:
    args = _args(tmp_path)
    store = sources.heldout_store
    folder = train_example.ImageFolderDataset(sources.heldout_dir, args.image_size)
    label_of = {
        path.relative_to(sources.heldout_dir).as_posix(): label for path, label in folder.samples
    }
    stored = list(open_store(store).records())
    assert sorted(r.path for r in stored) == sorted(label_of)
    assert folder.classes == sources.classes
    # The held-out feed reads in store order: compare each image with the file's own pixels.
    packer_feed = train_example.make_feed("packer", sources, args, heldout=True)
    assert packer_feed is not None
    images, labels = (torch.cat(parts) for parts in zip(*packer_feed.batches(0)))
    packer_feed.close()
    for record, image, label in zip(stored, images.numpy(), labels.tolist()):
        assert label == label_of[record.path]
        expected = train_example.load_file(sources.heldout_dir / record.path, args.image_size)
        assert np.array_equal(image, expected), record.path


def test_every_loader_trains_and_reports_json(sources: Any, tmp_path: Path) -> None:
    """The script as a user runs it: one process, all four loaders, two epochs."""
    workdir = sources.train_store.parent  # the data is there already: nothing regenerated
    command = [sys.executable, str(SCRIPTS / "train_example.py"), "--workdir", str(workdir), *TINY]
    done = subprocess.run(
        [*command, "--loader", "all", "--epochs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0]["kind"] == "run" and lines[0]["chance"] == round(1 / 6, 3)
    epochs = [line for line in lines if line["kind"] == "epoch"]
    assert [(e["loader"], e["epoch"]) for e in epochs] == [
        (loader, epoch) for epoch in range(2) for loader in train_example.LOADERS
    ]
    for e in epochs:
        assert e["images"] == 36 and 0 <= e["train_accuracy"] <= 1
        assert 0 <= e["heldout_accuracy"] <= 1 and np.isfinite(e["loss"])
        assert 0 <= e["wait_share"] < 1 and e["images_per_s"] > 0
        if e["loader"] in ("packer", "packer-raw"):  # an open_reader in this process
            assert e["reader"]["images"] == 36 and e["reader"]["wait_share"] == e["wait_share"]
        else:
            assert e["reader"] is None
    summary = lines[-1]
    assert summary["kind"] == "summary"
    assert [row["loader"] for row in summary["rows"]] == list(train_example.LOADERS)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_asking_for_cuda_without_one_fails_before_any_work(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="sees no CUDA device"):
        train_example.main(
            ["--workdir", str(tmp_path / "work"), "--device", "cuda", "--pin-memory"]
        )
    assert not (tmp_path / "work").exists()


def test_the_large_model_takes_any_image_size() -> None:
    model = train_example.large_cnn(6)
    for size in (16, 23):
        assert model(torch.zeros(2, 3, size, size)).shape == (2, 6)


@pytest.mark.slow
def test_the_demo_run_learns_far_better_than_chance(tmp_path: Path) -> None:
    """The README's figure: default settings, 8 epochs, held-out accuracy well above 1/6."""
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "train_example.py"), "--workdir", str(tmp_path), "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    last = [json.loads(line) for line in done.stdout.splitlines()][-2]
    assert last["kind"] == "epoch" and last["heldout_accuracy"] >= 0.6
