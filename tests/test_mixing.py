"""Weighted mixing of stores: the proportions (whole epochs and any 20 batches), which records
each store gives, what a batch carries, stores of different image sizes, resume, DataLoader
workers, refusals and ``packer inspect A B --mix``."""

from __future__ import annotations

import itertools
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import write_image

from packer import PackOptions, open_reader, open_store, pack
from packer.cli.commands import cli
from packer.errors import UsageError
from packer.reading import epoch as plan
from packer.reading import produce
from packer.reading.batching import finish_batch
from packer.reading.lanes import Layout, Planner
from packer.reading.mixture import mix_order, quotas, window_chunks


def _pack(root: Path, out: Path, classes: list[str], count: int, side: int, seed: int) -> Path:
    for i in range(count):
        name = classes[i % len(classes)]
        write_image(root / name / f"{name}_{i:03d}.png", size=(side, side), seed=seed + i)
    options = PackOptions(
        backend="hdf5", seed=seed, workers=2, shards=2, raw=True, size=(side, side)
    )
    pack(root, out, options)
    return out


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """a: 300 raw 8x8 (cat, dog); b: 150 raw 12x12 (x, y, z); c: 200 raw 8x8 (ant, bee)."""
    tmp = tmp_path_factory.mktemp("mix")
    return {
        "a": _pack(tmp / "a", tmp / "a.h5", ["cat", "dog"], 300, 8, 100),
        "b": _pack(tmp / "b", tmp / "b.h5", ["x", "y", "z"], 150, 12, 1000),
        "c": _pack(tmp / "c", tmp / "c.h5", ["ant", "bee"], 200, 8, 5000),
    }


def _truth(store: Path) -> dict[str, tuple[np.ndarray, int]]:
    with open_store(store) as s:
        shape = tuple(s.manifest.storage.shape or ())
        return {
            r.path: (np.frombuffer(bytes(r.data), np.uint8).reshape(shape), int(r.labels[0]))
            for r in s.records()
        }


# -- the plan: pure ---------------------------------------------------------------------


def test_quotas_follow_the_weights_exactly() -> None:
    assert quotas([300, 150], [0.7, 0.3], None) == [300, 128]  # a is scarcest for its weight
    assert quotas([80_000, 50_000], [0.7, 0.3], 100_000) == [70_000, 30_000]
    assert quotas([10, 10], [0.5, 0.5], 1001) in ([501, 500], [500, 501])
    assert quotas([7, 3], None, None) == [7, 3]  # no weights: every record of every store


