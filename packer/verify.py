"""Read every record of a store and say what is wrong with it: the check behind ``--verify``.

Damage is reported, never raised: a missing, resized or changed shard file, a shard that will
not open, a record that fails its checksum or does not decode each become a ``Problem`` naming
the shard, the record's global index and its original path, and the check goes on. Only a
manifest that cannot be read raises (``ManifestError``): without it there is nothing to check.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packer import imaging
from packer.manifest import Manifest, ShardInfo, read_manifest
from packer.record import Block, checksum
from packer.store import ShardReader, open_shard_reader

__all__ = ["Problem", "VerifyReport", "verify_store"]

log = logging.getLogger(__name__)

_BLOCK = 1024  # records per sequential read
_HASH_READ = 4 << 20
# Backends that map the shard file into memory: touching a page past the end of a truncated
# file kills the process with SIGBUS (seen with LMDB), so a short file is never opened.
_MAPPED = {"lmdb"}


@dataclass
class Problem:
    """One thing wrong with a store."""

    shard: str  # shard file name; "" for a store-level problem
    index: int | None  # global record index; None for a shard- or store-level problem
    path: str | None  # the record's original relative path, when it could be read
    reason: str  # one line: what is wrong


@dataclass
class VerifyReport:
    """What ``verify_store`` found. ``records_checked`` counts records read and checksummed."""

    store: Path
    records_checked: int
    shards_checked: int
    problems: list[Problem]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "store": str(self.store),
            "ok": self.ok,
            "records_checked": self.records_checked,
            "shards_checked": self.shards_checked,
            "seconds": round(self.seconds, 3),
            "problems": [asdict(p) for p in self.problems],
        }


class _Problems:
    """Keeps the first ``limit`` problems and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.listed: list[Problem] = []
        self.limit = limit
        self.unlisted = 0

    def add(self, shard: str, index: int | None, path: str | None, reason: str) -> None:
        if len(self.listed) < self.limit:
            self.listed.append(Problem(shard, index, path, reason))
        else:
            self.unlisted += 1


def verify_store(
    path: Path | str,
    *,
    decode: bool = True,
    progress: Callable[[int, int], None] | None = None,
    max_problems: int = 1000,
) -> VerifyReport:
    """Check every shard file and read every record of a store once, in order.

    Checks each shard file's presence, size and sha256 against the manifest, that it opens
    and holds the manifest's record count, and each record's CRC-32; with ``decode`` also
    that each payload decodes to the shape stored for it. The shard files are read through
    the backends directly, so a damaged one is a problem in the report, not an exception.

    Args:
        path: the store folder.
        decode: decode every image (the slow part) besides checking checksums.
        progress: called as ``progress(done, total)`` after each block, where ``done``
            counts the store's records gone through so far (checked, or given up on with
            their shard); it never decreases and ends at ``total``, the store's record count.
        max_problems: problems listed at most; one last problem then says how many more
            were found.

    Returns:
        The report; ``report.ok`` is true only if nothing at all was found wrong.

    Raises:
        ManifestError: the manifest is missing or unreadable (IncompleteStoreError for an
            unfinished pack).
        ValueError: ``max_problems`` is below 1.
    """
    if max_problems < 1:
        raise ValueError(f"max_problems must be at least 1, not {max_problems}")
    started = time.perf_counter()
    store = Path(path)
    manifest = read_manifest(store)
    found = _Problems(max_problems)
    checked = 0
    for info, start in zip(manifest.shards, manifest.shard_starts()):

        def advance(offset: int, start: int = start) -> None:
            if progress is not None:
                progress(start + offset, manifest.num_records)

        if _check_file(store / info.file, info, manifest.backend, found):
            checked += _check_records(store / info.file, info, start, manifest, decode, found, advance)
        advance(info.num_records)
        log.debug("%s: %s checked, %d problems so far", store, info.file, len(found.listed))
    if checked != manifest.num_records:
        found.add("", None, None, f"{checked:,} of the manifest's {manifest.num_records:,} records could be checked")
    if found.unlisted:
        found.listed.append(Problem("", None, None, f"{found.unlisted:,} more problems not listed"))
    seconds = time.perf_counter() - started
    return VerifyReport(store, checked, len(manifest.shards), found.listed, seconds)


