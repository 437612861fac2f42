"""Read every record of a store and say what is wrong with it: the check behind ``--verify``.

Damage is reported, never raised: a missing, resized or changed shard file, a shard that will
not open, a record that fails its checksum or does not decode each become a ``Problem`` naming
the shard, the record's global index and its original path, and the check goes on. Only a
manifest that cannot be read raises (``ManifestError``): without it there is nothing to check.

A shard whose bytes changed is read in a child process to name the records the change
damaged: LMDB has no page checksums, and a single flipped bit in a page can kill the reading
process (SIGSEGV, SIGBUS, or an assertion's SIGABRT). HDF5 shards carry checksums on all their
metadata, so damage there is an error; an HDF5 shard of the older layout (no metadata
checksums, where libhdf5 may loop forever) is not parsed once its hash is wrong. A truncated
LMDB file is refused before reading.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import multiprocessing
import os
import signal
import threading
import time
import warnings
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packer.arguments import CountProgress, check_workers, default_workers
from packer.imaging import decode as imaging
from packer.lifeline import die_with_parent
from packer.store import ShardReader, open_shard_reader
from packer.store.duplicates import SourceKeys
from packer.store.hdf5_store import checksummed_metadata
from packer.store.manifest import Manifest, ShardInfo, file_checksum, read_manifest
from packer.store.record import Block, checksum
from packer.store.row_checks import rows_intact

__all__ = ["Problem", "VerifyReport", "verify_store"]

log = logging.getLogger(__name__)

_BLOCK = 1024  # records per sequential read
# Backends that map the shard file into memory: touching a page past the end of a truncated
# file kills the process with SIGBUS (seen with LMDB), so a short file of theirs is not opened.
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
        """Nothing at all was found wrong."""
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        """The report ``packer inspect --verify --json`` prints."""
        return {
            "store": str(self.store),
            "ok": self.ok,
            "records_checked": self.records_checked,
            "shards_checked": self.shards_checked,
            "seconds": round(self.seconds, 3),
            "problems": [asdict(p) for p in self.problems],
        }


@dataclass(frozen=True)
class _ShardCheck:
    """One shard's records to check: where they are, and how (pickled to a child as is)."""

    file: Path
    info: ShardInfo
    start: int  # the global index of its first record
    manifest: Manifest
    decode: bool
    workers: int


class _Findings:
    """The first ``limit`` problems, and a count of the rest."""

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
    progress: CountProgress | None = None,
    max_problems: int = 1000,
    workers: int | None = None,
) -> VerifyReport:
    """Check every shard file of a store and read each of its records once, in order.

    Each shard file must be present with the manifest's size and checksum, open, and hold
    the manifest's record count; each record must match its CRC-32 and, with ``decode``,
    decode to the shape stored for it. Shards are read through the backends directly, so
    a damaged one becomes a problem in the report rather than an exception.

    Args:
        path: the store folder.
        decode: also decode every image (the slow part), not only check checksums.
        progress: called as ``progress(done, total)`` with strictly increasing ``done``,
            from 0 to ``total`` (the manifest's record count): the records gone through so
            far, checked or given up on with their shard.
        max_problems: list at most this many; one last problem then says how many more.
        workers: threads that decode (Pillow releases the GIL while it decodes); None or
            0: all cores.

    Returns:
        The report; ``report.ok`` only if nothing at all was found wrong.

    Raises:
        ManifestError: the manifest is missing or unreadable (IncompleteStoreError for an
            unfinished pack).
        ValueError: ``max_problems`` is below 1, or ``workers`` below 0.
        UsageError: more ``workers`` than options.check_workers allows.
    """
    if max_problems < 1:
        raise ValueError(f"max_problems must be at least 1, not {max_problems}")
    if workers is not None and workers < 0:
        raise ValueError(f"workers must be 0 (all cores) or more, not {workers}")
    check_workers(workers or 0)
    started = time.perf_counter()
    store = Path(path)
    manifest = read_manifest(store)
    total = manifest.num_records
    reported = -1

    def advance(done: int) -> None:
        nonlocal reported
        if progress is not None and done > reported:
            reported = done
            progress(done, total)

    found = _Findings(max_problems)
    workers = workers or default_workers()
    sources = SourceKeys(manifest)
    checked = 0
    advance(0)
    files = _files_checked_ahead(store, manifest)
    with contextlib.closing(files), _decoder_warnings_logged():
        for info, start, intact, reason in files:
            if reason is not None:
                found.add(info.file, None, None, reason)
            job = _ShardCheck(store / info.file, info, start, manifest, decode, workers)
            if intact is None:
                pass  # missing, unreadable, or too short to map safely
            elif intact:
                checked += _check_records(job, found, advance, sources)
            else:
                checked += _check_records_apart(job, found)
            advance(start + info.num_records)
            log.debug("%s: %s done, %d problems so far", store, info.file, len(found.listed))
    _report_duplicates(store, manifest, sources, found)
    if checked != total:
        found.add("", None, None, f"{checked:,} of the manifest's {total:,} records were checked")
    if found.unlisted:
        found.listed.append(Problem("", None, None, f"{found.unlisted:,} more problems not listed"))
    seconds = time.perf_counter() - started
    return VerifyReport(store, checked, len(manifest.shards), found.listed, seconds)


