"""The manifest: a store's versioned, human-readable table of contents, written last.

A store is a folder holding ``manifest.json`` and its shard files. The manifest is the
commit record: it is written only after every shard is on disk, atomically, so a folder
without one is an unfinished pack, never a store.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packer.errors import IncompleteStoreError, ManifestError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ShardInfo",
    "Storage",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "fsync_dir",
]

FORMAT = "packer-store"
FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
_SHARD_NAME = re.compile(r"^shard-\d{5,}\.(lmdb|h5)$")
_MAX_RECORDS = 1 << 40  # far beyond any real store; guards allocations sized from the manifest


@dataclass
class ShardInfo:
    file: str  # file name inside the store folder
    num_records: int
    bytes: int  # size of the shard file
    sha256: str  # of the shard file
    payload_bytes: int  # sum of the records' payloads

    @classmethod
    def of_file(cls, path: Path, num_records: int, payload_bytes: int) -> ShardInfo:
        """Describe a finished shard file: its size and sha256, read in 4 MB pieces."""
        digest = hashlib.sha256()
        size = 0
        with open(path, "rb") as f:
            while chunk := f.read(4 << 20):
                digest.update(chunk)
                size += len(chunk)
        return cls(path.name, num_records, size, digest.hexdigest(), payload_bytes)


@dataclass
class Storage:
    """What a record's payload is, and how the pack made it."""

    payload: str  # "original" (source bytes untouched), "encoded" (re-encoded) or "raw" (pixels)
    mode: str  # colour policy the reader decodes to (or the pack decoded to): RGB, L, keep
    encoding: str | None = None  # jpeg / png / webp when payload == "encoded"
    quality: int | None = None
    max_side: int | None = None
    size: list[int] | None = None  # [height, width] for a fixed output size
    fit: str | None = None  # crop / pad / stretch, with size
    shape: list[int] | None = None  # [h, w, c] shared by every record (raw + fixed size)
    compression: str | None = None  # HDF5 dataset filter, if any
    checksums: bool = True  # records carry a CRC-32 (False only for stores made by others)


@dataclass
class Manifest:
    backend: str
    num_records: int
    shards: list[ShardInfo]
    storage: Storage
    label_source: str  # folders / csv / none
    label_columns: list[dict[str, Any]]  # [{"name": ..., "classes": [...] or None}]
    seed: int
    shuffled: bool
    packer_version: str
    created: str
    options: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    source: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def shard_starts(self) -> list[int]:
        """Global index of each shard's first record: record i lives in the last shard starting <= i."""
        starts, total = [], 0
        for shard in self.shards:
            starts.append(total)
            total += shard.num_records
        return starts

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        # The identifying fields first, so `head manifest.json` says what this is.
        head = {k: data.pop(k) for k in ("format", "format_version", "backend", "num_records")}
        return {**head, **data}


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write ``folder/manifest.json`` atomically: temp file, fsync, rename, fsync the folder."""
    target = folder / MANIFEST_NAME
    temp = folder / (MANIFEST_NAME + ".tmp")
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(manifest.to_json(), f, indent=1, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, target)
    fsync_dir(folder)


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_manifest(store: Path | str) -> Manifest:
    """Load and validate a store's manifest; a clear ManifestError for anything off."""
    store = Path(store)
    path = store / MANIFEST_NAME
    if not store.exists():
        partial = store.with_name(store.name + ".partial")
        if partial.exists():
            raise IncompleteStoreError(
                f"{store}: not finished (an interrupted pack left {partial}); run the pack again"
            )
        raise ManifestError(f"{store}: no such store")
    if not path.is_file():
        raise ManifestError(f"{store}: not a packer store (no {MANIFEST_NAME})")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: unreadable manifest: {e}") from e
    return _from_json(path, data)


def _from_json(path: Path, data: Any) -> Manifest:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise ManifestError(f"{path}: {what}")

    need(isinstance(data, dict) and data.get("format") == FORMAT, f"not a {FORMAT} manifest")
    version = data.get("format_version")
    need(isinstance(version, int), "format_version is missing")
    need(
        version <= FORMAT_VERSION,
        f"format_version {version} is newer than this packer understands "
        f"({FORMAT_VERSION}); upgrade packer",
    )
    need(data.get("backend") in ("lmdb", "hdf5"), f"unknown backend {data.get('backend')!r}")
    try:
        shards = [ShardInfo(**s) for s in data["shards"]]
        storage = Storage(**data["storage"])
        fields = {k: v for k, v in data.items() if k not in ("shards", "storage")}
        manifest = Manifest(shards=shards, storage=storage, **fields)
    except (KeyError, TypeError) as e:
        raise ManifestError(f"{path}: malformed manifest: {e}") from e
    need(
        isinstance(manifest.num_records, int) and 0 <= manifest.num_records < _MAX_RECORDS,
        f"absurd record count {manifest.num_records!r}",
    )
    for shard in shards:
        need(
            isinstance(shard.file, str) and bool(_SHARD_NAME.match(shard.file)),
            f"shard name {shard.file!r} is not a plain shard file name",
        )
        need(
            isinstance(shard.num_records, int) and 0 <= shard.num_records < _MAX_RECORDS,
            f"{shard.file}: absurd record count {shard.num_records!r}",
        )
    need(
        sum(s.num_records for s in shards) == manifest.num_records,
        "shard record counts do not add up to num_records",
    )
    return manifest
