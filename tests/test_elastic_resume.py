"""Resume across a change of world size, workers or batch size: every record of the resumed
epoch exactly once over all ranks and phases, the next epoch as a fresh run has it, and a
state of another run refused with one line."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import write_image

from packer import PackOptions, open_reader, open_store, pack
from packer.errors import StateError
from packer.reading import epoch as plan
from packer.reading.lanes import Lane, Layout, Phase, Planner, batches_taken

NUM = 600


@pytest.fixture(scope="module")
def raw_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """600 records of raw 8x8 pixels in three shards: fast to read, many batches."""
    tmp = tmp_path_factory.mktemp("elastic")
    for i in range(NUM):
        write_image(tmp / "images" / f"c{i % 4}" / f"{i:03d}.png", size=(8, 8), seed=i)
    out = tmp / "raw.h5"
    options = PackOptions(backend="hdf5", seed=2, workers=2, shards=3, raw=True, size=(8, 8))
    pack(tmp / "images", out, options)
    return out


@pytest.fixture(scope="module")
def every_path(raw_store: Path) -> Counter[str]:
    with open_store(raw_store) as s:
        return Counter(r.path for r in s.records())


OPTIONS: dict[str, Any] = {"seed": 3, "chunk_size": 10, "buffer_chunks": 2, "with_paths": True}


def _job(
    store: Path,
    world: int,
    batch_size: int,
    batches: int | None,
    state: dict[str, Any] | None = None,
    epoch: int = 0,
    **options: Any,
) -> tuple[list[str], dict[str, Any]]:
    """Every rank of a ``world``-rank job reads ``batches`` batches (None: all it has) of
    ``epoch``, after loading ``state``: the paths all ranks yielded, and rank 0's state."""
    taken: list[str] = []
    saved: dict[str, Any] = {}
    for rank in range(world):
        with open_reader(
            store, batch_size=batch_size, rank=rank, world_size=world, **{**OPTIONS, **options}
        ) as reader:
            if state is not None:
                reader.load_state_dict(json.loads(json.dumps(state)))  # as saved to disk
            steps = itertools.count() if batches is None else range(batches)
            for _, (_, _, paths) in zip(steps, reader.epoch(epoch)):
                taken += paths
            if rank == 0:
                saved = reader.state_dict()
    return taken, saved


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 32), (1, 32)), ((2, 32), (4, 32)), ((4, 32), (3, 32)), ((2, 32), (2, 64))],
    ids=["2to1", "2to4", "4to3", "batch32to64"],
)
def test_a_resumed_epoch_yields_every_record_once_on_other_ranks_or_batches(
    raw_store: Path, every_path: Counter[str], before: tuple[int, int], after: tuple[int, int]
) -> None:
    first, state = _job(raw_store, *before, batches=3, remainder="uneven")
    assert state["epoch"] == 0 and state["records_done"] == len(first) == before[0] * 3 * 32
    rest, _ = _job(raw_store, *after, batches=None, state=state, remainder="uneven")
    assert Counter(first + rest) == every_path  # each record once, none missed


def test_a_chain_of_resumes_still_yields_every_record_once(
    raw_store: Path, every_path: Counter[str]
) -> None:
    """2 ranks, then 4 with another batch size, then 3: each phase continues from the last."""
    first, state = _job(raw_store, 2, 32, batches=2, remainder="uneven")
    second, state = _job(raw_store, 4, 24, batches=3, state=state, remainder="uneven")
    assert len(state["phases"]) == 2 and state["records_done"] == len(first) + len(second)
    rest, _ = _job(raw_store, 3, 16, batches=None, state=state, remainder="uneven")
    assert Counter(first + second + rest) == every_path


