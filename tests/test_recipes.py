"""Framework recipes: an endless generator for Keras' fit, and DistributedDataParallel."""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import write_image

from packer import PackOptions, open_reader, open_store, pack
from packer.augment import RandomHorizontalFlip, RandomResizedCrop
from packer.errors import UsageError
from packer.recipes import endless_batches

RECORDS = 40
# Training augmentation, as the recipes in docs/reading.md use it: 8x8 crops of the 8x8 records.
AUGMENT = [RandomResizedCrop(8, scale=(0.25, 1.0)), RandomHorizontalFlip()]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 raw 8x8 records in 2 shards, 4 classes: cheap to read many epochs of."""
    tmp = tmp_path_factory.mktemp("recipes")
    for i in range(RECORDS):
        write_image(tmp / "images" / f"c{i % 4}" / f"{i:02d}.png", size=(9, 7), seed=i)
    out = tmp / "s.lmdb"
    pack(tmp / "images", out, PackOptions(seed=2, workers=2, shards=2, raw=True, size=(8, 8)))
    return out


def _every_path(store: Path) -> Counter[str]:
    return Counter(r.path for r in open_store(store).records())


def _reader(store: Path, **options: Any) -> Any:
    return open_reader(store, batch_size=6, seed=5, chunk_size=4, with_paths=True, **options)


# -- endless_batches: the Keras-style generator, tested with plain Python -------------------


def test_endless_batches_is_a_generator_that_walks_epochs_in_order(store: Path) -> None:
    with _reader(store) as reader, _reader(store) as reference:
        per_epoch = len(reader)  # 40 records in batches of 6: 7 batches, the last of 4
        batches = endless_batches(reader)
        assert iter(batches) is batches
        taken = list(itertools.islice(batches, 3 * per_epoch + 2))  # runs on past 3 epochs
        for epoch in range(3):
            got = [
                p
                for _, _, paths in taken[epoch * per_epoch : (epoch + 1) * per_epoch]
                for p in paths
            ]
            assert Counter(got) == _every_path(store)  # exactly once per epoch
            # ... and in the very order the reader's own epoch(e) gives
            assert got == [p for _, _, paths in reference.epoch(epoch) for p in paths]
        state = reader.state_dict()
        assert (state["epoch"], state["phases"][0]["batches"], state["seed"]) == (3, 2, 5)
        batches.close()


def test_endless_batches_resumes_where_a_saved_state_points(store: Path) -> None:
    with _reader(store) as first:
        batches = endless_batches(first)
        for _ in range(len(first) + 3):
            next(batches)
        state = first.state_dict()
        expected = next(batches)[2]
        batches.close()
    assert (state["epoch"], state["phases"][0]["batches"], state["seed"]) == (1, 3, 5)
    with _reader(store) as second:
        second.load_state_dict(state)
        assert next(endless_batches(second))[2] == expected


def test_endless_batches_converts_each_batch(store: Path) -> None:
    def to_float(batch: tuple[Any, ...]) -> tuple[Any, ...]:
        images, labels, _ = batch
        return images.astype(np.float32) / 255, labels

    with _reader(store) as reader:
        x, y = next(endless_batches(reader, to_float))
    assert x.dtype == np.float32 and x.shape == (6, 8, 8, 3) and 0 <= x.min() <= x.max() <= 1
    assert y.shape == (6,)


def test_endless_batches_refuses_to_spin_on_an_empty_epoch(store: Path) -> None:
    with (
        open_reader(store, batch_size=RECORDS + 1, drop_last=True) as reader,
        pytest.raises(UsageError, match="no batch"),
    ):
        next(endless_batches(reader))


@pytest.mark.filterwarnings("ignore:`shuffle=True` was passed", "ignore::DeprecationWarning")
def test_keras_fit_runs_epochs_from_the_generator(store: Path) -> None:
    os.environ.setdefault("KERAS_BACKEND", "torch")  # the CPU torch this project tests with
    keras = pytest.importorskip(
        "keras", reason="keras is optional (pip install keras)", exc_type=ImportError
    )  # ImportError too: keras present but its backend missing
    seen: list[str] = []

    def inputs(batch: tuple[Any, ...]) -> tuple[Any, ...]:
        images, labels, paths = batch
        seen.extend(paths)
        return images.astype(np.float32) / 255, labels

    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((8, 8, 3)),
            keras.layers.Flatten(),
            keras.layers.Dense(4, activation="softmax"),
        ]
    )
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    with _reader(store, augment=AUGMENT) as reader:
        history = model.fit(
            endless_batches(reader, inputs), steps_per_epoch=len(reader), epochs=3, verbose=0
        )
    assert len(history.history["loss"]) == 3 and np.isfinite(history.history["loss"]).all()
    for epoch in range(3):  # keras may pull ahead, never behind: the first 3 epochs are whole
        assert Counter(seen[epoch * RECORDS : (epoch + 1) * RECORDS]) == _every_path(store)


# -- DistributedDataParallel: two real processes, gloo on CPU --------------------------------

needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="torch is an optional extra (make install-torch)",
)


@needs_torch
@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_forked_dataloader_workers_read_a_store_this_process_has_open(
    store: Path, tmp_path: Path, backend: str
) -> None:
    """As in train_example: an open_reader here, and DataLoader workers forked beside it."""
    from torch.utils.data import DataLoader

    from packer.torch_adapter import TorchDataset

    path = store if backend == "lmdb" else tmp_path / "s.h5"
    if backend == "hdf5":
        pack(store.parent / "images", path, PackOptions(backend="hdf5", seed=2, workers=2))
    with _reader(path) as here:
        assert Counter(p for _, _, paths in here for p in paths) == _every_path(store)
        dataset = TorchDataset(path, batch_size=6, with_paths=True)
        loader = DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="fork")
        assert Counter(p for _, _, paths in loader for p in paths) == _every_path(store)


def _train_one_rank(rank: int, world: int, store: Path, tmp: Path) -> None:
    """One DDP process: trains a few steps from open_reader, whose rank and world size come
    from torch.distributed, then reads an epoch through DataLoader workers; writes what it saw."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from packer.torch_adapter import TorchDataset

    options: dict[str, Any] = {
        "batch_size": 6,
        "seed": 3,
        "chunk_size": 4,
        "with_paths": True,
        "augment": AUGMENT,
    }
    made_early = TorchDataset(store, **options)  # before the process group: rank 0 of 1 so far
    dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp / 'rendezvous'}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),  # a rank stuck in all-reduce fails the test, not hangs it
    )
    try:
        torch.set_num_threads(1)  # one core per rank, as DDP on CPU is run
        torch.manual_seed(rank)  # different on purpose: DDP must make them equal
        model = DistributedDataParallel(torch.nn.Linear(8 * 8 * 3, 4))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        initial = [p.detach().clone() for p in model.parameters()]
        seen: dict[str, Any] = {"epochs": [], "pixels": {}}
        with open_reader(store, output="torch", **options) as reader:
            seen["rank_world"] = [reader.rank, reader.world_size]
            for epoch in range(2):
                paths = []
                for images, labels, batch_paths in reader.epoch(epoch):
                    x = images.flatten(1).float() / 255
                    loss = torch.nn.functional.cross_entropy(model(x), labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    paths += batch_paths
                    if epoch == 1:
                        for path, image in zip(batch_paths, images):
                            seen["pixels"][path] = image.numpy().tobytes().hex()
                seen["epochs"].append(paths)
        seen["weights"] = [p.detach().flatten().tolist() for p in model.parameters()]
        seen["moved"] = any(not torch.equal(a, b) for a, b in zip(initial, model.parameters()))
        # Spawned DataLoader workers have no process group of their own.
        made_now = TorchDataset(store, **options)
        loader = DataLoader(
            made_now, batch_size=None, num_workers=1, multiprocessing_context="spawn"
        )
        seen["spawned"] = [p for _, _, paths in loader for p in paths]
        made_early.set_epoch(0)  # takes the rank the process group now gives
        loader = DataLoader(
            made_early, batch_size=None, num_workers=1, multiprocessing_context="fork"
        )
        seen["made_early"] = [p for _, _, paths in loader for p in paths]
        (tmp / f"rank{rank}.json").write_text(json.dumps(seen))
    finally:
        dist.destroy_process_group()


@needs_torch
def test_ddp_ranks_read_disjoint_shares_that_cover_the_store(store: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    world = 2  # 40 records: 20 a rank, so "drop" (the default) drops nothing
    mp.spawn(_train_one_rank, args=(world, store, tmp_path), nprocs=world)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    assert [r["rank_world"] for r in ranks] == [[0, world], [1, world]]
    everything = _every_path(store)
    for epoch in range(2):
        shares = [Counter(r["epochs"][epoch]) for r in ranks]
        assert not shares[0] & shares[1]
        assert shares[0] + shares[1] == everything
    assert ranks[0]["epochs"][0] != ranks[0]["epochs"][1]  # a new order each epoch
    for way in ("spawned", "made_early"):  # through DataLoader workers
        shares = [Counter(r[way]) for r in ranks]
        assert not shares[0] & shares[1], way
        assert shares[0] + shares[1] == everything, way
    assert ranks[0]["moved"] and ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept them in step
    # Each record's crop is the one a lone reader gives it: keyed by (seed, epoch, record).
    options = {"seed": 3, "chunk_size": 4, "augment": AUGMENT, "rank": 0, "world_size": 1}
    with open_reader(store, batch_size=7, with_paths=True, **options) as alone:
        expected = {
            path: image.tobytes().hex()
            for images, _, paths in alone.epoch(1)
            for path, image in zip(paths, images)
        }
    assert {**ranks[0]["pixels"], **ranks[1]["pixels"]} == expected