FileVerdict = tuple[ShardInfo, int, bool | None, str | None]


def _files_checked_ahead(store: Path, manifest: Manifest) -> Generator[FileVerdict, None, None]:
    """Each shard (info, first record's index) with _check_file's verdict on its file. The
    next shard's file is hashed in a thread (hashlib releases the GIL) while the caller
    checks this one's records, so on many cores hashing does not add to the time."""
    shards = list(zip(manifest.shards, manifest.shard_starts()))
    with ThreadPoolExecutor(1, thread_name_prefix="packer-hash") as hasher:

        def check(k: int) -> Future[tuple[bool | None, str | None]] | None:
            if k == len(shards):
                return None
            return hasher.submit(
                _check_file, store / shards[k][0].file, shards[k][0], manifest.backend
            )

        ahead = check(0)
        try:
            for k, (info, start) in enumerate(shards):
                assert ahead is not None
                intact, reason = ahead.result()
                ahead = check(k + 1)
                yield info, start, intact, reason
        finally:
            if ahead is not None:
                ahead.cancel()


def _check_file(file: Path, info: ShardInfo, backend: str) -> tuple[bool | None, str | None]:
    """Size and checksum of one shard file: True if intact, False if changed, None if its
    records cannot be read at all; and what is wrong with it, if anything."""
    try:
        size = file.stat().st_size
        if size != info.bytes:
            reason = f"{size:,} bytes on disk, manifest says {info.bytes:,}"
            # A short file of a mapped backend could crash even a child process to no use.
            return (None if size < info.bytes and backend in _MAPPED else False), reason
        _, checksum = file_checksum(file, info.algorithm)
    except FileNotFoundError:
        return None, "shard file is missing"
    except OSError as e:
        return None, f"cannot read the shard file: {e.strerror or e}"
    if checksum != info.checksum:
        reason = f"{info.algorithm} mismatch: the file changed after it was packed"
        if backend == "hdf5" and not checksummed_metadata(file):
            # Damaged metadata of this layout can make libhdf5 loop forever: not parsed.
            return (
                None,
                f"{reason}; an HDF5 shard of the older layout, without metadata checksums, is not read further (a damaged one can hang libhdf5): pack again to have damaged records named",
            )
        # Still read (apart): the records say which of them the change damaged.
        return False, reason
    return True, None