def test_with_drop_nothing_repeats_and_the_next_epoch_is_a_fresh_runs(
    raw_store: Path, every_path: Counter[str]
) -> None:
    """remainder="drop": each phase may drop the few records its ranks cannot share evenly
    (as an uninterrupted run drops N % world), never repeats one; the epoch after is the
    one a run started on the new world size would have had."""
    first, state = _job(raw_store, 2, 32, batches=4)
    rest, end = _job(raw_store, 3, 32, batches=None, state=state)
    seen = Counter(first + rest)
    assert max(seen.values()) == 1 and set(seen) <= set(every_path)
    assert NUM - len(seen) <= (2 - 1) + (3 - 1)
    assert end["epoch"] == 1 and end["phases"] == [] and end["records_done"] == 0
    resumed_next: list[str] = []
    for rank in range(3):
        with open_reader(raw_store, batch_size=32, rank=rank, world_size=3, **OPTIONS) as r:
            r.load_state_dict(state)
            list(r)  # the rest of epoch 0
            resumed_next += [p for _, _, paths in r for p in paths]  # then epoch 1
    fresh_next, _ = _job(raw_store, 3, 32, batches=None, epoch=1)
    assert resumed_next == fresh_next


def test_on_the_same_world_size_the_batches_are_the_uninterrupted_runs(raw_store: Path) -> None:
    uninterrupted: list[list[str]] = []
    resumed: list[list[str]] = []
    _, state = _job(raw_store, 2, 16, batches=5)
    for rank in range(2):
        opts = {**OPTIONS, "rank": rank, "world_size": 2}
        with open_reader(raw_store, batch_size=16, **opts) as r:
            uninterrupted += [paths for _, _, paths in r.epoch(0)][5:]
        with open_reader(raw_store, batch_size=16, **opts) as r:
            r.load_state_dict(state)
            resumed += [paths for _, _, paths in r]
    assert resumed == uninterrupted


def _expand(lane: Lane, starts: list[list[int]]) -> list[tuple[int, int]]:
    """(store, record) of every record of ``lane``, in the order it yields them."""
    per_store = []
    for source, pieces in enumerate(lane.pieces):
        records: list[int] = []
        for piece in pieces:
            ids = [starts[source][s.shard] + i for s in piece.spans for i in range(s.start, s.stop)]
            records += [ids[p] for p in piece.positions()]
        per_store.append(iter(records))
    mix = lane.mix if lane.mix is not None else np.zeros(len(lane), int)
    return [(int(s), next(per_store[int(s)])) for s in mix]


@pytest.mark.parametrize("stores", [1, 2])
def test_any_chain_of_layouts_covers_the_epoch_once_pure(stores: int) -> None:
    """Over random stores, chunkings and chains of layouts (ranks, workers, batch sizes and
    how far each phase read), what the phases yield plus what the last layout's lanes hold
    is the epoch's records, each once: a DataLoader's turn-taking over workers simulated
    here, batch by batch."""
    rng = random.Random(7)
    for trial in range(60):
        shards = [[rng.randint(0, 40) for _ in range(rng.randint(1, 3))] for _ in range(stores)]
        sizes = [sum(s) for s in shards]
        if min(sizes) == 0:
            continue
        chunks = [plan.chunk_spans(s, rng.randint(1, 9)) for s in shards]
        planner = Planner(
            chunks,
            sizes,
            seed=trial,
            shuffle=True,
            buffer_chunks=rng.randint(1, 3),
            remainder="uneven",
        )
        starts = [list(np.cumsum([0, *s[:-1]])) for s in shards]
        phases: list[Phase] = []
        seen: list[tuple[int, int]] = []
        for _ in range(rng.randint(0, 3)):
            layout = Layout(rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 7))
            lanes = planner.lanes(3, phases, layout)
            taken_by_rank = []
            for rank in range(layout.world_size):
                own = lanes[rank * layout.workers : (rank + 1) * layout.workers]
                batches = [_expand(lane, starts) for lane in own]
                cut = [
                    [b[i : i + layout.batch_size] for i in range(0, len(b), layout.batch_size)]
                    for b in batches
                ]
                in_turn = [
                    batch for round_ in itertools.zip_longest(*cut) for batch in round_ if batch
                ]
                taken_by_rank.append(in_turn)
            steps = rng.randint(0, min(len(t) for t in taken_by_rank))
            for in_turn in taken_by_rank:
                seen += [record for batch in in_turn[:steps] for record in batch]
            phases.append(Phase(layout, steps))
        final = Layout(rng.randint(1, 4), rng.randint(1, 3), 5)
        for lane in planner.lanes(3, phases, final):
            seen += _expand(lane, starts)
        expected = [(s, i) for s in range(stores) for i in range(sizes[s])]
        assert sorted(seen) == expected, (trial, phases)