def test_shares_within_1pct_over_100k_and_5pct_in_any_20_batches() -> None:
    """The plan of a 100k-record epoch of two stores at 0.7 / 0.3 on 4 ranks: each rank's
    share of each store within 1% of its weight, and so in every window of 20 batches."""
    sizes, weights, batch = [80_000, 50_000], [0.7, 0.3], 32
    chunks = [plan.chunk_spans([n // 2, n - n // 2], 500) for n in sizes]
    planner = Planner(
        chunks,
        quotas(sizes, weights, 100_000),
        seed=5,
        shuffle=True,
        buffer_chunks=8,
        remainder="drop",
    )
    total = np.zeros(2)
    for rank in range(4):
        lane = planner.first_lane(0, Layout(4, 1, batch), rank, 0)
        assert lane.mix is not None
        counts = np.bincount(lane.mix, minlength=2)
        total += counts
        assert np.allclose(counts / counts.sum(), weights, atol=0.01)
        in_batches = np.add.reduceat(np.eye(2)[lane.mix], np.arange(0, len(lane.mix), batch))
        for start in range(len(in_batches) - 20 + 1):
            window = in_batches[start : start + 20].sum(axis=0)
            assert np.all(np.abs(window / window.sum() - weights) <= 0.05)
    assert total.sum() == 100_000 and np.allclose(total / total.sum(), weights, atol=0.01)


def test_a_mixture_shares_one_shuffle_buffer_in_proportion_to_the_quotas() -> None:
    """Each store's windows hold its share of ``buffer_chunks`` (at least one chunk), so the
    mixture's windows together hold about one store's; a store read alone keeps them all."""
    assert window_chunks(8, [70_000, 30_000]) == [6, 2]
    assert window_chunks(8, [99_000, 1_000]) == [8, 1]  # never less than a chunk
    assert window_chunks(8, [500]) == [8]
    sizes = [80_000, 50_000]
    chunks = [plan.chunk_spans([n], 500) for n in sizes]
    options = {"seed": 5, "shuffle": True, "buffer_chunks": 8, "remainder": "drop"}
    planner = Planner(chunks, quotas(sizes, [0.7, 0.3], 100_000), **options)
    lane = planner.first_lane(0, Layout(1, 1, 32), 0, 0)
    held = [{len(piece.spans) for piece in pieces[:-1]} for pieces in lane.pieces]
    assert held == [{6}, {2}]  # every window but the last of each store, which may be short
    alone = Planner(chunks[:1], sizes[:1], **options).first_lane(0, Layout(1, 1, 32), 0, 0)
    assert {len(piece.spans) for piece in alone.pieces[0][:-1]} == {8}


def test_the_interleave_is_even_in_any_stretch_and_seeded() -> None:
    mix = mix_order([700, 300], (1, 2))
    assert np.bincount(mix).tolist() == [700, 300]
    ones = np.cumsum(mix == 1)
    expected = 0.3 * np.arange(1, 1001)
    assert np.abs(ones - expected).max() <= 2
    assert np.array_equal(mix, mix_order([700, 300], (1, 2)))
    assert not np.array_equal(mix, mix_order([700, 300], (1, 3)))


# -- reading ----------------------------------------------------------------------------


def _epoch(reader: Any, epoch: int) -> list[tuple[Any, ...]]:
    return list(reader.epoch(epoch))


def test_a_mixture_of_two_image_sizes_reads_as_one_array_with_its_sources(
    stores: dict[str, Path],
) -> None:
    """a (8x8) at 0.7 and b (12x12) at 0.3 with size=(8, 8): one array per batch, each
    record's store and its own store's label, a's every record once, b's quota of
    distinct records; per-store stats; the same batches again for the same (seed, epoch)."""
    truth = [_truth(stores["a"]), _truth(stores["b"])]
    options: dict[str, Any] = {"batch_size": 20, "seed": 9, "size": (8, 8), "with_paths": True}
    options["fit"] = "stretch"
    with open_reader([stores["a"], stores["b"]], weights=[0.7, 0.3], **options) as r:
        batches = _epoch(r, 0)
        stats = r.stats()
        again = _epoch(r, 0)
    seen: dict[int, list[str]] = {0: [], 1: []}
    for images, labels, sources, paths in batches:
        assert isinstance(images, np.ndarray) and images.shape == (len(paths), 8, 8, 3)
        assert len(labels) == len(sources) == len(paths)
        for label, source, path in zip(labels, sources, paths, strict=True):
            assert truth[int(source)][path][1] == label  # the label of that store's record
            seen[int(source)].append(path)
    assert Counter(seen[0]) == Counter(list(truth[0]))  # the scarcest store: each record once
    assert len(seen[1]) == len(set(seen[1])) == 128
    assert stats["sources"] == {
        "a.h5": {"images": 300, "share": round(300 / 428, 4)},
        "b.h5": {"images": 128, "share": round(128 / 428, 4)},
    }
    assert [b[3] for b in again] == [b[3] for b in batches]
    with open_reader(
        {"A": stores["a"], "B": stores["b"]}, weights={"B": 3, "A": 7}, **options
    ) as r:
        assert [b[3] for b in _epoch(r, 0)] == [b[3] for b in batches]  # names, any order
        assert [b[3] for b in _epoch(r, 1)] != [b[3] for b in batches]


def test_raw_stores_of_one_shape_mix_into_the_batch_array_as_stored(
    stores: dict[str, Path],
) -> None:
    truth = [_truth(stores["a"]), _truth(stores["c"])]
    with open_reader(
        [stores["a"], stores["c"]], batch_size=32, weights=[1, 1], seed=2, with_paths=True
    ) as r:
        count = 0
        for images, labels, sources, paths in r:
            for image, label, source, path in zip(images, labels, sources, paths, strict=True):
                pixels, expected = truth[int(source)][path]
                assert np.array_equal(image, pixels) and label == expected
            count += len(paths)
        counted = _images_per_store(r)
    assert count == 400  # c, 200 records at half the weight, sets the epoch
    assert counted == {"a.h5": 200, "c.h5": 200}


def _images_per_store(reader: Any) -> dict[str, int]:
    """What ``reader.stats()`` counts for each store of its mixture in its last epoch."""
    return {name: figures["images"] for name, figures in reader.stats()["sources"].items()}


def test_each_epoch_is_planned_once(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's thread and the prefetch thread both ask for an epoch's lane as it starts;
    a mixture's interleave is planned once for both, not by each (an argsort of the epoch)."""
    planned: list[int] = []
    real = Planner.lane

    def counted(self: Planner, epoch: int, *args: Any) -> Any:
        planned.append(epoch)
        return real(self, epoch, *args)

    monkeypatch.setattr(Planner, "lane", counted)
    with open_reader(
        [stores["a"], stores["c"]], batch_size=4, weights=[1, 1], seed=2, prefetch=2
    ) as r:
        for epoch in range(4):
            assert sum(len(b[0]) for b in r.epoch(epoch)) == 400
    assert sorted(planned) == sorted(set(planned))  # none twice
    assert {0, 1, 2, 3} <= set(planned) <= {0, 1, 2, 3, 4}  # 4: read on into the next


def test_a_smaller_store_is_repeated_when_the_epoch_asks_for_more(stores: dict[str, Path]) -> None:
    """b at 0.5 of 600 records: 300 of b, its 150 records twice (two of its own epochs)."""
    with open_reader(
        [stores["a"], stores["b"]],
        batch_size=50,
        weights=[0.5, 0.5],
        epoch_size=600,
        size=(8, 8),
        with_paths=True,
    ) as r:
        got = [(int(s), p) for _, _, sources, paths in r for s, p in zip(sources, paths)]
    b = Counter(p for s, p in got if s == 1)
    assert len(got) == 600 and sum(b.values()) == 300 and set(b.values()) == {2}


def test_ranks_and_a_resume_on_more_ranks_cover_the_mixture_once(stores: dict[str, Path]) -> None:
    """2 ranks read 3 batches each, 3 ranks finish: every (store, record) of the epoch once."""
    mix = [stores["a"], stores["b"]]
    options: dict[str, Any] = {"batch_size": 16, "seed": 4, "size": (8, 8), "with_paths": True}
    options.update(weights=[0.6, 0.4], remainder="uneven", chunk_size=10)
    with open_reader(mix, **options) as whole:
        everything = Counter((int(s), p) for _, _, ss, ps in whole.epoch(0) for s, p in zip(ss, ps))
    taken: list[tuple[int, str]] = []
    state: dict[str, Any] = {}
    for world, steps in ((2, range(3)), (3, itertools.count())):
        saved = state
        for rank in range(world):
            with open_reader(mix, rank=rank, world_size=world, **options) as r:
                if saved:
                    r.load_state_dict(saved)
                for _, (_, _, ss, ps) in zip(steps, r):
                    taken += [(int(s), p) for s, p in zip(ss, ps)]
                if rank == 0:
                    state = r.state_dict()
    assert Counter(taken) == everything


def test_a_mixtures_state_names_each_stores_share_of_the_buffer(stores: dict[str, Path]) -> None:
    """The order of a mixture depends on how the stores share the shuffle buffer: a state
    saved with another share, or by a packer that gave each store a whole buffer (no
    ``window_chunks``), is refused in one line; one store's state does not carry it."""
    mix = [stores["a"], stores["b"]]
    options: dict[str, Any] = {"batch_size": 16, "seed": 4, "weights": [0.75, 0.25]}
    with open_reader(mix, chunk_size=10, **options) as reader:
        next(iter(reader.epoch(0)))
        state = reader.state_dict()
        assert state["window_chunks"] == [6, 2]
        older = {k: v for k, v in state.items() if k != "window_chunks"}
        for saved, says in (
            (older, "older packer, which gave each store a whole shuffle buffer"),
            ({**state, "window_chunks": [8, 8]}, "window_chunks [8, 8]"),
        ):
            with pytest.raises(UsageError, match=re.escape(says)) as info:
                reader.load_state_dict(saved)
            assert "\n" not in str(info.value)
        reader.load_state_dict(state)  # its own state loads
    with open_reader(stores["a"], batch_size=16) as alone:
        assert "window_chunks" not in alone.state_dict()


def test_a_mixture_through_dataloader_workers(stores: dict[str, Path]) -> None:
    pytest.importorskip("torch", reason="torch is an optional extra")
    from torch.utils.data import DataLoader

    from packer.torch_adapter import TorchDataset

    mix = [stores["a"], stores["c"]]
    options: dict[str, Any] = {"batch_size": 16, "seed": 1, "with_paths": True}
    with open_reader(mix, weights=[2, 1], **options) as r:
        expected = Counter((int(s), p) for _, _, ss, ps in r for s, p in zip(ss, ps))
    dataset = TorchDataset(mix, weights=[2, 1], output="torch", **options)
    got: Counter[tuple[int, str]] = Counter()
    for images, _, sources, paths in DataLoader(dataset, batch_size=None, num_workers=2):
        assert images.shape[1:] == (8, 8, 3) and sources.dtype.is_floating_point is False
        got.update((int(s), p) for s, p in zip(sources.tolist(), paths))
    assert got == expected


def test_stores_that_cannot_mix_are_refused_in_one_line(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    two = [stores["a"], stores["b"]]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"weights": [1]}, "1 weights for 2 stores"),
        ({"weights": [1, -1]}, "positive number, not -1"),
        ({"weights": [1, float("nan")]}, "positive number, not nan"),
        ({"weights": {"a.h5": 1, "q": 2}}, "name q"),
        ({"epoch_size": 0}, "epoch_size must be a positive integer"),
    ]
    for extra, message in cases:
        with pytest.raises(UsageError, match=message):
            open_reader(two, batch_size=4, **extra)
    with pytest.raises(UsageError, match="no store to read"):
        open_reader([], batch_size=4)
    root = tmp_path / "flat"
    write_image(root / "one.png", size=(8, 8))
    unlabelled = tmp_path / "none.h5"
    pack(root, unlabelled, PackOptions(backend="hdf5", labels="none", raw=True, size=(8, 8)))
    with pytest.raises(UsageError, match="as many label columns"):
        open_reader([stores["a"], unlabelled], batch_size=4)


def test_inspect_mix_prints_an_epoch_per_store_and_class(stores: dict[str, Path]) -> None:
    args = ["inspect", str(stores["a"]), str(stores["b"]), "--mix", "0.7,0.3", "--seed", "9"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    a, b = report["sources"]
    assert report["records"] == 428 and (a["records"], b["records"]) == (300, 128)
    assert a["classes"] == {"cat": 150, "dog": 150} and a["distinct"] == 300
    assert set(b["classes"]) <= {"x", "y", "z"} and sum(b["classes"].values()) == 128
    assert abs(a["share"] - 0.7) < 0.01 and a["passes"] == 1.0
    with open_reader([stores["a"], stores["b"]], batch_size=1, weights=[0.7, 0.3], seed=9) as r:
        labels = [int(lab) for _, labels, sources in r for lab, s in zip(labels, sources) if s == 1]
    assert sorted(Counter(labels).values()) == sorted(b["classes"].values())  # what a read gives
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "a.h5: 300 records, 70.1%" in text.output
    assert "cat" in text.output and "b.h5: 128 records" in text.output
    wrong = CliRunner().invoke(cli, ["inspect", str(stores["a"]), str(stores["b"]), "--mix", "1"])
    assert wrong.exit_code == 1 and "1 weights for 2 stores" in wrong.output
    several = CliRunner().invoke(cli, ["inspect", str(stores["a"]), str(stores["b"])])
    assert several.exit_code == 1 and "several with --mix" in several.output


def test_a_damaged_raw_record_in_a_mixture_is_named_or_skipped(
    stores: dict[str, Path], tmp_path: Path
) -> None:
    """Raw rows of one shape are gathered straight into the batch array; a row whose checksum
    fails sends its batch down the general path, which names it, or leaves it out."""
    import shutil

    from packer.errors import CorruptRecordError

    damaged = Path(shutil.copytree(stores["c"], tmp_path / "c.h5"))
    with open_store(damaged) as s:
        record = s.record(7)
        pixels = bytes(record.data)
        shard = damaged / s.manifest.shards[s.locate(7)[0]].file
    data = bytearray(shard.read_bytes())
    at = data.find(pixels)
    assert at >= 0 and data.find(pixels, at + 1) < 0  # the row's bytes, found once
    data[at] ^= 0xFF
    shard.write_bytes(bytes(data))
    mix = [stores["a"], damaged]
    with (
        open_reader(mix, batch_size=32, weights=[1, 1], seed=2) as r,
        pytest.raises(CorruptRecordError) as info,
    ):
        list(r)
    assert info.value.path == record.path
    truth = [_truth(stores["a"]), _truth(stores["c"])]
    with open_reader(
        mix, batch_size=32, weights=[1, 1], seed=2, with_paths=True, on_error="skip"
    ) as r:
        seen = []
        for images, _, sources, paths in r:
            for image, source, path in zip(images, sources, paths, strict=True):
                assert np.array_equal(image, truth[int(source)][path][0])
                seen.append((int(source), path))
        counted = _images_per_store(r)
    assert (1, record.path) not in seen and len(seen) == 399
    by_store = Counter(source for source, _ in seen)  # what was yielded, the skipped one not
    assert counted == {"a.h5": by_store[0], "c.h5": by_store[1]} and by_store[1] == 199


def test_a_mixed_batch_goes_to_the_decode_workers_in_as_many_pieces_as_one_stores(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each store's part of a batch is cut into its share of the workers' pieces, not into
    one piece per worker each (twice the hand-offs a batch for two stores): at most one
    piece more than workers a batch, from rounding, and the batches are one worker's."""
    pieces: list[int] = []

    def counted(window: Any, **keywords: Any) -> Any:
        pieces.append(len(window))
        return finish_batch(window, **keywords)

    options: dict[str, Any] = {"batch_size": 64, "seed": 3, "size": (8, 8), "decode_in": "threads"}
    mixture = [stores["a"], stores["c"]]
    with open_reader(mixture, weights=[0.7, 0.3], workers=1, **options) as r:
        alone = [b[2].tolist() for b in _epoch(r, 0)]  # each batch's stores, in order
    monkeypatch.setattr(produce, "finish_batch", counted)
    with open_reader(mixture, weights=[0.7, 0.3], workers=2, across_epochs=False, **options) as r:
        batches = _epoch(r, 0)
    assert [b[2].tolist() for b in batches] == alone
    assert sum(pieces) == sum(len(b[1]) for b in batches)
    assert len(pieces) <= 3 * len(batches)  # 4 a batch when each part was cut in two