def _check_records_apart(job: _ShardCheck, found: _Findings) -> int:
    """Check a changed shard's records in a child process. One flipped bit in an LMDB page
    header or in HDF5's metadata can crash the reading process (SIGBUS, SIGSEGV, an
    assertion's abort: seen in bit-flip sweeps), so here a crash is one more finding."""
    context = multiprocessing.get_context("spawn")  # a clean process, no inherited handles
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_check_in_child, args=(send, job, found.limit, os.getpid()))
    child.start()
    send.close()
    try:
        checked, problems = receive.recv()
    except EOFError:  # the child died before it could answer
        checked, problems = 0, []
    child.join()
    for problem in problems:
        found.add(*problem)
    if child.exitcode:
        how = (
            signal.Signals(-child.exitcode).name if child.exitcode < 0 else f"exit {child.exitcode}"
        )
        found.add(
            job.info.file,
            None,
            None,
            f"reading it crashed the reader ({how}): {job.manifest.backend}'s own structures in the file are damaged",
        )
    return int(checked)


def _check_in_child(send: Any, job: _ShardCheck, limit: int, parent: int) -> None:
    die_with_parent(parent)  # a SIGKILLed inspect must not leave its reader running
    found = _Findings(limit)
    with _decoder_warnings_logged():
        checked = _check_records(job, found, lambda done: None)
    send.send((checked, [(p.shard, p.index, p.path, p.reason) for p in found.listed]))


def _check_records(
    job: _ShardCheck,
    found: _Findings,
    advance: Callable[[int], None],
    sources: SourceKeys | None = None,
) -> int:
    """Read and check one shard's records, decoding in ``job.workers`` threads; returns how
    many were read and checksummed. ``sources`` is told each record's path and CRC-32."""
    file, info, start, manifest, decode = job.file, job.info, job.start, job.manifest, job.decode
    try:
        reader: ShardReader = open_shard_reader(manifest.backend, file)
    except Exception as e:  # noqa: BLE001 - any library error on a damaged file is a finding
        found.add(info.file, None, None, f"does not open: {type(e).__name__}: {e}")
        return 0
    mode = manifest.storage.mode
    checked = 0
    pool = ThreadPoolExecutor(job.workers, thread_name_prefix="packer-verify") if decode else None
    try:
        max_pixels = int(manifest.options.get("max_pixels") or imaging.DEFAULT_MAX_PIXELS)
        count = len(reader)
        if count != info.num_records:
            reason = f"holds {count:,} records, manifest says {info.num_records:,}"
            found.add(info.file, None, None, reason)
        count = min(count, info.num_records)  # a damaged count must not lead past the manifest
        for first in range(0, count, _BLOCK):
            last = min(first + _BLOCK, count)
            try:
                blocks = [(first, reader.read_block(first, last))]
            except Exception:  # noqa: BLE001 - find out which records fail, one at a time
                blocks = _one_by_one(reader, info.file, start, first, last, found)
            for offset, block in blocks:
                if sources is not None:
                    sources.add(start + offset, block.paths, block.crc32)
                suspects = _suspects(block, mode, decode)
                look = partial(
                    _record_problem, block, mode=mode, decode=decode, max_pixels=max_pixels
                )
                problems = pool.map(look, suspects) if pool else map(look, suspects)
                for i, problem in zip(suspects, problems):
                    if problem is not None:
                        found.add(info.file, start + offset + i, block.paths[i], problem)
                checked += len(block)
            advance(start + last)
    except Exception as e:  # noqa: BLE001 - e.g. a shard whose own metadata is garbage
        found.add(info.file, None, None, f"cannot be read: {type(e).__name__}: {e}")
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        try:
            reader.close()
        except Exception:  # noqa: BLE001 - closing a damaged file may fail too; nothing to add
            log.debug("closing %s failed", file, exc_info=True)
    return checked


def _report_duplicates(
    store: Path, manifest: Manifest, sources: SourceKeys, found: _Findings
) -> None:
    """Name each record that repeats an earlier one's source file (packer.store.duplicates),
    reading both again to rule out a collision of their keys."""
    starts = manifest.shard_starts()
    readers: dict[int, ShardReader] = {}

    def read(index: int) -> tuple[str, tuple[str, str, int]]:
        number = bisect.bisect_right(starts, index) - 1
        if number not in readers:
            readers[number] = open_shard_reader(
                manifest.backend, store / manifest.shards[number].file
            )
        block = readers[number].read_block(index - starts[number], index - starts[number] + 1)
        path, crc = block.paths[0], int(block.crc32[0])
        return manifest.shards[number].file, sources.identity(index, path, crc)

    try:
        for earlier, later in sources.candidates():
            try:
                first_shard, first = read(earlier)
                shard, source = read(later)
            except Exception:  # noqa: BLE001 - read once already; a second failure adds nothing
                log.debug("%s: records %d, %d unreadable", store, earlier, later, exc_info=True)
                continue
            if source == first:
                reason = f"packed twice: the same source file as record {earlier} ({first_shard})"
                found.add(shard, later, source[1], reason)
    finally:
        for reader in readers.values():
            reader.close()


