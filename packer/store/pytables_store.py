"""Stores made by others: a plain HDF5 file with an image array and a label array.

Many training scripts write their data set as PyTables EArrays, ``/samples`` of shape
(N, H, W, 3) uint8 and ``/labels`` of shape (N,), appended batch by batch. packer reads such a
file as a one-shard raw store, through PyTables, which reads a row range of an EArray straight
into a caller's buffer. Nothing is written to the file; it has no per-record checksums.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import tables

from packer.record import Block, Record

__all__ = ["find_arrays", "describe_file", "PyTablesShardReader"]


def find_arrays(
    path: Path, images: str | None = None, labels: str | None = None
) -> tuple[str, str | None]:
    """The node paths of the image array and the label array in ``path``.

    Named ones are checked; otherwise the only uint8 array of rank 3 or 4 is the images, and
    the only integer array of rank 1 or 2 with as many rows is the labels (none is fine).
    Raises ValueError saying what was found when the choice is not clear.
    """
    with tables.open_file(str(path), "r") as f:
        arrays = {n._v_pathname: n for n in f.walk_nodes("/", "Array")}
        described = ", ".join(
            f"{p} {tuple(int(d) for d in a.shape)} {a.dtype}" for p, a in arrays.items()
        )
        if images is None:
            candidates = [p for p, a in arrays.items() if a.dtype == np.uint8 and a.ndim in (3, 4)]
            if len(candidates) != 1:
                raise ValueError(
                    f"{path}: cannot tell which array holds the images ({described or 'no arrays'}); name it with images='/...'"
                )
            images = candidates[0]
        if (
            images not in arrays
            or arrays[images].dtype != np.uint8
            or arrays[images].ndim not in (3, 4)
        ):
            raise ValueError(
                f"{path}: {images} is not a uint8 array of shape (N, H, W[, C]) ({described})"
            )
        rows = arrays[images].shape[0]
        if labels is None:
            candidates = [p for p, a in arrays.items() if p != images and _label_array(a, rows)]
            if len(candidates) > 1:
                raise ValueError(
                    f"{path}: several arrays could be the labels ({', '.join(candidates)}); "
                    "name one with labels='/...'"
                )
            labels = candidates[0] if candidates else None
        elif not _label_array(arrays.get(labels), rows):
            raise ValueError(
                f"{path}: {labels} is not an integer array of shape ({rows},) or ({rows}, K) "
                f"({described})"
            )
        return images, labels


def _label_array(array: Any, rows: int) -> bool:
    return (
        array is not None
        and array.dtype.kind in "iu"
        and array.ndim in (1, 2)
        and array.shape[0] == rows
    )


class PyTablesShardReader:
    """The whole file as one shard of raw records, read with PyTables (open per process)."""

    def __init__(self, path: Path, images: str, labels: str | None) -> None:
        self.path = path
        self._pid = os.getpid()
        self._file = tables.open_file(str(path), "r")
        self._images = self._file.get_node(images)
        self._labels = self._file.get_node(labels) if labels else None
        self._len = int(self._images.shape[0])
        h, w = int(self._images.shape[1]), int(self._images.shape[2])
        self.shape = (h, w, int(self._images.shape[3]) if self._images.ndim == 4 else 1)
        columns = (
            0
            if self._labels is None
            else (1 if self._labels.ndim == 1 else int(self._labels.shape[1]))
        )
        self.meta: dict[str, Any] = {
            "num_records": self._len,
            "num_label_columns": columns,
            "raw_shape": list(self.shape),
        }

    def __len__(self) -> int:
        return self._len

    def read_labels(self) -> np.ndarray:
        """Every label, (N, columns): small enough to read whole."""
        if self._labels is None:
            return np.zeros((self._len, 0), np.int64)
        return np.asarray(self._labels.read(), dtype=np.int64).reshape(self._len, -1)

    def read_block(self, start: int, stop: int, out: np.ndarray | None = None) -> Block:
        if not 0 <= start <= stop <= self._len:
            raise IndexError(f"records {start}:{stop} out of range for {self._len} records")
        n = stop - start
        data = out[:n] if out is not None else np.empty((n, *self.shape), np.uint8)
        if n:  # straight into the buffer: one copy from the file
            self._images.read(start, stop, out=data.reshape(n, *self._images.shape[1:]))
        labels = (
            np.zeros((n, 0), np.int64)
            if self._labels is None
            else np.asarray(self._labels.read(start, stop), dtype=np.int64).reshape(n, -1)
        )
        return Block(
            data=data,
            labels=labels,
            paths=[f"{self._images._v_pathname}[{i}]" for i in range(start, stop)],
            crc32=np.zeros(n, np.uint32),  # the file keeps none; readers skip the check
            shapes=np.tile(np.array(self.shape, np.int32), (n, 1)),
            formats=["raw"] * n,
        )

    def read_record(self, index: int) -> Record:
        return self.read_block(index, index + 1).record(0)

    def close(self) -> None:
        if os.getpid() == self._pid:
            self._file.close()


def describe_file(
    path: Path, images: str | None = None, labels: str | None = None
) -> dict[str, Any]:
    """What a manifest would say about ``path``, for packer.access to build one from."""
    images, labels = find_arrays(path, images, labels)
    reader = PyTablesShardReader(path, images, labels)
    try:
        label_rows = reader.read_labels()
        counts = [
            {str(int(v)): int(c) for v, c in zip(*np.unique(label_rows[:, k], return_counts=True))}
            for k in range(label_rows.shape[1])
        ]
        return {
            "images": images,
            "labels": labels,
            "num_records": len(reader),
            "shape": list(reader.shape),
            "label_columns": label_rows.shape[1],
            "label_counts": counts,
        }
    finally:
        reader.close()