def test_batches_taken_follows_a_dataloaders_turns() -> None:
    counts = [3, 1, 2]
    turns = [w for r in range(3) for w in range(3) if counts[w] > r]  # 0 1 2 0 2 0
    for taken in range(sum(counts) + 1):
        assert batches_taken(counts, taken) == [turns[:taken].count(w) for w in range(3)]


def test_dataloader_workers_resume_on_other_ranks_and_workers(
    raw_store: Path, every_path: Counter[str]
) -> None:
    """TorchDataset in real DataLoader worker processes: 2 ranks x 2 workers take 3 batches
    each, then 3 ranks x 1 worker take 2, then 1 rank x 2 workers finish the epoch."""
    torch = pytest.importorskip("torch", reason="torch is an optional extra")
    from torch.utils.data import DataLoader

    from packer.torch_adapter import TorchDataset

    def job(
        world: int, workers: int, batches: int | None, state: dict[str, Any] | None
    ) -> tuple[list[str], dict[str, Any]]:
        taken: list[str] = []
        saved: dict[str, Any] = {}
        for rank in range(world):
            options = {**OPTIONS, "rank": rank, "world_size": world, "remainder": "uneven"}
            dataset = TorchDataset(raw_store, batch_size=16, **options)
            if state is not None:
                dataset.load_state_dict(state)
            loader = DataLoader(dataset, batch_size=None, num_workers=workers)
            steps = itertools.count() if batches is None else range(batches)
            for _, (_, _, paths) in zip(steps, loader):
                taken += paths
            if rank == 0 and batches is not None:
                saved = dataset.state_dict(batches, workers)
        return taken, saved

    assert torch is not None
    first, state = job(2, 2, 3, None)
    assert state["records_done"] == len(first) == 2 * 3 * 16
    second, state = job(3, 1, 2, state)
    rest, _ = job(1, 2, None, state)
    assert Counter(first + second + rest) == every_path


def _state(store: Path, **options: Any) -> dict[str, Any]:
    return _job(store, 2, 32, batches=2, **options)[1]


def test_a_shares_first_window_opens_as_it_is_read() -> None:
    """Its order lets records go as its spans are read (plan.opening_order): nothing is read
    ahead of it. The windows after it keep a plain shuffle; a resumed lane keeps each
    window's order."""
    chunks = [plan.chunk_spans([100], 5)]  # 20 chunks: 5 windows of 4
    planner = Planner(chunks, [100], seed=1, shuffle=True, buffer_chunks=4, remainder="uneven")
    pieces = planner.first_lane(0, Layout(1, 1, 8), 0, 0).pieces[0]
    assert [p.opens for p in pieces] == [True, False, False, False, False]
    for piece in pieces:
        assert piece.key is not None
        if piece.opens:  # the last span starts at record 15 of 20: its records go from 11 on
            assert piece.positions()[: int(15 * plan.OPENING_LEAD)].max() < 15
        else:
            plain = plan.window_order(20, piece.key[:-1], piece.key[-1])
            assert piece.positions().tolist() == plain.tolist()
    phase = Phase(Layout(1, 1, 8), 1)  # 8 of the first window's 20 records taken
    resumed = [p for lane in planner.lanes(0, [phase], Layout(2, 1, 8)) for p in lane.pieces[0]]
    rest = [p for p in resumed if p.key == pieces[0].key]
    assert [p.opens for p in rest] == [True]
    assert rest[0].positions().tolist() == pieces[0].positions()[8:].tolist()
    assert not any(p.opens for p in resumed if p.key != pieces[0].key)


