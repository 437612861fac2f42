"""One store's part of a lane, read window by window and gathered batch by batch.

    pieces (packer.reading.lanes) -> read_window (sequential reads, raw pixels checked)
      -> Ordered (the window in yield order) -> take / stored (the next n records)

The producer (packer.reading.produce) holds a Cursor per store of a lane and asks each for
its records of every batch, in turn.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from functools import partial

import numpy as np

from packer.reading import epoch as plan
from packer.reading.batching import Batch, Ordered, Window, concat, read_window
from packer.reading.lanes import Piece
from packer.reading.readahead import ReadAhead
from packer.store.access import Store
from packer.store.base import Fetched

__all__ = ["Cursor"]


class Cursor:
    """One store's part of a lane, window by window: ``take(n)`` gathers its next n records.

    Batches are gathered copies, so a window's array is free to reuse once the next window
    is due, and from one epoch to the next: a new one would be page-faulted afresh, a cost
    beside raw pixels' own copies. Reused whole (its base): windows differ in length by a few
    records, and a slice of the last one would soon be too short.
    """

    def __init__(
        self,
        store: Store,
        pieces: list[Piece],
        fixed: tuple[int, ...] | None,
        verify: bool,
        ahead: ReadAhead | None,
        array: np.ndarray | None,
    ) -> None:
        self.store, self.pieces, self.fixed, self.verify = store, pieces, fixed, verify
        self.ahead, self.array = ahead, array
        self.window: Ordered | None = None
        self.at = 0
        self._windows = self._read_windows()

    def take(self, n: int, into: np.ndarray | None) -> Window:
        """The next ``n`` records; ``into``: rows of a batch array to gather raw pixels into."""
        parts: list[Window] = []
        got = 0
        while got < n:
            window = self._current()
            k = min(n - got, len(window) - self.at)
            rows = into[got : got + k] if into is not None else None
            parts.append(window.rows(self.at, self.at + k, rows))
            self.at += k
            got += k
        return concat(parts, into)

    def stored(self, n: int, into: np.ndarray) -> Batch | None:
        """The next ``n`` records as a finished batch, their pixels gathered into ``into``,
        where they lie in one clean window (``Ordered.stored``); else None, and ``take``
        has them. Only a batch that crosses into the next window, or a window with a
        damaged record, goes the long way."""
        window, at = self._current(), self.at
        if not window.clean or at + n > len(window):
            return None
        self.at = at + n
        return window.stored(at, at + n, into)

    def _current(self) -> Ordered:
        """The window the next record is in, read once the last one is used up."""
        while self.window is None or self.at == len(self.window):
            self.window = None  # one window alive at a time, not two
            self.window, self.at = next(self._windows), 0
        return self.window

    def _read_windows(self) -> Generator[Ordered, None, None]:
        """The pieces' windows in turn. One whose order opens as it is read (Piece.opens),
        read from the disk (``ahead``), comes a part at a time as its spans are read."""
        first = 0  # spans read so far: where the read-ahead stands
        for piece in self.pieces:
            if piece.opens and self.ahead is not None and len(piece.spans) > 1:
                yield from self._opening(piece, first)
            else:
                window = self._read(piece.spans, first, self._array(piece.spans))
                ordered = Ordered(window, piece.positions())
                del window
                yield ordered
                del ordered
            first += len(piece.spans)

    def _opening(self, piece: Piece, first: int) -> Generator[Ordered, None, None]:
        """``piece``'s window read span by span, each time with the records of its order
        that lie in the spans read so far, up to the first that does not."""
        positions = piece.positions()
        ends = np.cumsum([len(s) for s in piece.spans])
        # the spans the order has reached by each record: all must be read before it goes
        reach = np.maximum.accumulate(np.searchsorted(ends, positions, side="right"))
        array = self._array(piece.spans)
        parts: list[Window] = []
        row = done = 0
        for k, span in enumerate(piece.spans):
            rows = array[row:] if array is not None else None
            parts.append(self._read([span], first + k, rows))
            row += len(span)
            ready = int(np.searchsorted(reach, k, side="right"))
            if ready > done:
                read = concat(parts, array[:row] if array is not None else None)
                yield Ordered(read, positions[done:ready])
                done = ready

    def _array(self, spans: Sequence[plan.Span]) -> np.ndarray | None:
        """The array raw pixels of one shape are read into: the last window's if it is
        large enough (a new one per window would be faulted in afresh)."""
        if self.fixed is None:
            return None
        total = sum(len(s) for s in spans)
        if self.array is None or len(self.array) < total:
            self.array = np.empty((total, *self.fixed), np.uint8)
        return self.array

    def _read(self, spans: Sequence[plan.Span], first: int, array: np.ndarray | None) -> Window:
        """``spans`` read into ``array`` (``first``: how many the read-ahead is past)."""
        fetched = partial(_take, self.ahead, first) if self.ahead is not None else None
        return read_window(self.store, spans, array, self.verify, fetched)

    def close(self) -> np.ndarray | None:
        """The window array, for the next epoch. The read-ahead is left running: it reads
        on into the next epoch, which stops it (Producer._read_ahead)."""
        self.window = None
        self._windows.close()
        return self.array


def _take(ahead: ReadAhead, first: int, k: int) -> Fetched | None:
    return ahead.take(first + k)
