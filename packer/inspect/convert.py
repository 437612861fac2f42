"""The same records in the other backend (LMDB <-> HDF5), nothing decoded or re-encoded:
payloads, labels, paths, checksums, order and shard boundaries carried across."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packer.about import __version__
from packer.arguments import CountProgress, parse_size
from packer.errors import (
    CorruptRecordError,
    UsageError,
)
from packer.store import BACKENDS, ShardMeta, backend_for_path, open_shard_writer, shard_name
from packer.store.access import Store
from packer.store.manifest import Manifest, ShardInfo, Storage
from packer.store.record import Record
from packer.store.staging import Staging

__all__ = ["convert_store"]


def convert_store(
    src: Path | str,
    dest: Path | str,
    *,
    backend: str | None = None,
    overwrite: bool = False,
    shard_size: int | str | None = None,
    progress: CountProgress | None = None,
) -> Manifest:
    """Copy the store ``src`` into a new store ``dest`` of another backend (LMDB <-> HDF5), or
    of the same backend with new shards.

    Nothing is decoded or re-encoded: each record's payload bytes, labels, path, CRC-32,
    shape and format are copied as they are, in the same order. By default each source shard
    becomes one target shard, so record i keeps its (shard, offset); ``shard_size`` (bytes, or
    a string like "1GB") re-cuts the shards by payload bytes, as ``pack`` plans them. Each
    record's CRC is checked on the way. A raw store of one fixed shape becomes one N×H×W×C
    ``images`` dataset per HDF5 shard.

    ``backend`` defaults to the one ``dest``'s suffix names (``.lmdb``, ``.h5``). ``dest`` is
    written as ``pack`` writes: into ``dest.partial``, renamed when complete, removed on an
    error or Ctrl-C; an existing ``dest`` is replaced only with ``overwrite`` (and only if it
    is a packer store). The new manifest keeps the source's labels, classes, seed, storage,
    stats, skipped files, options and source, with the new backend and shards, and says in
    ``options["converted_from"]`` which store and backend it came from.

    Raises:
        UsageError: no backend given or implied, an unknown one, ``dest`` is ``src``.
        StoreExistsError: ``dest`` exists and not ``overwrite``.
        CorruptRecordError: a damaged record in ``src``; StoreError: ``dest`` cannot be written.
        PackInterrupted: Ctrl-C. In every case nothing is left at ``dest`` or ``dest.partial``.
    """
    src, dest = Path(src), Path(dest)
    backend = backend or backend_for_path(dest)
    if backend is None:
        raise UsageError(
            f"{dest}: cannot tell the backend from the name; end it in .lmdb or .h5, "
            "or name the backend"
        )
    if backend not in BACKENDS:
        raise UsageError(f"backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    if isinstance(shard_size, str):
        shard_size = parse_size(shard_size)
    if shard_size is not None and shard_size < 1:
        raise UsageError(f"shard size must be at least 1 byte, not {shard_size}")
    resolved, home = dest.resolve(), src.resolve()
    if resolved == home or resolved.is_relative_to(home) or home.is_relative_to(resolved):
        raise UsageError(f"{dest} and {src} overlap; convert into a path of its own")
    with Store(src) as store:
        store.require_packer_store("convert")
        staging = Staging(dest, overwrite)

        def make(folder: Path) -> Manifest:
            shards = _copy_shards(store, backend, folder, shard_size, progress)
            return _converted_manifest(store, backend, shards, shard_size)

        return staging.build(make, "convert")


def _target_storage(store: Store, backend: str) -> Storage:
    # Compression is an HDF5 filter: kept from an HDF5 source, meaningless in LMDB.
    compression = store.manifest.storage.compression if backend == "hdf5" else None
    return replace(store.manifest.storage, compression=compression)


def _copy_shards(
    store: Store,
    backend: str,
    folder: Path,
    shard_size: int | None,
    progress: CountProgress | None,
) -> list[ShardInfo]:
    manifest = store.manifest
    storage = _target_storage(store, backend)
    raw_shape = _raw_shape(storage)
    columns = len(manifest.label_columns)
    source_bytes = [_file_size(store.path / s.file) for s in manifest.shards]
    total, done = manifest.num_records, 0
    sink = _Sink(backend, folder, columns, raw_shape, storage, manifest.label_columns)

    def copy(index: int, record: Record) -> None:
        nonlocal done
        reason = None
        if len(record.labels) != columns:
            reason = f"{len(record.labels)} labels, the store has {columns} label columns"
        elif raw_shape is not None and list(record.shape) != raw_shape:
            reason = f"shape {list(record.shape)}, the store says every record is {raw_shape}"
        if reason is not None:
            shard = manifest.shards[store.locate(index)[0]].file
            raise CorruptRecordError(str(store.path), shard, index, record.path, reason)
        sink.append(record)
        done += 1
        if progress is not None:
            progress(done, total)

    try:
        if shard_size is None:  # one target shard per source shard: the same boundaries
            for number in range(len(manifest.shards)):
                sink.open(source_bytes[number])
                for index, record in store.indexed_records(number):
                    copy(index, record)
                sink.close()
        else:  # runs of about shard_size payload bytes, the rule of pack.plan_shards
            expected = min(shard_size, sum(source_bytes))
            sink.open(expected)
            for index, record in store.indexed_records():
                if sink.filled and sink.filled + len(record.data) > shard_size:
                    sink.close()
                    sink.open(expected)
                copy(index, record)
            sink.close()
        return sink.infos()
    finally:
        sink.abort()


def _file_size(path: Path) -> int:
    """For sizing the target shard only; a missing file is reported when it is opened."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


