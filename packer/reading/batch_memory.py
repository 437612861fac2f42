"""Memory for batch arrays, used again once nothing refers to a batch any more.

A new array as large as a batch is new memory to the kernel: it maps and zeroes each page as
the batch is first written, which costs the reader's process more than the copy that writes
it (benchmarks/bench_loader_cpu.py measures that process). An array from
``BatchMemory.empty`` is a view of memory the pool keeps, through a ctypes buffer that every
view of the array, NumPy's or torch's, holds on to; once the last of them is gone, the memory
goes back to the pool for a later batch. Nothing ever waits for memory: with none free, a new
array is made, and the pool keeps only a few free ones.
"""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["BatchMemory", "BatchRows", "lend", "lies_in"]


def lend(memory: Any, offset: int, nbytes: int, back: Callable[[Any], None], token: Any) -> Any:
    """``nbytes`` of ``memory`` from ``offset`` on, as a ctypes buffer that every NumPy view
    and torch tensor made of it holds on to: ``back(token)`` once the last of them is gone."""
    lent = (ctypes.c_uint8 * nbytes).from_buffer(memory, offset)
    weakref.finalize(lent, back, token).atexit = False
    return lent


def lies_in(array: np.ndarray, memory: Any) -> bool:
    """Whether ``array``'s first byte lies in the buffer ``memory`` (a view of it, not a copy)."""
    start = np.frombuffer(memory, np.uint8, 1).ctypes.data
    return bool(start <= array.ctypes.data < start + memoryview(memory).nbytes)


class _Block:
    """Memory the pool owns (a holder: the free list finds its blocks by identity)."""

    __slots__ = ("array",)

    def __init__(self, nbytes: int) -> None:
        self.array = np.empty(nbytes, np.uint8)


class BatchMemory:
    """Batch arrays from a pool of at most ``keep`` free blocks.

    Without locks: a block comes back from whichever thread drops the last view of it, and a
    deque's append and remove are each one step for the other threads (a block taken twice
    is found missing by the second and left to it)."""

    def __init__(self, keep: int) -> None:
        self._free: deque[_Block] = deque(maxlen=keep)

    def empty(self, shape: tuple[int, ...], dtype: Any = np.uint8) -> np.ndarray:
        """A new, uninitialised array, in a free block where one fits."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if not nbytes or dtype.hasobject:  # objects are references, not bytes to lend
            return np.empty(shape, dtype)
        block = self._take(nbytes) or _Block(nbytes)
        lent = lend(block.array, 0, nbytes, self._free.append, block)
        return np.frombuffer(lent, dtype).reshape(shape)

    def _take(self, nbytes: int) -> _Block | None:
        """A free block of ``nbytes`` to twice that (more would be memory held for little)."""
        for block in list(self._free):
            if nbytes <= len(block.array) <= 2 * nbytes:
                try:
                    self._free.remove(block)
                except ValueError:  # another thread took it first
                    continue
                return block
        return None

    def clear(self) -> None:
        """Let the free blocks go."""
        self._free.clear()

    @property
    def free(self) -> int:
        """Blocks free now."""
        return len(self._free)


class BatchRows:
    """One batch's array, which its parts' pixels are put in, each to its own rows, as they
    come back from the workers: joining the parts then copies nothing. Made once the first
    part's pixels give the shape of an image: in ``memory``, or in ``block``, a block of the
    shared batch area (packer.reading.shared_slots.BatchArea) lent to this batch, where the
    workers write rows of ``row_bytes`` straight to their place."""

    def __init__(
        self,
        records: int,
        memory: BatchMemory,
        block: Any = None,
        row_bytes: int = 0,
        offset: int = 0,
        area: Any = None,
    ) -> None:
        self.records, self.memory = records, memory
        # The block, the bytes of each of its rows, where it lies in the area, and the area.
        self.block, self.row_bytes, self.offset, self.area = block, row_bytes, offset, area
        self.array: np.ndarray | None = None
        self._lock = threading.Lock()  # parts settle in the pool's thread, or in the submitter's

    def _array(self, image: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The batch's array, made for images of shape ``image`` if it is not yet."""
        with self._lock:
            if self.array is None:
                shape = (self.records, *image)
                if self.block is not None and math.prod(image) * dtype.itemsize == self.row_bytes:
                    count = math.prod(shape)
                    self.array = np.frombuffer(self.block, dtype, count).reshape(shape)
                else:
                    self.array = self.memory.empty(shape, dtype)
            return self.array

    def put(self, at: int, images: np.ndarray) -> np.ndarray | None:
        """``images`` copied to rows ``at`` on; None where they do not fit there (another
        image shape than the parts before, or beyond the batch)."""
        rows = self._array(images.shape[1:], images.dtype)[at : at + len(images)]
        if rows.shape != images.shape or rows.dtype != images.dtype:
            return None
        rows[...] = images
        return rows

    def placed(self, at: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The rows from ``at`` on that a worker wrote in place in the block: images of
        ``shape`` (as its own copy where the batch's array was made otherwise)."""
        rows = self._array(shape[1:], dtype)[at : at + shape[0]]
        if rows.shape == shape and rows.dtype == dtype and lies_in(rows, self.block):
            return rows
        written = np.frombuffer(self.block, dtype, math.prod(shape), at * self.row_bytes)
        return written.reshape(shape).copy()

    def whole(self, arrays: list[np.ndarray]) -> np.ndarray | None:
        """The batch's array where ``arrays``, the parts' pixels in order, are its rows one
        after another from the first to the last (none skipped); else None."""
        array, at = self.array, 0
        if array is None:
            return None
        for images in arrays:
            if images.ctypes.data != array[at:].ctypes.data:  # not put in its place
                return None
            at += len(images)
        return array if at == self.records else None