def test_a_state_of_another_run_or_a_damaged_one_is_refused_in_one_line(
    raw_store: Path, tmp_path: Path
) -> None:
    state = _state(raw_store)
    other = tmp_path / "other"
    for i in range(NUM):
        write_image(other / "c" / f"{i:03d}.png", size=(8, 8), seed=i + 1)
    other_store = tmp_path / "other.h5"
    pack(other, other_store, PackOptions(backend="hdf5", seed=2, workers=2, raw=True, size=(8, 8)))

    def refused(store: Path, saved: Any, **options: Any) -> str:
        with (
            open_reader(store, batch_size=32, **{**OPTIONS, **options}) as reader,
            pytest.raises(StateError) as info,
        ):
            reader.load_state_dict(saved)
        message = str(info.value)
        assert "\n" not in message
        return message

    assert "another store: raw.h5" in refused(other_store, state)
    assert "other.h5" in refused(other_store, state)
    assert "seed 3" in refused(raw_store, state, seed=4)
    assert "chunk_sizes [10]" in refused(raw_store, state, chunk_size=12)
    assert "buffer_chunks 2" in refused(raw_store, state, buffer_chunks=3)
    assert "remainder 'drop'" in refused(raw_store, state, remainder="pad")
    assert "reading 2 store(s), this reader reads 1" in refused(
        raw_store, {**state, "stores": state["stores"] * 2}
    )
    assert "says 127 records" in refused(raw_store, {**state, "records_done": 127})
    too_far = {**state, "phases": [{**state["phases"][0], "batches": 99}]}
    assert "99 batches of 32" in refused(raw_store, too_far)
    assert "phase 0" in refused(raw_store, {**state, "phases": [{"world_size": 0}]})
    assert "no 'epoch'" in refused(raw_store, {k: v for k, v in state.items() if k != "epoch"})
    assert "packer 0.1" in refused(raw_store, {"epoch": 1, "batch": 3, "seed": 3})
    assert "first window of each epoch" in refused(raw_store, {**state, "version": 1})
    assert "version 9" in refused(raw_store, {**state, "version": 9})
    assert "not list" in refused(raw_store, [1, 2])


def test_a_state_saved_between_epochs_names_the_next(raw_store: Path) -> None:
    with open_reader(raw_store, batch_size=50, **OPTIONS) as r:
        list(r.epoch(0))
        state = r.state_dict()
    assert (state["epoch"], state["phases"], state["records_done"]) == (1, [], 0)
    with open_reader(raw_store, batch_size=50, **OPTIONS) as fresh:
        expected = [paths for _, _, paths in fresh.epoch(1)]
    with open_reader(raw_store, batch_size=50, **OPTIONS) as r:
        r.load_state_dict(state)
        assert [paths for _, _, paths in r] == expected


def test_a_resumed_epoch_read_ahead_is_the_same_epoch(raw_store: Path) -> None:
    """Windows cut by a resume, and pieces of one window joined, are read ahead span by span
    as they are read: the batches are those read without reading ahead."""
    _, state = _job(raw_store, 2, 32, batches=3, remainder="uneven")
    got = {
        depth: _job(raw_store, 3, 16, None, state, remainder="uneven", read_ahead=depth)[0]
        for depth in (0, 2)
    }
    assert got[2] == got[0] and len(got[0]) == NUM - 2 * 3 * 32


def test_a_state_loaded_and_saved_before_reading_is_the_same_state(raw_store: Path) -> None:
    _, state = _job(raw_store, 2, 32, batches=3)
    with open_reader(raw_store, batch_size=16, world_size=4, rank=1, **OPTIONS) as r:
        r.load_state_dict(state)
        assert r.state_dict() == state
