"""The manifest: a store's versioned, human-readable table of contents, written last.

A store is a folder holding ``manifest.json`` and its shard files. The manifest is the
commit record: it is written only after every shard is on disk, atomically, so a folder
without one is an unfinished pack, never a store.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import xxhash

from packer.about import install_hint
from packer.errors import IncompleteStoreError, ManifestError

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "OLDEST_FORMAT_VERSION",
    "MANIFEST_NAME",
    "SHARD_HASH",
    "ShardInfo",
    "file_checksum",
    "manifest_bytes",
    "Storage",
    "Manifest",
    "read_manifest",
    "write_manifest",
    "fsync_path",
]

FORMAT = "packer-store"
# The format this packer writes, and the newest it reads. 2: raw LMDB shards of one shape
# use the "columns" layout (packer/store/lmdb_store.py). 3: shard files are hashed with
# xxh3-128, each shard's "checksum" naming its algorithm, where 1 and 2 had a "sha256".
# 4: the manifest ends with a checksum of its own bytes ("manifest_checksum", see _seal).
FORMAT_VERSION = 4
OLDEST_FORMAT_VERSION = 1  # every format since the first still opens
_SEALED_SINCE = 4  # the first format whose manifests must carry their own checksum
SHARD_HASH = "xxh3_128"  # how new shard files are hashed; sha256 is still read and checked
_HASHES: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_CHECKSUM = re.compile(r"^(xxh3_128:[0-9a-f]{32}|sha256:[0-9a-f]{64})$")
MANIFEST_NAME = "manifest.json"
_SHARD_NAME = re.compile(r"^shard-\d{5,}\.(lmdb|h5)$")
_MAX_RECORDS = 1 << 40  # far beyond any real store; guards allocations sized from the manifest
_MAX_MANIFEST_BYTES = 64 << 20  # a real one is kilobytes (megabytes with 100,000s of skipped files)
_MAX_RECORD_BYTES = 1 << 30  # h x w x c of a fixed shape: Pillow's own limit is 716 MB (4 channels)
_MIN_RECORD_BYTES = 16  # a record takes at least this much of its shard file, in either backend


@dataclass
class ShardInfo:
    file: str  # file name inside the store folder
    num_records: int
    bytes: int  # size of the shard file
    checksum: str  # of the shard file: "<algorithm>:<hex digest>", the algorithm SHARD_HASH
    payload_bytes: int  # sum of the records' payloads

    @classmethod
    def of_file(cls, path: Path, num_records: int, payload_bytes: int) -> ShardInfo:
        """Describe a finished shard file: its size and checksum."""
        size, checksum = file_checksum(path)
        return cls(path.name, num_records, size, checksum, payload_bytes)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardInfo:
        """From a manifest's (or a ledger's) shard entry; a format 1 or 2 entry's "sha256"
        becomes the checksum "sha256:<hex>"."""
        data = dict(data)
        if "sha256" in data and "checksum" not in data:
            data["checksum"] = f"sha256:{data.pop('sha256')}"
        return cls(**data)

    @property
    def algorithm(self) -> str:
        return self.checksum.partition(":")[0]


def file_checksum(path: Path, algorithm: str = SHARD_HASH) -> tuple[int, str]:
    """The size of the file at ``path`` and its checksum, "<algorithm>:<hex digest>", read
    in 4 MB pieces into one reused buffer."""
    digest = _HASHES[algorithm]()
    buffer = bytearray(4 << 20)
    view = memoryview(buffer)
    size = 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
            size += n
    return size, f"{algorithm}:{digest.hexdigest()}"


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
    """A store's manifest.json: what it holds (records, shards with their hashes, classes,
    label columns), how it was made (options, source, packer version) and every skipped file."""

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
        """The manifest as written to manifest.json."""
        data = asdict(self)
        # The identifying fields first, so `head manifest.json` says what this is.
        head = {k: data.pop(k) for k in ("format", "format_version", "backend", "num_records")}
        return {**head, **data}


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write ``folder/manifest.json`` atomically: temp file, fsync, rename, fsync the folder."""
    target = folder / MANIFEST_NAME
    temp = folder / (MANIFEST_NAME + ".tmp")
    with open(temp, "wb") as f:
        f.write(manifest_bytes(manifest.to_json()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, target)
    fsync_path(folder)


# A manifest's last field is the checksum of every byte before its line, and the bytes after
# the checksum are exactly these: so a change to any byte of the file is caught.
_SEAL_KEY = "manifest_checksum"
_SEAL = re.compile(b'"%s": "(xxh3_128:[0-9a-f]{32})"\n}\n\\Z' % _SEAL_KEY.encode())


def manifest_bytes(data: dict[str, Any]) -> bytes:
    """``data`` as manifest.json holds it: indented JSON, sealed by a last field,
    ``manifest_checksum``, the xxh3-128 of every byte before that field's name (one that
    ``data`` holds is replaced)."""
    data = {k: v for k, v in data.items() if k != _SEAL_KEY}
    if not data:
        raise ValueError("a manifest is a non-empty object")
    body = json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8")
    head = body[: -len(b"\n}")] + b",\n "
    return head + b'"%s": "%s"\n}\n' % (_SEAL_KEY.encode(), _seal(head).encode())


def _seal(head: bytes) -> str:
    return f"xxh3_128:{xxhash.xxh3_128(head).hexdigest()}"


def _check_seal(path: Path, raw: bytes, claimed: object, version: int) -> None:
    """Refuse a manifest whose bytes changed after packer wrote them (format 4 on; an older
    manifest without a checksum is taken as it is)."""
    if claimed is None:
        if version >= _SEALED_SINCE:
            raise ManifestError(
                f"{path}: {_SEAL_KEY} is missing (format {version} manifests carry one); "
                "the manifest was edited or damaged"
            )
        return
    tail = _SEAL.search(raw)
    if tail is None or tail.group(1).decode() != claimed:
        raise ManifestError(
            f"{path}: {_SEAL_KEY} is not the last line packer writes; "
            "the manifest was edited or damaged"
        )
    if _seal(raw[: tail.start()]) != claimed:
        raise ManifestError(
            f"{path}: the manifest changed after packer wrote it (its {_SEAL_KEY} does not "
            "match its bytes); it was edited or damaged: restore it or pack again"
        )


def fsync_path(path: Path) -> None:
    """Wait until the file at ``path``, or a folder's entries, are on disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# An interrupted pack keeps its plan and one marker per finished shard in OUT.partial
# (packer/packing/ledger.py writes them); named here so that a store's error says how far it got.
PACK_PLAN = "pack.json"
SHARD_DONE_SUFFIX = ".done.json"


def _progress(partial: Path) -> str:
    """ ", with N of M shards finished" for a message, or "" if the plan is unreadable."""
    try:
        total = json.loads((partial / PACK_PLAN).read_text(encoding="utf-8")).get("shards")
    except (OSError, ValueError, AttributeError):
        return ""
    if not isinstance(total, int):
        return ""
    done = sum(1 for _ in partial.glob("*" + SHARD_DONE_SUFFIX))
    return f", with {done} of {total} shards finished"


def read_manifest(store: Path | str) -> Manifest:
    """Load and validate a store's manifest; a clear ManifestError for anything off."""
    store = Path(store)
    path = store / MANIFEST_NAME
    if not store.exists():
        partial = store.with_name(store.name + ".partial")
        if partial.exists():
            raise IncompleteStoreError(
                f"{store}: not finished (an interrupted pack left {partial}"
                f"{_progress(partial)}); run the same pack command again to finish it"
            )
        raise ManifestError(f"{store}: no such store")
    if not path.is_file():
        raise ManifestError(f"{store}: not a packer store (no {MANIFEST_NAME})")
    try:
        size = path.stat().st_size
        if size > _MAX_MANIFEST_BYTES:
            raise ManifestError(
                f"{path}: a {size:,}-byte manifest is not a packer manifest "
                f"(the limit is {_MAX_MANIFEST_BYTES:,} bytes)"
            )
        raw = path.read_bytes()
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        # ValueError: bad JSON, NaN or Infinity, an integer of thousands of digits
        raise ManifestError(f"{path}: unreadable manifest: {e}") from e
    claimed = data.pop(_SEAL_KEY, None) if isinstance(data, dict) else None
    manifest = _from_json(path, data)  # what is wrong with the fields, said first
    _check_seal(path, raw, claimed, manifest.format_version)
    for shard in manifest.shards:
        _check_shard_file(path, store / shard.file, shard.num_records, _record_bytes(manifest))
    return manifest


def _record_bytes(manifest: Manifest) -> tuple[int, int]:
    """The fewest bytes of shard file a record can take, as a fraction (bytes, per records).

    Raw pixels of one shape take their size (the reader allocates its buffers from that
    shape), or 1/1032 of it compressed: deflate's best ratio; lzf's is lower.
    """
    storage = manifest.storage
    if storage.payload != "raw" or storage.shape is None:
        return _MIN_RECORD_BYTES, 1
    size = max(_MIN_RECORD_BYTES, math.prod(storage.shape))
    compressed = manifest.backend == "hdf5" and storage.compression is not None
    return (size, 1032) if compressed else (size, 1)


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _check_shard_file(
    manifest: Path, file: Path, num_records: int, record_bytes: tuple[int, int]
) -> None:
    """A shard file that is there must be a regular file inside the store, big enough for its
    records. A missing one is reported where it is read (verify names it; a reader refuses)."""
    try:
        info = os.lstat(file)
        if stat.S_ISLNK(info.st_mode):
            target = file.resolve()
            if not target.is_relative_to(file.parent.resolve()):
                raise ManifestError(
                    f"{manifest}: {file.name} is a symlink to {target}, outside the store"
                )
            info = file.stat()
    except FileNotFoundError:
        return
    except OSError as e:  # a symlink loop, a folder we may not read
        raise ManifestError(f"{manifest}: {file.name}: {e.strerror or e}") from e
    if not stat.S_ISREG(info.st_mode):
        raise ManifestError(f"{manifest}: {file.name} is not a regular file")
    size, ratio = record_bytes
    if num_records * size > info.st_size * ratio:
        raise ManifestError(
            f"{manifest}: {file.name}: {num_records:,} records cannot fit in its "
            f"{info.st_size:,} bytes"
        )


# What each field of a manifest must hold, checked before anything uses it: a hostile
# manifest gets one clear error, not a TypeError (or a huge allocation) somewhere later.
# A spec is (predicate, what it wants), a {key: spec} object ("key?" optional), a
# [spec] list, or _Map(spec of keys, spec of values).
_Spec = Any


@dataclass(frozen=True)
class _Map:
    keys: _Spec
    values: _Spec


def _kind(check: Callable[[Any], bool], what: str) -> _Spec:
    return (check, what)


_NAT = _kind(lambda v: type(v) is int and 0 <= v < 1 << 63, "a whole number >= 0")
_INT = _kind(lambda v: type(v) is int and -(1 << 63) <= v < 1 << 63, "a whole number")
_NUM = _kind(
    lambda v: type(v) in (int, float) and math.isfinite(v) and abs(v) < 1 << 63, "a number"
)
_STR = _kind(lambda v: isinstance(v, str), "a string")
_BOOL = _kind(lambda v: isinstance(v, bool), "true or false")
_ANY = _kind(lambda v: True, "anything")
_INT_TEXT = _kind(
    lambda v: isinstance(v, str) and bool(re.fullmatch(r"-?\d{1,19}", v)), "an integer"
)


def _optional(spec: _Spec) -> _Spec:
    check, what = spec
    return (lambda v: v is None or check(v), f"{what} or null")


def _one_of(*names: str) -> _Spec:
    return (lambda v: isinstance(v, str) and v in names, "one of " + ", ".join(names))


def _dims(n: int) -> _Spec:
    def check(v: Any) -> bool:
        ok = isinstance(v, list) and len(v) == n
        return ok and all(type(d) is int and 1 <= d < 1 << 31 for d in v)

    return (check, f"{n} whole numbers >= 1")


def _fixed_shape(v: Any) -> bool:
    return _dims(3)[0](v) and math.prod(v) <= _MAX_RECORD_BYTES


def _distribution_complete(d: dict[str, Any]) -> bool:
    return not d["count"] or all(d[k] is not None for k in ("min", "max", "mean"))


_DISTRIBUTION = {
    "count": _NAT,
    "min": _optional(_NUM),
    "max": _optional(_NUM),
    "mean": _optional(_NUM),
    "histogram?": _Map(_INT_TEXT, _NAT),
}
_SPEC: dict[str, _Spec] = {
    "format": _STR,
    "format_version": _INT,
    "backend": _one_of("lmdb", "hdf5"),
    "num_records": _NAT,
    "shards": [
        {
            "file": _STR,
            "num_records": _NAT,
            "bytes": _NAT,
            "checksum?": (
                lambda v: isinstance(v, str) and bool(_CHECKSUM.match(v)),
                "xxh3_128:<32 hex digits> or sha256:<64 hex digits>",
            ),
            "sha256?": _STR,  # formats 1 and 2
            "payload_bytes": _NAT,
        }
    ],
    "storage": {
        "payload": _one_of("original", "encoded", "raw"),
        "mode": _one_of("RGB", "L", "keep"),
        "encoding?": _optional(_STR),
        "quality?": _optional(_NAT),
        "max_side?": _optional(_NAT),
        "size?": _optional(_dims(2)),
        "fit?": _optional(_STR),
        "shape?": _optional(
            (_fixed_shape, f"3 whole numbers >= 1, of at most {_MAX_RECORD_BYTES:,} bytes in all")
        ),
        "compression?": _optional(_one_of("gzip", "lzf")),
        "checksums?": _BOOL,
    },
    "label_source": _one_of("folders", "csv", "none"),
    "label_columns": [
        {
            "name": _STR,
            "classes": _optional(
                _kind(
                    lambda v: isinstance(v, list) and all(isinstance(c, str) for c in v),
                    "a list of strings",
                )
            ),
        }
    ],
    "seed": _INT,
    "shuffled": _BOOL,
    "packer_version": _STR,
    "created": _STR,
    "options?": {"max_pixels?": _optional(_NAT)},
    "stats?": {
        "payload_bytes?": _DISTRIBUTION,
        "height?": _DISTRIBUTION,
        "width?": _DISTRIBUTION,
        "formats?": _Map(_STR, _NAT),
        "label_counts?": [_Map(_INT_TEXT, _NAT)],
    },
    "skipped?": [{"path": _STR, "reason": _STR}],
    "source?": _Map(_STR, _ANY),
}


def _mismatch(value: Any, spec: _Spec, where: str) -> str | None:
    """What is wrong with ``value`` against ``spec`` (naming the field), or None."""
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            return f"{where or 'the manifest'} is {_show(value)}, not an object"
        for key, sub in spec.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{where + '.' if where else ''}{name} is missing"
            wrong = _mismatch(value[name], sub, f"{where + '.' if where else ''}{name}")
            if wrong:
                return wrong
        return None
    if isinstance(spec, list):
        if not isinstance(value, list):
            return f"{where} is {_show(value)}, not a list"
        for i, item in enumerate(value):
            wrong = _mismatch(item, spec[0], f"{where}[{i}]")
            if wrong:
                return wrong
        return None
    if isinstance(spec, _Map):
        if not isinstance(value, dict):
            return f"{where} is {_show(value)}, not an object"
        for key, item in value.items():
            wrong = _mismatch(key, spec.keys, f"{where} key") or _mismatch(
                item, spec.values, f"{where}[{key!r}]"
            )
            if wrong:
                return wrong
        return None
    check, what = spec
    return None if check(value) else f"{where} is {_show(value)}, not {what}"


def _show(value: Any) -> str:
    short = not isinstance(value, (dict, list)) or len(value) <= 4
    text = json.dumps(value) if short else f"a {type(value).__name__} of {len(value)}"
    return text if len(text) <= 40 else text[:37] + "..."


def _from_json(path: Path, data: Any) -> Manifest:
    def need(cond: bool, what: str) -> None:
        if not cond:
            raise ManifestError(f"{path}: {what}")

    need(isinstance(data, dict) and data.get("format") == FORMAT, f"not a {FORMAT} manifest")
    version = data.get("format_version")
    need(version is not None, "format_version is missing")
    need(type(version) is int, f"format_version is {_show(version)}, not a whole number")
    need(
        version <= FORMAT_VERSION,
        f"format_version {version} is newer than this packer understands "
        f"({FORMAT_VERSION}); upgrade packer: {install_hint(upgrade=True)}",
    )
    need(
        version >= OLDEST_FORMAT_VERSION,
        f"format_version {version} is unknown (packer writes {FORMAT_VERSION})",
    )
    need(data.get("backend") in ("lmdb", "hdf5"), f"unknown backend {data.get('backend')!r}")
    wrong = _mismatch(data, _SPEC, "")
    need(wrong is None, f"malformed manifest: {wrong}")
    for entry in data["shards"]:
        need(
            ("checksum" in entry) != ("sha256" in entry),
            f"{entry['file']}: a shard has one checksum (format 3) or sha256 (1 and 2)",
        )
    try:
        shards = [ShardInfo.from_json(s) for s in data["shards"]]
        storage = Storage(**data["storage"])
        fields = {k: v for k, v in data.items() if k not in ("shards", "storage")}
        manifest = Manifest(shards=shards, storage=storage, **fields)
    except (KeyError, TypeError) as e:  # an unknown field
        raise ManifestError(f"{path}: malformed manifest: {e}") from e
    need(manifest.num_records < _MAX_RECORDS, f"absurd record count {manifest.num_records!r}")
    for shard in shards:
        need(
            bool(_SHARD_NAME.match(shard.file)),
            f"shard name {shard.file!r} is not a plain shard file name",
        )
        need(
            shard.num_records < _MAX_RECORDS,
            f"{shard.file}: absurd record count {shard.num_records!r}",
        )
    need(
        sum(s.num_records for s in shards) == manifest.num_records,
        "shard record counts do not add up to num_records",
    )
    for name in ("payload_bytes", "height", "width"):
        figures = manifest.stats.get(name)
        need(
            figures is None or _distribution_complete(figures),
            f"malformed manifest: stats.{name} counts values but has no min, max or mean",
        )
    counts = manifest.stats.get("label_counts", [])
    for column, column_counts in zip(manifest.label_columns, counts):
        classes = column["classes"]
        need(
            classes is None or all(0 <= int(k) < len(classes) for k in column_counts),
            f"stats.label_counts of column {column['name']!r} name labels past its "
            f"{len(classes or [])} classes",
        )
    return manifest
