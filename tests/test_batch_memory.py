"""Batch arrays in memory used again (packer.reading.batch_memory): memory goes back to the
pool only once no view of it is left, NumPy's or torch's, and a reader's batches held by the
training loop are never written over by later ones."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from packer import PackOptions, open_reader, pack
from packer.reading.batch_memory import BatchMemory
from tests.helpers import write_image


def test_memory_comes_back_once_the_last_view_is_gone() -> None:
    memory = BatchMemory(keep=4)
    first = memory.empty((4, 8, 8, 3))
    address = first.ctypes.data
    first[:] = 7
    rows = first[1:3]  # a view outlives the array it came from
    del first
    gc.collect()
    assert memory.free == 0
    second = memory.empty((4, 8, 8, 3))
    assert not np.shares_memory(second, rows)
    second[:] = 9
    assert (rows == 7).all()  # untouched by the second batch
    del rows
    assert memory.free == 1
    third = memory.empty((4, 8, 8, 3))
    assert third.ctypes.data == address and memory.free == 0  # the first batch's memory


def test_a_torch_tensor_of_a_batch_keeps_its_memory() -> None:
    torch = pytest.importorskip("torch")
    memory = BatchMemory(keep=4)
    batch = memory.empty((2, 4, 4, 3))
    batch[:] = 1
    tensor = torch.from_numpy(batch)[1:]
    del batch
    assert memory.free == 0
    other = memory.empty((2, 4, 4, 3))
    other[:] = 5
    assert int(tensor.sum()) == 4 * 4 * 3
    del tensor
    assert memory.free == 1


def test_memory_of_another_size_or_beyond_keep_is_not_held() -> None:
    memory = BatchMemory(keep=2)
    arrays = [memory.empty((10, 10)) for _ in range(3)]
    del arrays
    assert memory.free == 2  # the third is let go
    small = memory.empty((2, 10))  # a fifth of a free block: a block of its own
    assert memory.free == 2
    del small  # back, and the oldest free block let go: two are kept
    assert memory.free == 2
    most = memory.empty((6, 10), np.uint8)  # over half a free block's size: that block
    assert memory.free == 1 and most.shape == (6, 10)
    assert memory.empty((0, 10)).shape == (0, 10)
    memory.clear()
    assert memory.free == 0
    floats = memory.empty((3, 2), np.float32)
    assert floats.dtype == np.float32 and floats.shape == (3, 2)
    objects = memory.empty((2,), object)  # a transform's output may hold objects
    assert objects.dtype == object and objects.shape == (2,)


@pytest.mark.parametrize("decode_in", ["threads", "processes"])
def test_held_batches_keep_their_pixels(tmp_path: Path, decode_in: str) -> None:
    """A training loop that keeps batches, or views of them, sees them as they were read
    while the reader goes on: every batch kept against a copy taken as it came."""
    root = tmp_path / "imgs"
    for i in range(48):
        write_image(root / f"c{i % 3}" / f"{i}.png", size=(12 + i % 5, 10), seed=i)
    store = tmp_path / "s.lmdb"
    pack(root, store, PackOptions(seed=0))
    options = {"batch_size": 8, "size": (6, 6), "workers": 2, "decode_in": decode_in}
    with open_reader(store, **options) as reader:
        kept, copies = [], []
        for epoch in range(3):
            for images, _ in reader.epoch(epoch):
                kept.append(images[2:] if epoch % 2 else images)  # a view, or the batch
                copies.append((images[2:] if epoch % 2 else images).copy())
        if decode_in == "processes":  # through shared memory, copied to their batch's rows
            decoder = reader._producer._processes
            assert decoder.placed + decoder.landed == len(kept) and decoder.placed
    assert len(kept) == 18
    for array, copy in zip(kept, copies, strict=True):
        np.testing.assert_array_equal(array, copy)
