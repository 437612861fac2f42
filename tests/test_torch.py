"""PyTorch: a real DataLoader with worker processes (fork and spawn), tensors, ranks."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from helpers import write_image

from packer import PackOptions, open_reader, open_store, pack

torch = pytest.importorskip("torch", reason="torch is an optional extra (make install-torch)")
from torch.utils.data import DataLoader  # noqa: E402

from packer.torch_adapter import TorchDataset  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("torch")
    for i in range(90):
        write_image(tmp / "images" / f"c{i % 3}" / f"{i:02d}.png", size=(12, 10), seed=i)
    out = tmp / "s.lmdb"
    pack(tmp / "images", out, PackOptions(seed=1, workers=2, shards=2))
    return out


def _epoch_paths(loader: DataLoader) -> list[str]:  # type: ignore[type-arg]
    return [p for _, _, paths in loader for p in paths]


@pytest.mark.parametrize("context", ["fork", "spawn"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_workers_read_every_record_exactly_once(
    store: Path, context: str, num_workers: int
) -> None:
    everything = Counter(r.path for r in open_store(store).records())
    dataset = TorchDataset(store, batch_size=8, seed=4, chunk_size=5, with_paths=True)
    loader = DataLoader(
        dataset,
        batch_size=None,
        num_workers=num_workers,
        multiprocessing_context=context if num_workers else None,
    )
    orders = []
    for epoch in range(2):
        dataset.set_epoch(epoch)
        paths = _epoch_paths(loader)
        assert Counter(paths) == everything
        orders.append(paths)
    assert orders[0] != orders[1]
    images, labels, _ = next(iter(loader))
    assert (
        isinstance(images, torch.Tensor)
        and images.dtype == torch.uint8
        and images.shape[1:] == (10, 12, 3)
    )
    assert labels.dtype == torch.int64


def test_forked_workers_resize_after_the_parent_did(tmp_path: Path) -> None:
    """OpenCV runs a large resize on a pool of its own threads; a child forked from a process
    whose pool has run once must still resize (older OpenCV builds hung there, a classic
    DataLoader deadlock). The parent resizes with a reader first, its threads still running."""
    for i in range(6):
        write_image(tmp_path / "images" / "a" / f"{i}.jpg", size=(1600, 1200), seed=i)
    store = tmp_path / "big.lmdb"
    pack(tmp_path / "images", store, PackOptions(seed=0, workers=2))
    # Too near full size for a reduced-scale decode: OpenCV resizes every full 1600x1200 image.
    sized = {"size": (900, 1100), "fit": "stretch"}
    with open_reader(store, batch_size=3, across_epochs=True, **sized) as reader:
        images, _ = next(iter(reader))  # OpenCV's pool has run here; prefetch goes on
        assert images.shape == (3, 900, 1100, 3)
        dataset = TorchDataset(store, batch_size=3, seed=0, **sized)
        loader = DataLoader(
            dataset, batch_size=None, num_workers=2, multiprocessing_context="fork", timeout=120
        )
        shapes = [tuple(images.shape) for images, _ in loader]
    assert shapes == [(3, 900, 1100, 3)] * 2


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_times_workers_cover_the_store_once(store: Path, world: int) -> None:
    seen: Counter[str] = Counter()
    for rank in range(world):
        dataset = TorchDataset(
            store, batch_size=7, rank=rank, world_size=world, remainder="uneven", with_paths=True
        )
        seen.update(_epoch_paths(DataLoader(dataset, batch_size=None, num_workers=2)))
    assert seen == Counter(r.path for r in open_store(store).records())


def test_torch_output_on_cpu(store: Path, caplog: pytest.LogCaptureFixture) -> None:
    with open_reader(store, batch_size=16, output="torch", device="cpu", pin_memory=True) as reader:
        images, labels = next(iter(reader))
    assert isinstance(images, torch.Tensor) and images.shape == (16, 10, 12, 3)
    assert isinstance(labels, torch.Tensor) and labels.shape == (16,)
    if not torch.cuda.is_available():
        assert "pin_memory=True ignored: no CUDA device" in caplog.text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device; none here")
def test_batches_arrive_on_the_gpu_ready_for_the_training_stream(store: Path) -> None:
    """pin_memory + device="cuda": each batch is copied from pinned memory on a side stream,
    and the training stream waits for that copy alone. A kernel queued on the training stream
    at once, with no synchronize, must see the batch's bytes: those of a CPU read of the same
    epoch (same seed, same order)."""
    options = {"batch_size": 16, "seed": 5, "output": "torch"}
    with open_reader(store, **options) as reader:
        expected = [(images.clone(), labels.clone()) for images, labels in reader.epoch(0)]
    got = []
    with open_reader(store, pin_memory=True, device="cuda", **options) as reader:
        for images, labels in reader.epoch(0):
            assert images.is_cuda and labels.is_cuda
            got.append((images.to(torch.int64).sum(), labels))  # queued on the training stream
    torch.cuda.synchronize()
    assert len(got) == len(expected) > 1
    for (total, labels), (cpu_images, cpu_labels) in zip(got, expected):
        assert total.item() == int(cpu_images.to(torch.int64).sum())
        assert torch.equal(labels.cpu(), cpu_labels)
