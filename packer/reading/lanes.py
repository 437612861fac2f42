"""Who yields which records in an epoch, and what is left of it after a resume: pure, no I/O.

A *lane* is what one reader yields in an epoch: one rank's share, or one DataLoader worker's
part of it. For each store it is a list of Pieces (some records of one shuffle window, in
the window's order) and, in a mixture, which store each of its records comes from.

    Planner.lanes(epoch, phases, layout):
      first_lanes   the epoch's chunk order (per store: mixture.source_segment) cut into
                    contiguous shares, one per lane, and each share into shuffle windows
      for each phase of a resumed epoch (a layout, and how many batches each rank took):
        each lane loses what it yielded (``consumed``); where the next layout has other
        ranks or workers, what is left of every lane is joined in lane order and split
        afresh among the new lanes (``split``)

So "how far the epoch has got" is the list of phases: any world size continues from it,
every record still comes once, and the reads are still whole windows of chunks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from packer.reading import epoch as plan
from packer.reading.mixture import mix_order, source_segment, window_chunks

__all__ = ["Piece", "Layout", "Phase", "Lane", "Planner", "batches_taken"]


@dataclass(frozen=True)
class Piece:
    """Records of one shuffle window: the window is ``spans`` read one after the other, its
    records put in the order ``key`` seeds (None: as stored), and of that order this piece
    holds the positions in ``ranges``, in turn. ``opens``: the window's order lets its
    records go as its spans are read (plan.opening_order): a share's first window, which
    nothing is read ahead of."""

    spans: tuple[plan.Span, ...]
    key: tuple[int, ...] | None
    ranges: tuple[tuple[int, int], ...]
    opens: bool = False

    def __len__(self) -> int:
        return sum(b - a for a, b in self.ranges)

    def positions(self) -> np.ndarray:
        """Where this piece's records are among the window's records as read, in yield order."""
        sizes = [len(s) for s in self.spans]
        if self.key is None:
            order = np.arange(sum(sizes))
        elif self.opens:
            order = plan.opening_order(sizes, self.key[:-1], self.key[-1])
        else:
            order = plan.window_order(sum(sizes), self.key[:-1], self.key[-1])
        return np.concatenate([order[a:b] for a, b in self.ranges] or [np.zeros(0, np.int64)])

    def cut(self, begin: int, count: int) -> Piece:
        """Records ``begin`` to ``begin + count`` of this piece."""
        out, at = [], 0
        for a, b in self.ranges:
            lo, hi = max(begin, at), min(begin + count, at + b - a)
            if lo < hi:
                out.append((a + lo - at, a + hi - at))
            at += b - a
        return Piece(self.spans, self.key, tuple(out), self.opens)


def cut_pieces(pieces: Sequence[Piece], begin: int, count: int) -> list[Piece]:
    """Records ``begin`` to ``begin + count`` of the sequence ``pieces``, as pieces."""
    out, at = [], 0
    for piece in pieces:
        n = len(piece)
        lo, hi = max(begin, at), min(begin + count, at + n)
        if lo < hi:
            out.append(piece if hi - lo == n else piece.cut(lo - at, hi - lo))
        at += n
        if at >= begin + count:
            break
    return out


def joined(pieces: Sequence[Piece]) -> list[Piece]:
    """``pieces`` with neighbours of one window made one piece, so the window is read once."""
    out: list[Piece] = []
    for piece in pieces:
        if out and out[-1].spans == piece.spans and out[-1].key == piece.key:
            out[-1] = Piece(piece.spans, piece.key, out[-1].ranges + piece.ranges, piece.opens)
        elif len(piece):
            out.append(piece)
    return out


@dataclass(frozen=True)
class Layout:
    """How a job reads: ranks, DataLoader workers per rank (1: none), batch size."""

    world_size: int
    workers: int
    batch_size: int
    drop_last: bool = False


@dataclass(frozen=True)
class Phase:
    """Part of an epoch read in one layout: ``batches`` taken by the training loop of each
    rank (ranks step together, so rank 0's count is every rank's)."""

    layout: Layout
    batches: int


@dataclass
class Lane:
    """What one reader yields: for each store, its pieces in order; ``mix``, the store of each
    record in yield order (None for a store read alone)."""

    pieces: list[list[Piece]]
    mix: np.ndarray | None = field(default=None)

    def __len__(self) -> int:
        return sum(len(p) for pieces in self.pieces for p in pieces)

    def batches(self, batch_size: int, drop_last: bool) -> int:
        n = len(self)
        return n // batch_size if drop_last else -(-n // batch_size)

    def rest(self, done: int) -> Lane:
        """This lane without its first ``done`` records."""
        if self.mix is None:
            return Lane([cut_pieces(self.pieces[0], done, len(self) - done)])
        taken = np.bincount(self.mix[:done], minlength=len(self.pieces))
        pieces = [
            cut_pieces(p, int(t), sum(len(x) for x in p) - int(t))
            for p, t in zip(self.pieces, taken, strict=True)
        ]
        return Lane(pieces, self.mix[done:])


def batches_taken(batch_counts: Sequence[int], taken: int) -> list[int]:
    """Batches a DataLoader took from each worker once it had handed out ``taken``: it asks
    the workers in turn, passing over those with no batch left."""
    counts = np.asarray(batch_counts, np.int64)
    rounds = 0  # full rounds: the largest r with sum(min(count, r)) <= taken
    lo, hi = 0, int(counts.max(initial=0))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(np.minimum(counts, mid).sum()) <= taken:
            lo = mid
        else:
            hi = mid - 1
    rounds = lo
    out = np.minimum(counts, rounds)
    extra = taken - int(out.sum())
    for w in np.flatnonzero(counts > rounds)[:extra]:
        out[w] += 1
    return [int(x) for x in out]


class Planner:
    """The lanes of every epoch of one reader's stores, for any layout and resume.

    ``chunks``: each store's chunk spans; ``quotas``: the records each gives an epoch (a
    store read alone: all of them, so epoch e is its chunk order e); ``buffer_chunks``: the
    shuffle buffer, which the stores of a mixture share (``mixture.window_chunks``).
    """

    def __init__(
        self,
        chunks: Sequence[Sequence[plan.Span]],
        quotas: Sequence[int],
        *,
        seed: int,
        shuffle: bool,
        buffer_chunks: int,
        remainder: str,
    ) -> None:
        self.chunks = [list(c) for c in chunks]
        self.quotas = list(quotas)
        self.seed, self.shuffle = seed, shuffle
        self.remainder = remainder
        self.mixed = len(self.chunks) > 1
        # Each store's window, in chunks: a mixture's stores share the buffer.
        self.window_chunks = window_chunks(buffer_chunks, self.quotas)

    def segment(self, source: int, epoch: int) -> list[plan.Span]:
        """Store ``source``'s records in ``epoch``, in the epoch's chunk order (every rank's)."""
        quota = self.quotas[source]
        return source_segment(
            self.chunks[source],
            quota,
            epoch * quota,
            seed=self.seed,
            shuffle=self.shuffle,
            source=source if self.mixed else None,
        )

    def first_lane(self, epoch: int, layout: Layout, rank: int, worker: int) -> Lane:
        """Lane (rank, worker) of ``epoch`` read from its start in ``layout``."""
        world, workers = layout.world_size, layout.workers
        pieces = []
        for source in range(len(self.chunks)):
            mine = plan.take_share(self.segment(source, epoch), rank, world, self.remainder)
            part = plan.take_share(mine, worker, workers, "uneven")
            stream = (self.seed, epoch, rank, world, worker, workers)
            extra = (source,) if self.mixed else ()
            pieces.append(
                [
                    Piece(
                        tuple(spans),
                        (*stream, *extra, index) if self.shuffle else None,
                        ((0, sum(len(s) for s in spans)),),
                        opens=index == 0,
                    )
                    for index, spans in enumerate(plan.windows(part, self.window_chunks[source]))
                ]
            )
        return self._mixed(pieces, (epoch, 0, rank * workers + worker))

    def _mixed(self, pieces: list[list[Piece]], key: tuple[int, ...]) -> Lane:
        if not self.mixed:
            return Lane(pieces)
        counts = [sum(len(p) for p in source) for source in pieces]
        return Lane(pieces, mix_order(counts, (self.seed, *key)))

    def lanes(self, epoch: int, phases: Sequence[Phase], layout: Layout) -> list[Lane]:
        """Every lane of ``epoch`` for ``layout``, after the ``phases`` already read, in
        lane order (rank by rank, worker by worker)."""
        return self.replay(epoch, phases, layout)[0]

    def replay(self, epoch: int, phases: Sequence[Phase], layout: Layout) -> tuple[list[Lane], int]:
        """``lanes``, and the records the phases used up in all.

        Raises:
            ValueError: a phase took more batches than its ranks had.
        """
        first = phases[0].layout if phases else layout
        lanes = [
            self.first_lane(epoch, first, rank, worker)
            for rank in range(first.world_size)
            for worker in range(first.workers)
        ]
        used = 0
        for number, phase in enumerate(phases):
            done = self.consumed(lanes, phase)
            used += sum(done)
            lanes = [lane.rest(d) for lane, d in zip(lanes, done, strict=True)]
            after = phases[number + 1].layout if number + 1 < len(phases) else layout
            same = (after.world_size, after.workers) == (
                phase.layout.world_size,
                phase.layout.workers,
            )
            if not same:
                lanes = self.split(lanes, after, (epoch, number + 1))
        return lanes, used

    def lane(
        self, epoch: int, phases: Sequence[Phase], layout: Layout, rank: int, worker: int
    ) -> Lane:
        """Lane (rank, worker) of ``lanes``; a fresh epoch is planned for it alone."""
        if not phases:
            return self.first_lane(epoch, layout, rank, worker)
        return self.lanes(epoch, phases, layout)[rank * layout.workers + worker]

    @staticmethod
    def consumed(lanes: Sequence[Lane], phase: Phase) -> list[int]:
        """Records of each lane used up by ``phase``: yielded, or left out of its rank's last
        batch by drop_last once it had taken all its batches.

        Raises:
            ValueError: the phase took more batches than a rank had.
        """
        layout = phase.layout
        out: list[int] = []
        for rank in range(layout.world_size):
            own = lanes[rank * layout.workers : (rank + 1) * layout.workers]
            counts = [lane.batches(layout.batch_size, layout.drop_last) for lane in own]
            if phase.batches > sum(counts):
                raise ValueError(
                    f"{phase.batches} batches of {layout.batch_size} taken by rank {rank} of "
                    f"{layout.world_size}, which had {sum(counts)} left"
                )
            taken = batches_taken(counts, phase.batches)
            for lane, count, took in zip(own, counts, taken, strict=True):
                out.append(len(lane) if took == count else took * layout.batch_size)
        return out

    def split(self, lanes: Sequence[Lane], layout: Layout, key: tuple[int, ...]) -> list[Lane]:
        """What is left of ``lanes``, joined in lane order, shared out afresh in ``layout``."""
        left = [
            joined([p for lane in lanes for p in lane.pieces[s]]) for s in range(len(self.chunks))
        ]
        out = []
        for rank in range(layout.world_size):
            for worker in range(layout.workers):
                pieces = []
                for source in left:
                    mine = _share(source, rank, layout.world_size, self.remainder)
                    pieces.append(joined(_share(mine, worker, layout.workers, "uneven")))
                out.append(self._mixed(pieces, (*key, rank * layout.workers + worker)))
        return out


def _share(pieces: Sequence[Piece], part: int, parts: int, remainder: str) -> list[Piece]:
    total = sum(len(p) for p in pieces)
    begin, end = plan.share_bounds(total, part, parts, remainder)
    out: list[Piece] = []
    while begin < end:  # "pad" wraps round to the start
        start = begin % total
        count = min(end - begin, total - start)
        out += cut_pieces(pieces, start, count)
        begin += count
    return out