def _check_file(file: Path, info: ShardInfo, backend: str, found: _Problems) -> bool:
    """Size and sha256 of one shard file; returns whether its records can safely be read."""
    try:
        size = file.stat().st_size
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            while chunk := f.read(_HASH_READ):
                digest.update(chunk)
    except FileNotFoundError:
        found.add(info.file, None, None, "shard file is missing")
        return False
    except OSError as e:
        found.add(info.file, None, None, f"cannot read the shard file: {e.strerror or e}")
        return False
    if size != info.bytes:
        found.add(info.file, None, None, f"{size:,} bytes on disk, the manifest says {info.bytes:,}")
        if size < info.bytes and backend in _MAPPED:
            return False  # truncated: reading it could crash this process (see _MAPPED)
    elif digest.hexdigest() != info.sha256:
        found.add(info.file, None, None, "sha256 mismatch: the file changed after it was packed")
    return True


def _check_records(
    file: Path,
    info: ShardInfo,
    start: int,
    manifest: Manifest,
    decode: bool,
    found: _Problems,
    advance: Callable[[int], None],
) -> int:
    """Read and check one shard's records; returns how many were read and checksummed."""
    try:
        reader: ShardReader = open_shard_reader(manifest.backend, file)
    except Exception as e:  # noqa: BLE001 - any library error on a damaged file is a finding
        found.add(info.file, None, None, f"does not open: {type(e).__name__}: {e}")
        return 0
    checked = 0
    try:
        count = len(reader)
        if count != info.num_records:
            found.add(info.file, None, None, f"holds {count:,} records, the manifest says {info.num_records:,}")
        count = min(count, info.num_records)  # never trust a damaged shard's count past the manifest
        max_pixels = manifest.options.get("max_pixels", imaging.DEFAULT_MAX_PIXELS)
        for first in range(0, count, _BLOCK):
            last = min(first + _BLOCK, count)
            try:
                blocks = [(first, reader.read_block(first, last))]
            except Exception:  # noqa: BLE001 - find which record failed, one at a time
                blocks = _one_by_one(reader, info.file, start, first, last, found)
            for offset, block in blocks:
                checked += _check_block(block, info.file, start + offset, manifest, decode, max_pixels, found)
            advance(last)
    except Exception as e:  # noqa: BLE001 - e.g. len() of a shard whose metadata is garbage
        found.add(info.file, None, None, f"cannot be read: {type(e).__name__}: {e}")
    finally:
        try:
            reader.close()
        except Exception:  # noqa: BLE001 - closing a damaged file may fail too; nothing to add
            log.debug("closing %s failed", file, exc_info=True)
    return checked


def _one_by_one(
    reader: ShardReader, shard: str, start: int, first: int, last: int, found: _Problems
) -> list[tuple[int, Block]]:
    """Read records ``first:last`` singly after their block read failed, naming each bad one."""
    blocks = []
    for i in range(first, last):
        try:
            blocks.append((i, reader.read_block(i, i + 1)))
        except Exception as e:  # noqa: BLE001
            found.add(shard, start + i, None, f"cannot be read: {type(e).__name__}: {e}")
    return blocks


def _check_block(
    block: Block,
    shard: str,
    index: int,
    manifest: Manifest,
    decode: bool,
    max_pixels: int,
    found: _Problems,
) -> int:
    """Check the records of one block, the first of which is record ``index`` of the store."""
    mode = manifest.storage.mode
    for i in range(len(block)):
        payload, path = block.data[i], block.paths[i]
        height, width, channels = (int(v) for v in block.shapes[i])
        if checksum(payload) != int(block.crc32[i]):
            found.add(shard, index + i, path, "checksum mismatch")
            continue  # decoding damaged bytes would only repeat the finding
        if not decode:
            continue
        if block.formats[i] == "raw":  # uint8 pixels: the length is all there is to check
            size = payload.nbytes if isinstance(payload, (np.ndarray, memoryview)) else len(payload)
            if size != height * width * channels:
                found.add(shard, index + i, path, f"raw payload is {size:,} bytes, shape {height}x{width}x{channels} needs {height * width * channels:,}")
            elif channels not in imaging.CHANNELS.values() or (mode != "keep" and channels != imaging.CHANNELS[mode]):
                found.add(shard, index + i, path, f"{channels} channels stored, the store's colour mode is {mode}")
            continue
        try:
            im, _ = imaging.decode(bytes(payload), mode, max_pixels)
            shape = imaging.to_array(im).shape
        except Exception as e:  # noqa: BLE001 - any decoder error means the record is unusable
            found.add(shard, index + i, path, f"does not decode: {type(e).__name__}: {e}")
            continue
        if shape != (height, width, channels):
            found.add(shard, index + i, path, f"decodes to {'x'.join(map(str, shape))}, the stored shape is {height}x{width}x{channels}")
    return len(block)