class _Sink:
    """Target shards, one open at a time; a closed shard is hashed while the next is written."""

    def __init__(
        self,
        backend: str,
        folder: Path,
        columns: int,
        raw_shape: list[int] | None,
        storage: Storage,
        label_columns: list[dict[str, Any]],
    ) -> None:
        self.backend, self.folder = backend, folder
        self.columns, self.raw_shape, self.storage = columns, raw_shape, storage
        self.label_columns = label_columns
        self.hasher = ThreadPoolExecutor(1, thread_name_prefix="packer-hash")
        self.hashes: list[Future[ShardInfo]] = []
        self.writer: Any = None
        self.path: Path | None = None
        self.count = self.filled = 0

    def open(self, expected: int) -> None:
        index = len(self.hashes)
        self.path = self.folder / shard_name(self.backend, index)
        meta = ShardMeta.of_store(
            index, self.backend, self.storage, self.label_columns, self.raw_shape
        )
        self.writer = open_shard_writer(self.backend, self.path, meta, expected)
        self.count = self.filled = 0

    def append(self, record: Record) -> None:
        self.writer.append(record)
        self.count += 1
        self.filled += len(record.data)

    def close(self) -> None:
        self.writer.close()  # if this fails, abort() releases the writer
        self.writer = None
        assert self.path is not None
        self.hashes.append(
            self.hasher.submit(ShardInfo.of_file, self.path, self.count, self.filled)
        )

    def infos(self) -> list[ShardInfo]:
        return [h.result() for h in self.hashes]

    def abort(self) -> None:
        """Release an unfinished writer (after an error) and the hashing thread."""
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.abort()
        self.hasher.shutdown(wait=True, cancel_futures=True)


def _raw_shape(storage: Storage) -> list[int] | None:
    """[h, w, c] when every record is raw pixels of that one shape."""
    return list(storage.shape) if storage.payload == "raw" and storage.shape is not None else None


def _converted_manifest(
    store: Store, backend: str, shards: list[ShardInfo], shard_size: int | None
) -> Manifest:
    m = store.manifest
    storage = _target_storage(store, backend)
    origin: dict[str, Any] = {
        "store": str(store.path.resolve()),
        "backend": m.backend,
        "shards": len(m.shards),
        "packer_version": m.packer_version,
        "created": m.created,
    }
    if m.options.get("converted_from"):
        origin["converted_from"] = m.options["converted_from"]  # the whole lineage
    options = {**m.options, "backend": backend, "compression": storage.compression}
    if shard_size is not None:  # the shards were cut anew
        options.update(shard_size=shard_size, shards=None)
    options["converted_from"] = origin
    return Manifest(
        backend=backend,
        num_records=sum(s.num_records for s in shards),
        shards=shards,
        storage=storage,
        label_source=m.label_source,
        label_columns=m.label_columns,
        seed=m.seed,
        shuffled=m.shuffled,
        packer_version=__version__,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        options=options,
        stats=m.stats,
        skipped=m.skipped,
        source=m.source,
    )
