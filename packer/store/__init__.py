"""Stores: what is on disk and how it is read back.

    record (one record's bytes) -> base (the shard interface) -> lmdb_store, hdf5_store,
    pytables_store (the backends) -> manifest (the table of contents, written last)
    -> access (``open_store``: random access) -> verify (every record checked)

staging is where a pack or a conversion writes until the rename that finishes a store. This
module names the backends: adding one means adding one module and one line here."""

from __future__ import annotations

import errno
import shutil
from collections.abc import Callable
from pathlib import Path

from packer.store.base import ShardMeta, ShardReader, ShardWriter
from packer.store.hdf5_store import Hdf5ShardReader, Hdf5ShardWriter
from packer.store.lmdb_store import LmdbShardReader, LmdbShardWriter

__all__ = [
    "BACKENDS",
    "SUFFIXES",
    "ShardMeta",
    "ShardReader",
    "ShardWriter",
    "backend_for_path",
    "open_shard_writer",
    "open_shard_reader",
    "shard_name",
]

_WRITERS: dict[str, Callable[..., ShardWriter]] = {"lmdb": LmdbShardWriter, "hdf5": Hdf5ShardWriter}
_READERS: dict[str, Callable[[Path], ShardReader]] = {
    "lmdb": LmdbShardReader,
    "hdf5": Hdf5ShardReader,
}
BACKENDS = tuple(_WRITERS)
SUFFIXES = {"lmdb": ".lmdb", "hdf5": ".h5"}
_BACKEND_OF_SUFFIX = {".lmdb": "lmdb", ".mdb": "lmdb", ".h5": "hdf5", ".hdf5": "hdf5"}


def backend_for_path(path: Path | str) -> str | None:
    """The backend a store path asks for by its suffix (out.lmdb, out.h5), or None."""
    return _BACKEND_OF_SUFFIX.get(Path(path).suffix.lower())


def shard_name(backend: str, index: int) -> str:
    return f"shard-{index:05d}{SUFFIXES[backend]}"


def open_shard_writer(
    backend: str, path: Path, meta: ShardMeta, expected_bytes: int = 0, **options: int
) -> ShardWriter:
    """A writer for a new shard of about ``expected_bytes`` (0: unknown), which each backend
    sizes itself by. A disk that cannot take that much fails now, not an hour into the shard."""
    free = shutil.disk_usage(path.parent).free
    if free < expected_bytes:
        raise OSError(
            errno.ENOSPC,
            f"No space left on device: the next shard needs about {expected_bytes:,} bytes",
        )
    return _WRITERS[backend](path, meta, expected_bytes, **options)


def open_shard_reader(backend: str, path: Path) -> ShardReader:
    return _READERS[backend](path)
