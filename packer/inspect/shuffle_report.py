"""How well mixed a store's order is, and what the reader's chunk reshuffle makes of it, from
labels alone, against full random permutations of the same labels: the evidence for choosing
``chunk_size`` and ``buffer_chunks``. Used by ``packer inspect --shuffle``."""

from __future__ import annotations

from typing import Any

import numpy as np

from packer.inspect.look import StoreLike, all_labels, label_column_info, opened, positive
from packer.reading import epoch as plan
from packer.reading.options import ReaderOptions, default_chunk_size
from packer.reading.reader import Reader

__all__ = ["shuffle_quality"]


def _runs(codes: np.ndarray) -> tuple[float, float]:
    """(mean, max) length of the runs of equal consecutive labels."""
    if len(codes) == 0:
        return 0.0, 0.0
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    lengths = np.diff(np.concatenate(([0], starts, [len(codes)])))
    return float(len(codes) / len(lengths)), float(lengths.max())


def _group_tv(codes: np.ndarray, groups: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(mean, max) over groups of the total-variation distance between a group's label
    distribution and ``p``. ``codes`` are labels 0..K-1, ``groups`` group ids 0..G-1.

    TV = 1/2 sum_k |q_k - p_k| = 1/2 (1 + sum over labels present in the group of
    (|q_k - p_k| - p_k)), so only the (group, label) pairs that occur are counted: memory
    O(records), however many classes.
    """
    if len(codes) == 0:
        return 0.0, 0.0
    k = len(p)
    sizes = np.bincount(groups)
    pairs, counts = np.unique(groups.astype(np.int64) * k + codes, return_counts=True)
    group, label = pairs // k, pairs % k
    share = counts / sizes[group]
    excess = np.bincount(group, weights=np.abs(share - p[label]) - p[label], minlength=len(sizes))
    tv = 0.5 * (1.0 + excess)
    tv = tv[sizes > 0]
    return float(tv.mean()), float(tv.max())


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else 1.0


def shuffle_quality(
    store: StoreLike,
    *,
    chunk_size: int | None = None,
    buffer_chunks: int = 8,
    seed: int = 0,
    label_column: int = 0,
    epochs: int = 1,
    batch_size: int = 256,
    trials: int = 5,
) -> dict[str, Any]:
    """How well mixed the store's order is, and what the reader makes of it, from labels only.

    Reads every record's label in ``label_column`` (HDF5: the small labels datasets; LMDB:
    one sequential pass over the records), never decodes an image, and compares against
    ``trials`` uniform random permutations of the same labels (seeded by ``seed``), so every
    figure has its "as if perfectly shuffled" baseline beside it.

    Statistics:
        run length   lengths of the runs of equal consecutive labels; a sorted store has runs
                     as long as its classes, a well shuffled one about 1 / (1 - sum p_k^2).
        TV           total-variation distance between a group's label distribution and the
                     whole store's, 1/2 sum_k |q_k - p_k|: 0 for a perfect sample, near 1 for a
                     group of one class among many. Even a random group of m records is at
                     some distance (about sqrt(K / m) / 2 for K classes), hence the baselines.

    Returns a dict::

        records, classes (distinct labels), label_column, chunk_size, buffer_chunks,
        batch_size, epochs, trials, seed       the inputs, and chunk_size when defaulted
        stored: the order in the shards (what chunks the reader reads)
            mean_run, max_run                  run lengths in store order
            random_mean_run, random_max_run    the same, averaged over the random permutations
            run_ratio                          mean_run / random_mean_run (1: as random)
            chunk_tv                           mean TV over chunks of chunk_size (as the reader
                                               cuts them: never across shards)
            random_chunk_tv                    the same over the random permutations
            tv_ratio                           chunk_tv / random_chunk_tv (1: as random)
        reader: the order ``open_reader(store, batch_size=batch_size, chunk_size=chunk_size,
            buffer_chunks=buffer_chunks, seed=seed)`` yields (one process, shuffle on), built
            with ``packer.reading.epoch`` exactly as the reader builds it, averaged over ``epochs``
            epochs (max_* fields: the worst epoch)
            mean_run, max_run, random_mean_run, random_max_run, run_ratio
                                               as above, over the epoch's record stream
            batch_tv, max_batch_tv             mean and worst TV over its batches
            random_batch_tv, random_max_batch_tv  the same for batches of a random permutation
            tv_ratio                           batch_tv / random_batch_tv (1: as random)

    A ratio is 1.0 when its baseline is 0 (a single class). Ratios near 1 (say under 1.2)
    mean batches look like random samples; raise buffer_chunks (more chunks mixed per window)
    or lower chunk_size when the reader's ratios are high, which is what a store packed with
    ``--no-shuffle`` needs.

    Raises:
        UsageError: a store without labels, a label column out of range, or a non-positive
            chunk_size, buffer_chunks, epochs, batch_size or trials.
    """
    positive(buffer_chunks=buffer_chunks, epochs=epochs, batch_size=batch_size, trials=trials)
    if chunk_size is not None:
        positive(chunk_size=chunk_size)
    with opened(store) as s:
        label_column_info(s, label_column)
        values = all_labels(s)[:, label_column]
        sizes = [info.num_records for info in s.manifest.shards]
        if chunk_size is None:
            chunk_size = default_chunk_size(s.manifest.stats, len(s))
        foreign = s.manifest.options if s.manifest.backend == "pytables" else {}
        # The reader's own plan (rank 0 of 1, no DataLoader workers): scored, never read.
        planner = Reader(
            s.path,
            ReaderOptions(
                batch_size=batch_size,
                chunk_size=chunk_size,
                buffer_chunks=buffer_chunks,
                seed=seed,
                rank=0,
                world_size=1,
                images=foreign.get("images"),
                labels=foreign.get("labels"),
            ),
        )
    n = len(values)
    _, codes = np.unique(values, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    p = np.bincount(codes) / max(n, 1)

    spans = plan.chunk_spans(sizes, chunk_size)
    chunk_of = np.repeat(np.arange(len(spans)), [len(sp) for sp in spans])
    batch_of = np.arange(n) // batch_size

    rng = np.random.default_rng([seed, 0x5EED])
    random: dict[str, list[float]] = {"mean_run": [], "max_run": [], "chunk_tv": []}
    random.update({"batch_tv": [], "max_batch_tv": []})
    for _ in range(trials):
        shuffled = codes[rng.permutation(n)]
        mean_run, max_run = _runs(shuffled)
        random["mean_run"].append(mean_run)
        random["max_run"].append(max_run)
        random["chunk_tv"].append(_group_tv(shuffled, chunk_of, p)[0])
        batch_tv, max_batch_tv = _group_tv(shuffled, batch_of, p)
        random["batch_tv"].append(batch_tv)
        random["max_batch_tv"].append(max_batch_tv)
    baseline = {key: float(np.mean(v)) for key, v in random.items()}

    mean_run, max_run = _runs(codes)
    chunk_tv = _group_tv(codes, chunk_of, p)[0]
    stored = {
        "mean_run": mean_run,
        "max_run": max_run,
        "random_mean_run": baseline["mean_run"],
        "random_max_run": baseline["max_run"],
        "run_ratio": _ratio(mean_run, baseline["mean_run"]),
        "chunk_tv": chunk_tv,
        "random_chunk_tv": baseline["chunk_tv"],
        "tv_ratio": _ratio(chunk_tv, baseline["chunk_tv"]),
    }

    runs, max_runs, tvs, max_tvs = [], [], [], []
    for epoch in range(epochs):
        order = codes[planner.record_order(epoch)]
        epoch_run, epoch_max = _runs(order)
        epoch_tv, epoch_max_tv = _group_tv(order, batch_of, p)
        runs.append(epoch_run)
        max_runs.append(epoch_max)
        tvs.append(epoch_tv)
        max_tvs.append(epoch_max_tv)
    reader_run, reader_tv = float(np.mean(runs)), float(np.mean(tvs))
    reader = {
        "mean_run": reader_run,
        "max_run": float(max(max_runs)),
        "random_mean_run": baseline["mean_run"],
        "random_max_run": baseline["max_run"],
        "run_ratio": _ratio(reader_run, baseline["mean_run"]),
        "batch_tv": reader_tv,
        "max_batch_tv": float(max(max_tvs)),
        "random_batch_tv": baseline["batch_tv"],
        "random_max_batch_tv": baseline["max_batch_tv"],
        "tv_ratio": _ratio(reader_tv, baseline["batch_tv"]),
    }
    return {
        "records": n,
        "classes": len(p),
        "label_column": label_column,
        "chunk_size": chunk_size,
        "buffer_chunks": buffer_chunks,
        "batch_size": batch_size,
        "epochs": epochs,
        "trials": trials,
        "seed": seed,
        "stored": stored,
        "reader": reader,
    }