def _one_by_one(
    reader: ShardReader, shard: str, start: int, first: int, last: int, found: _Findings
) -> list[tuple[int, Block]]:
    """Read records ``first:last`` singly after their block failed, naming each that fails."""
    blocks = []
    for i in range(first, last):
        try:
            blocks.append((i, reader.read_block(i, i + 1)))
        except Exception as e:  # noqa: BLE001
            found.add(shard, start + i, None, f"cannot be read: {type(e).__name__}: {e}")
    return blocks


def _suspects(block: Block, mode: str, decode: bool) -> Sequence[int]:
    """The records of ``block`` that _record_problem must look at: all of them, but of raw
    pixels in one array only those that fail a checksum or shape test made for all at once
    (one CRC-32 pass, see row_checks), which a healthy store makes none."""
    if not isinstance(block.data, np.ndarray):
        return range(len(block))
    healthy = rows_intact(block.data, block.crc32)
    if decode:
        healthy &= (block.shapes == block.data.shape[1:]).all(axis=1)
        healthy &= np.isin(block.shapes[:, 2], list(_channels(mode)))
        healthy &= np.array([f == "raw" for f in block.formats], bool)
    return np.flatnonzero(~healthy).tolist()


def _channels(mode: str) -> set[int]:
    """The channel counts raw pixels of colour policy ``mode`` may have."""
    return set(imaging.CHANNELS.values()) if mode == "keep" else {imaging.CHANNELS[mode]}


def _record_problem(block: Block, i: int, mode: str, decode: bool, max_pixels: int) -> str | None:
    """What is wrong with record ``i`` of ``block``, or None."""
    payload = block.data[i]
    stored = tuple(int(v) for v in block.shapes[i])
    if checksum(payload) != int(block.crc32[i]):
        return "checksum mismatch"  # decoding bytes known to be damaged would add nothing
    if not decode:
        return None
    if block.formats[i] == "raw":  # pixels: their count is all there is to check
        size, needed = memoryview(payload).nbytes, stored[0] * stored[1] * stored[2]
        if size != needed:
            return f"{size:,} raw bytes, shape {_shape(stored)} needs {needed:,}"
        ok = stored[2] in _channels(mode)
        return None if ok else f"shape {_shape(stored)} is not {mode} pixels"
    _decoding.path = block.paths[i]
    try:
        decoded = imaging.decoded_shape(bytes(payload), mode, max_pixels)
    except Exception as e:  # noqa: BLE001 - any decoder error means the record is unusable
        return f"does not decode: {type(e).__name__}: {e}"
    if decoded != stored:
        return f"decodes to {_shape(decoded)}, stored shape is {_shape(stored)}"
    return None


# The record a decode thread is on, for a warning its decoder gives (_decoder_warnings_logged).
_decoding = threading.local()


@contextlib.contextmanager
def _decoder_warnings_logged() -> Iterator[None]:
    """Python warnings while verifying (Pillow's "Corrupt EXIF data" of an image that decodes
    all the same) become one logged line each naming the record's path, where Python would
    print its own two lines with Pillow's source line. Entered where the decode threads
    start, so their warnings go through it."""

    def show(message: Warning | str, category: type[Warning], *rest: Any, **kw: Any) -> None:
        where = getattr(_decoding, "path", "verify")
        log.warning("%s: warning while decoding: %s", where, " ".join(str(message).split()))

    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every record's warning, not each message once
        warnings.showwarning = show
        yield


def _shape(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape))
