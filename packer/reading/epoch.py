"""Which records a reader yields in an epoch, and in what order: pure functions, no I/O.

An epoch's order is built in four steps, each a function of its arguments alone:

1. ``chunk_spans``: the store cut into chunks of ``chunk_size`` consecutive records (a chunk
   never crosses a shard), the unit of sequential reading.
2. ``shuffled_chunks``: the chunks in a new order each epoch, seeded by (seed, epoch).
3. ``take_share``: the run of that order that belongs to one rank, then to one DataLoader
   worker of that rank: contiguous, disjoint, together covering every record once.
4. ``windows`` + ``window_order``: the share read ``buffer_chunks`` chunks at a time, and the
   records of each window yielded in a seeded random order (the shuffle buffer). The first
   window of a share opens as it is read (``opening_order``): nothing before it is read ahead.

So every record appears exactly once per epoch across ranks and workers, and a resumed
reader can recompute where it was from a few integers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "Span",
    "REMAINDERS",
    "chunk_spans",
    "shuffled_chunks",
    "take_share",
    "windows",
    "window_order",
    "opening_order",
    "share_size",
    "share_bounds",
    "cut",
]

REMAINDERS = ("drop", "pad", "uneven")
# In an opening window, a chunk's records may be yielded from this fraction of the way to
# where the chunk starts: the reads need be only a third ahead of the yields, and the records
# drawn from grow to about a third as many as were yielded, plus the newest chunk's.
OPENING_LEAD = 0.75


@dataclass(frozen=True, slots=True)
class Span:
    """Records ``start`` to ``stop`` (exclusive) of one shard: one sequential read."""

    shard: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def chunk_spans(shard_sizes: Sequence[int], chunk_size: int) -> list[Span]:
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be at least 1, not {chunk_size}")
    return [
        Span(shard, start, min(start + chunk_size, size))
        for shard, size in enumerate(shard_sizes)
        for start in range(0, size, chunk_size)
    ]


def shuffled_chunks(spans: Sequence[Span], seed: int, epoch: int, *more: int) -> list[Span]:
    """The chunks in the order of ``epoch``; ``more`` tells apart the stores of a mixture."""
    # Seeded by the pair, not seed + epoch: (seed 1, epoch 2) and (seed 2, epoch 1) differ.
    rng = np.random.default_rng([seed, epoch, *more])
    return [spans[i] for i in rng.permutation(len(spans))]


def share_size(total: int, parts: int, part: int, remainder: str) -> int:
    """Records in share ``part`` of ``parts``: equal for drop and pad, within one for uneven."""
    if remainder == "drop":
        return total // parts
    if remainder == "pad":
        return math.ceil(total / parts)
    return (part + 1) * total // parts - part * total // parts


def take_share(
    spans: Sequence[Span], part: int, parts: int, remainder: str = "uneven"
) -> list[Span]:
    """The ``part``-th of ``parts`` contiguous runs of the records in ``spans``.

    remainder, when the records do not divide evenly:
        "drop": every share has floor(total / parts) records; the last few of this epoch's
            order are not read this epoch (a different few each epoch).
        "pad": every share has ceil(total / parts); the shortfall repeats records from the
            start of the order (as torch's DistributedSampler does).
        "uneven": shares differ by at most one record; nothing dropped or repeated.
    """
    if remainder not in REMAINDERS:
        raise ValueError(f"remainder must be one of {', '.join(REMAINDERS)}, not {remainder!r}")
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is out of range for {parts} parts")
    total = sum(len(s) for s in spans)
    begin, end = share_bounds(total, part, parts, remainder)
    out: list[Span] = []
    while begin < end:  # "pad" wraps around to the start of the order
        start = begin % total
        count = min(end - begin, total - start)
        out += cut(spans, start, count)
        begin += count
    return out


def share_bounds(total: int, part: int, parts: int, remainder: str) -> tuple[int, int]:
    """Where share ``part`` of ``parts`` begins and ends in a sequence of ``total`` records;
    with "pad" the end may pass ``total`` (the share then wraps round to the start)."""
    if remainder == "uneven":
        begin = part * total // parts
    else:
        begin = part * share_size(total, parts, part, remainder)
    return begin, begin + share_size(total, parts, part, remainder)


def cut(spans: Sequence[Span], begin: int, count: int) -> list[Span]:
    """The spans covering records begin .. begin + count of the sequence ``spans``."""
    out, position = [], 0
    for span in spans:
        lo, hi = max(begin, position), min(begin + count, position + len(span))
        if lo < hi:
            out.append(Span(span.shard, span.start + lo - position, span.start + hi - position))
        position += len(span)
        if position >= begin + count:
            break
    return out


def windows(spans: Sequence[Span], buffer_chunks: int) -> list[list[Span]]:
    """The share read ``buffer_chunks`` spans at a time: the shuffle buffer's fills."""
    if buffer_chunks < 1:
        raise ValueError(f"buffer_chunks must be at least 1, not {buffer_chunks}")
    return [list(spans[i : i + buffer_chunks]) for i in range(0, len(spans), buffer_chunks)]


def window_order(size: int, stream: Sequence[int], window: int) -> np.ndarray:
    """The order in which a window's ``size`` records are yielded; ``stream`` identifies the
    reader (seed, epoch, rank, world size, worker, workers), ``window`` its position."""
    return np.random.default_rng([*stream, window]).permutation(size)


def opening_order(sizes: Sequence[int], stream: Sequence[int], window: int) -> np.ndarray:
    """The order of a share's first window, whose spans have ``sizes``: a seeded random order
    in which span k's records come no earlier than ``OPENING_LEAD`` x where span k starts.

    No window is read ahead of the first, so a plain shuffle of it would wait for all of its
    spans before its first record (seconds, from a disk). Here each stretch of the order draws
    evenly from the records of the spans read so far that are not yet yielded, so batches
    come as soon as the first span is read, and mix ever more spans as the window goes on.
    """
    rng = np.random.default_rng([*stream, window])
    starts = np.cumsum([0, *sizes])
    total = int(starts[-1])
    opens = [int(start * OPENING_LEAD) for start in starts[:-1]] + [total]
    pool, out = np.zeros(0, np.int64), []
    for k in range(len(sizes)):
        pool = np.concatenate([pool, np.arange(starts[k], starts[k + 1])])
        drawn = rng.permutation(len(pool))
        take = opens[k + 1] - opens[k]
        out.append(pool[drawn[:take]])
        pool = pool[drawn[take:]]
    return np.concatenate(out) if out else np.zeros(0, np.int64)
