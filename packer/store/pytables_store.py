"""Stores made by others: a plain HDF5 file with an image array and a label array.

Many training scripts write their data set as PyTables EArrays, ``/samples`` of shape
(N, H, W, 3) uint8 and ``/labels`` of shape (N,), appended batch by batch. packer reads such a
file as a one-shard raw store, through PyTables, which reads a row range of an EArray straight
into a caller's buffer. Nothing is written to the file; it has no per-record checksums.
"""

from __future__ import annotations

import os
import pickletools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import tables

from packer.store.base import Fetched, check_range
from packer.store.record import Block, Record

__all__ = ["find_arrays", "describe_file", "PyTablesShardReader"]


@contextmanager
def _as_os_error(path: Path) -> Iterator[None]:
    """PyTables' own errors (a damaged chunk, a filter it lacks, such as h5py's lzf) raised as
    OSError naming the file: what every shard reader raises, so that callers need not know
    PyTables, nor import it, to catch them."""
    try:
        yield
    except tables.HDF5ExtError as e:
        raise OSError(f"{path}: {e}") from e


def find_arrays(
    path: Path, images: str | None = None, labels: str | None = None
) -> tuple[str, str | None]:
    """The node paths of the image array and the label array in ``path``.

    Named ones are checked; otherwise the only uint8 array of rank 3 or 4 is the images, and
    the only integer array of rank 1 or 2 with as many rows is the labels (none is fine).
    Raises ValueError saying what was found when the choice is not clear.
    """
    with _open_file(path) as f, _as_os_error(path):
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
        row = int(np.prod(arrays[images].shape[1:], dtype=object))
        if row > _MAX_ROW_BYTES:
            raise ValueError(f"{path}: {images} has images of {row:,} bytes each")
        return images, labels


_MAX_ROW_BYTES = 1 << 30  # one image; Pillow's own limit is 716 MB (4 channels)


# Pickle opcodes that reach a callable: without them, unpickling builds only plain values.
_CODE_OPCODES = {
    "GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD",
    "EXT1", "EXT2", "EXT4", "PERSID", "BINPERSID",
}  # fmt: skip


def _open_file(path: Path) -> tables.File:
    """``tables.open_file``, once the file is known not to run code when opened.

    PyTables reads every attribute of every node it loads, and unpickles any byte string
    ending in "." (tables/attributeset.py): a file from others could run code just by being
    opened. So every attribute is read first with h5py, which never unpickles, and a file
    holding a pickle that would call anything is refused (ValueError); so is one with a
    dataset that claims more bytes than the file can hold.
    """

    def check(name: str, node: Any) -> None:
        for key in node.attrs:
            try:
                value = node.attrs[key]
            except Exception as e:  # noqa: BLE001 - unreadable here: PyTables must not try
                raise ValueError(f"{path}: attribute {key!r} of /{name} cannot be read: {e}") from e
            if isinstance(value, bytes) and _calls_code(value):
                raise ValueError(
                    f"{path}: attribute {key!r} of /{name} is a pickle that would run code "
                    "if PyTables opened the file; packer does not open it"
                )
        if isinstance(node, h5py.Dataset):
            _refuse_bomb(path, name, node)

    with h5py.File(path, "r", locking=False) as f:
        check("", f)
        f.visititems(check)
    with _as_os_error(path):
        return tables.open_file(str(path), "r")


def _refuse_bomb(path: Path, name: str, dataset: h5py.Dataset) -> None:
    """Refuse (ValueError) a dataset that claims more bytes than the file can hold: HDF5 reads
    chunks never written as fill values, so a few-KB file could ask for terabytes. Filtered
    (compressed), it may claim 1032 times the file: deflate's best; lzf's is lower."""
    if dataset.shape is None:  # an empty dataset (h5py.Empty)
        return
    size = int(np.prod(dataset.shape, dtype=object)) * dataset.dtype.itemsize
    filtered = dataset.id.get_create_plist().get_nfilters() > 0
    file_bytes = path.stat().st_size
    if size > file_bytes * (1032 if filtered else 1):
        raise ValueError(
            f"{path}: /{name} {dataset.shape} {dataset.dtype} claims {size:,} bytes, "
            f"which a {file_bytes:,}-byte file cannot hold"
        )


def _calls_code(data: bytes) -> bool:
    """Whether unpickling ``data`` would reach a callable (pickletools parses, never runs)."""
    try:
        for op, _, _ in pickletools.genops(data):
            if op.name in _CODE_OPCODES:
                return True
    except Exception:  # noqa: BLE001 - a broken stream: unpickling stops where parsing does
        pass
    return False


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
        self._file = _open_file(path)
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
        with _as_os_error(self.path):
            return np.asarray(self._labels.read(), dtype=np.int64).reshape(self._len, -1)

    def extents(self, start: int, stop: int) -> list[tuple[int, int]]:
        return []  # a file made by others: PyTables reads it its own way

    def index_extents(self) -> list[tuple[int, int]]:
        return []

    def read_block(
        self,
        start: int,
        stop: int,
        out: np.ndarray | None = None,
        fetched: Fetched | None = None,
    ) -> Block:
        check_range(start, stop, self._len)
        n = stop - start
        data = out[:n] if out is not None else np.empty((n, *self.shape), np.uint8)
        with _as_os_error(self.path):
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
    """What a manifest would say about ``path``, for packer.store.access to build one from."""
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
