"""Slots of shared memory between the reader's process and its decode workers, both ways:

    reader's process --Outbox: a part's encoded payloads--> worker
    worker --BatchArea: the part's decoded pixels, in place in its batch--> training loop
    worker --Landing: the part's decoded pixels (where the batch has no block)--> reader

Bytes in a slot do not go through a pipe: there they were pickled, written, read and
unpickled, and the reader's one process did its side of that for every worker, under its GIL.
Each area is mapped anonymous and shared before the workers are forked, so nothing outlives
the processes that map it (nothing to unlink after a kill). ``taken`` marks the slots in use;
slots are taken lowest first, so only as many as are busy at once are ever touched. Whatever
finds no slot free, or does not fit one, takes the pipe.
"""

from __future__ import annotations

import math
import mmap
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.reading.batch_memory import BatchRows, lend, lies_in

__all__ = ["BatchArea", "InPlace", "Landing", "Landed", "Outbox", "Sent"]

# How long a process waits for the slots' lock before it takes the pipe instead: the lock is
# held for a moment only, unless by a worker killed while it held it.
_LOCK_WAIT_S = 1.0


class _Slots:
    """``slots`` slots of ``slot_bytes`` in an area every forked process shares."""

    def __init__(self, slots: int, slot_bytes: int, context: Any) -> None:
        self.slot_bytes = slot_bytes
        self.area = mmap.mmap(-1, slots * slot_bytes)
        self.taken = context.Array("B", slots)  # with a lock the processes share

    def _claim(self, nbytes: int) -> int | None:
        """A free slot for ``nbytes``, now taken; None if none is free or they do not fit."""
        if nbytes > self.slot_bytes:
            return None
        lock = self.taken.get_lock()
        if not lock.acquire(timeout=_LOCK_WAIT_S):
            return None
        try:
            free = bytes(self.taken[:]).find(0)
            if free >= 0:
                self.taken[free] = 1
        finally:
            lock.release()
        return free if free >= 0 else None

    def release(self, slot: int) -> None:
        """Free ``slot``. Without the lock, which a killed worker may hold: one byte, and only
        a process looking for a free slot reads it."""
        self.taken.get_obj()[slot] = 0

    def _bytes(self, slot: int, nbytes: int) -> np.ndarray:
        return np.frombuffer(self.area, np.uint8, nbytes, slot * self.slot_bytes)


@dataclass(frozen=True)
class Landed:
    """Where a part's pixels wait: what travels through the pipe in their place."""

    slot: int
    shape: tuple[int, ...]
    dtype: str


class Landing(_Slots):
    """Workers write a finished part's pixels here; the reader's process copies them out."""

    landed = 0  # parts taken, counted in the reader's process

    def put(self, images: np.ndarray) -> Landed | None:
        """In a worker: ``images`` written to a free slot, or None (the pipe takes them)."""
        if not images.flags.c_contiguous or images.dtype.hasobject:
            return None
        slot = self._claim(images.nbytes)
        if slot is None:
            return None
        self._bytes(slot, images.nbytes)[:] = images.reshape(-1).view(np.uint8)
        return Landed(slot, images.shape, images.dtype.str)

    def take(self, landed: Landed, rows: BatchRows | None = None, at: int = 0) -> np.ndarray:
        """In the reader's process: the pixels copied out of their slot, which is then free:
        to ``rows`` from row ``at`` on where they fit there, else to an array of their own."""
        dtype = np.dtype(landed.dtype)
        count = math.prod(landed.shape)
        view = np.frombuffer(self.area, dtype, count, landed.slot * self.slot_bytes)
        view = view.reshape(landed.shape)
        images = rows.put(at, view) if rows is not None else None
        if images is None:
            images = view.copy()
        self.release(landed.slot)
        self.landed += 1
        return images


@dataclass(frozen=True)
class Sent:
    """Where a part's payloads wait, back to back: what travels through the pipe in their
    place (``ends``: where each payload ends in the slot)."""

    slot: int
    ends: tuple[int, ...]


class Outbox(_Slots):
    """The reader's process writes a part's encoded payloads here; a worker decodes them
    where they lie, and frees the slot once the part is finished."""

    sent = 0  # parts sent, counted in the reader's process

    def send(self, payloads: Sequence[bytes | memoryview]) -> Sent | None:
        """In the reader's process: ``payloads`` written to a free slot, or None (the pipe
        takes them)."""
        ends = np.cumsum([len(p) for p in payloads]).tolist()
        slot = self._claim(ends[-1] if ends else 0)
        if slot is None:
            return None
        view, start = memoryview(self.area), slot * self.slot_bytes
        for payload, end in zip(payloads, ends, strict=True):
            view[start + end - len(payload) : start + end] = payload
        self.sent += 1
        return Sent(slot, tuple(ends))

    def received(self, sent: Sent) -> list[bytes | memoryview]:
        """In a worker: the payloads, views of the slot (valid until it is released)."""
        view, start = memoryview(self.area), sent.slot * self.slot_bytes
        bounds = zip((0, *sent.ends[:-1]), sent.ends)
        return [view[start + a : start + z] for a, z in bounds]

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array`` lies in this area (a view of a payload, not a copy)."""
        return lies_in(array, self.area)


@dataclass(frozen=True)
class InPlace:
    """A part's pixels, written by its worker straight to their rows of the batch's block."""

    shape: tuple[int, ...]
    dtype: str


class BatchArea:
    """Blocks of one area shared with the workers, each lent to a batch whose images have a
    size known in advance: its workers write their parts' pixels straight to their rows, and
    the batch the training loop gets is the block itself, nothing copied in the reader's
    process. Lent as BatchMemory lends (a ctypes buffer every view of the batch holds on to),
    back once the last view is gone; lent and given back in the reader's process only. A
    running part keeps its batch's block (its future's callback holds the batch's rows), so a
    block is never lent again while a worker may still write to it."""

    def __init__(self, blocks: int, block_bytes: int) -> None:
        self.block_bytes = block_bytes
        self.area = mmap.mmap(-1, blocks * block_bytes)
        self._free: deque[int] = deque(range(blocks - 1, -1, -1))  # the lowest lent first
        self.placed = 0  # parts written in place, counted in the reader's process

    def lend(self) -> tuple[int, Any] | None:
        """A free block: its offset in the area, and the buffer lent; None if none is free."""
        try:
            number = self._free.pop()  # the last given back: its pages are likely mapped
        except IndexError:
            return None
        offset = number * self.block_bytes
        return offset, lend(self.area, offset, self.block_bytes, self._free.append, number)

    def write(self, offset: int, images: list[np.ndarray]) -> InPlace:
        """In a worker: ``images``, one shape, stacked straight to the area at ``offset``."""
        first = images[0]
        shape = (len(images), *first.shape)
        out = np.frombuffer(self.area, first.dtype, math.prod(shape), offset).reshape(shape)
        np.stack(images, out=out)
        return InPlace(shape, first.dtype.str)
