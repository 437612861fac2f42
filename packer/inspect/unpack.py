"""Out of a store again: every record back as a file, the bytes as they were stored.

Reads the store front to back in sequential blocks and checks each record's CRC-32 before
it is written. A store may come from an untrusted source: its record paths and class names
are never allowed to write outside the folder asked for.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from collections import deque
from collections.abc import Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packer.arguments import CountProgress, check_workers, default_workers
from packer.errors import (
    PackerError,
    PackInterrupted,
    StoreError,
    StoreExistsError,
    UsageError,
)
from packer.imaging import decode as imaging
from packer.store.access import Store, record_pixels
from packer.store.record import Record

__all__ = ["LAYOUTS", "UnpackResult", "unpack_store"]

LAYOUTS = ("paths", "classes")

# The extension a re-encoded payload is written with, by its format; raw pixels become PNG.
_EXTENSIONS = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp"}


@dataclass
class UnpackResult:
    """What ``unpack_store`` wrote: ``files`` files of ``bytes`` bytes in all under ``outdir``,
    laid out by ``layout``."""

    outdir: Path
    layout: str
    files: int
    bytes: int  # bytes of the files written
    seconds: float

    def to_json(self) -> dict[str, Any]:
        """The summary ``packer unpack --json`` prints."""
        return {
            "outdir": str(self.outdir),
            "layout": self.layout,
            "files": self.files,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "files_per_s": round(self.files / self.seconds, 1) if self.seconds else None,
            "mb_per_s": round(self.bytes / 1e6 / self.seconds, 1) if self.seconds else None,
        }


def unpack_store(
    store: Store | Path | str,
    outdir: Path | str,
    *,
    layout: str = "paths",
    overwrite: bool = False,
    progress: CountProgress | None = None,
    workers: int | None = None,
) -> UnpackResult:
    """Write every record of ``store`` back as a file under ``outdir``.

    ``layout="paths"``: each record at its original relative path. In the default storage
    mode (original bytes) the files are byte-identical to the packed ones, so folder -> store
    -> folder loses nothing (files that were skipped at pack time are, of course, not there).
    ``layout="classes"``: ``outdir/<class name>/<file name>``, the class from the first label
    column (its class names, or the integer label where the column has none).

    Re-encoded payloads keep their bytes, with the extension of their format (``.jpg``,
    ``.png``, ``.webp``) in place of the original one; raw pixels are written as PNG (lossless,
    ``.png``). A name already written by this unpack (two classes' ``x.jpg`` in one class
    folder, or ``x.jpg`` and ``x.png`` both becoming ``x.png``) gets ``-<record index>``
    before its extension, the record later in store order taking the longer name.

    ``outdir`` must not exist or be empty, unless ``overwrite``: then files of the same names
    are replaced and every other file is left alone. Each file is written under a temporary
    name (``.unpack-*.tmp``) in its folder and renamed, so an interrupted unpack never leaves
    a half file under a final name. Records are read in store order, in sequential blocks, and
    each one's CRC-32 is checked before it is written. Raw pixels are encoded to PNG in
    ``workers`` threads (None or 0: all cores), a few records ahead of the writing.

    Raises:
        StoreError: a record path (or class name) that is absolute or leaves ``outdir``, or
            reaches outside it through a symbolic link; CorruptRecordError (a StoreError)
            for a damaged record. Files written before it stay; nothing is written outside.
        StoreExistsError: ``outdir`` is not empty (or not a folder) and not ``overwrite``.
        UsageError: an unknown layout, ``layout="classes"`` for a store without labels, or
            ``workers`` below 0.
        PackInterrupted: Ctrl-C; the files written so far stay, complete.
    """
    started = time.perf_counter()
    if layout not in LAYOUTS:
        raise UsageError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    if workers is not None and workers < 0:
        raise UsageError(f"workers must be 0 (all cores) or more, not {workers}")
    check_workers(workers or 0)
    outdir = Path(outdir)
    opened = not isinstance(store, Store)
    source = store if isinstance(store, Store) else Store(store)
    files = written_bytes = 0
    try:
        source.require_packer_store("unpack")
        namer = _Namer(source, layout)
        _check_outdir(source.path, outdir, overwrite)
        try:
            outdir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PackerError(f"{outdir}: cannot create it: {e.strerror or e}") from e
        folders = _Folders(outdir)
        raw = source.manifest.storage.payload == "raw"
        total = len(source)
        records = source.indexed_records()
        contents = _as_pngs(records, workers or default_workers()) if raw else _as_stored(records)
        with contextlib.closing(contents):  # on any exit, its encoding threads stop now
            for index, record, data in contents:
                target = folders.target(namer.name(index, record), index, record.path)
                try:
                    _write_file(target, data)
                except OSError as e:
                    raise PackerError(
                        f"{target}: cannot write record {index} ({record.path}): {e.strerror or e}"
                    ) from e
                files += 1
                written_bytes += len(data)
                if progress is not None:
                    progress(files, total)
    except KeyboardInterrupt:
        raise PackInterrupted(
            f"interrupted: {files} complete file(s) were written to {outdir}"
        ) from None
    finally:
        if opened:
            source.close()
    return UnpackResult(outdir, layout, files, written_bytes, time.perf_counter() - started)


def _check_outdir(store: Path, outdir: Path, overwrite: bool) -> None:
    if outdir.exists() or outdir.is_symlink():
        if not outdir.is_dir():
            raise StoreExistsError(f"{outdir} exists and is not a folder")
        if not overwrite and any(outdir.iterdir()):
            raise StoreExistsError(
                f"{outdir} is not empty; pass --overwrite to write into it "
                "(files of the same names are replaced, others left)"
            )
    resolved, home = outdir.resolve(), store.resolve()
    if resolved == home or resolved.is_relative_to(home):
        raise UsageError(f"{outdir} is inside the store {store}; unpack it elsewhere")


def _safe_relative(text: Any) -> PurePosixPath | None:
    """``text`` as a relative path that stays where it is put, or None."""
    if not isinstance(text, str) or not text or "\x00" in text or text.startswith("/"):
        return None
    path = PurePosixPath(text)
    if not path.parts or ".." in path.parts:
        return None
    return path


class _Namer:
    """Where each record goes, relative to outdir: the layout, the extension, no duplicates."""

    def __init__(self, store: Store, layout: str) -> None:
        manifest = store.manifest
        self.layout = layout
        self.payload = manifest.storage.payload
        self.used: set[str] = set()
        self.classes: list[str] | None = None
        if layout == "classes":
            if not manifest.label_columns:
                raise UsageError(
                    f"{store.path} has no labels; layout 'classes' needs them (use 'paths')"
                )
            names = manifest.label_columns[0].get("classes")
            if names is not None:
                for name in names:
                    if _safe_relative(name) is None:
                        raise StoreError(
                            f"{store.path}: class name {name!r} is not a safe folder name; "
                            "refusing to unpack"
                        )
                self.classes = [str(name) for name in names]
        self.store = store.path

    def name(self, index: int, record: Record) -> PurePosixPath:
        path = _safe_relative(record.path)
        if path is None:
            raise StoreError(
                f"{self.store}: record {index} has path {record.path!r}, which is absolute or "
                "leaves the output folder; refusing to unpack it"
            )
        if self.layout == "classes":
            path = PurePosixPath(self._class(index, record), path.name)
        if self.payload == "raw":
            path = path.with_suffix(".png")
        elif self.payload == "encoded":
            ext = _EXTENSIONS.get(record.format, "." + record.format.lower())
            path = path.with_suffix(ext)
        return self._unique(path, index)

    def _class(self, index: int, record: Record) -> str:
        if not record.labels:
            raise StoreError(f"{self.store}: record {index} ({record.path}) has no label")
        label = record.labels[0]
        if self.classes is None:
            return str(int(label))
        if not 0 <= label < len(self.classes):
            raise StoreError(
                f"{self.store}: record {index} ({record.path}) has label {label}, "
                f"but the store names {len(self.classes)} classes"
            )
        return self.classes[label]

    def _unique(self, path: PurePosixPath, index: int) -> PurePosixPath:
        candidate, n = path, 1
        while candidate.as_posix() in self.used:
            n += 1
            extra = f"-{index}" if n == 2 else f"-{index}-{n - 1}"
            candidate = path.with_name(path.stem + extra + path.suffix)
        self.used.add(candidate.as_posix())
        return candidate


class _Folders:
    """Turns a safe relative path into a target under outdir, refusing one that a symbolic
    link already in outdir (with overwrite) would carry elsewhere; creates its folder."""

    def __init__(self, outdir: Path) -> None:
        self.outdir = outdir
        self.root = outdir.resolve()
        self.checked: set[PurePosixPath] = set()

    def target(self, relative: PurePosixPath, index: int, record_path: str) -> Path:
        parent = relative.parent
        if parent not in self.checked:
            real = (self.root / parent).resolve()
            if not (real == self.root or real.is_relative_to(self.root)):
                raise StoreError(
                    f"{self.outdir}/{parent} leads outside {self.outdir} (a symbolic link); "
                    f"refusing to write record {index} ({record_path}) through it"
                )
            try:
                real.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise PackerError(
                    f"{self.outdir}/{parent}: cannot create the folder for record {index} "
                    f"({record_path}): {e.strerror or e}"
                ) from e
            self.checked.add(parent)
        return self.root / relative


FileContents = Generator[tuple[int, Record, bytes | memoryview], None, None]


def _as_stored(records: Iterator[tuple[int, Record]]) -> FileContents:
    for index, record in records:
        yield index, record, record.data


def _as_pngs(records: Iterator[tuple[int, Record]], workers: int) -> FileContents:
    """Each record with its pixels encoded as a PNG, in store order. ``workers`` threads
    encode a few records ahead (Pillow releases the GIL while it compresses); a damaged
    record still has every record before it written first."""
    with ThreadPoolExecutor(workers, thread_name_prefix="packer-unpack") as pool:
        ahead: deque[tuple[int, Record, Future[bytes]]] = deque()

        def oldest() -> tuple[int, Record, bytes]:
            index, record, png = ahead.popleft()
            return index, record, png.result()

        try:
            try:
                for index, record in records:
                    ahead.append((index, record, pool.submit(_png, record)))
                    if len(ahead) > 2 * workers:
                        yield oldest()
            except Exception:  # a damaged record: the ones before it are written first
                while ahead:
                    yield oldest()
                raise
            while ahead:
                yield oldest()
        finally:  # Ctrl-C or an error in the caller: what has not started is dropped
            for _, _, png in ahead:
                png.cancel()


def _png(record: Record) -> bytes:
    pixels = record_pixels(record)
    if pixels.shape[2] not in (1, 2, 3, 4):
        raise StoreError(f"record {record.path}: {pixels.shape[2]} channels cannot be a PNG")
    return imaging.encode(imaging.from_array(pixels), "png")


def _write_file(target: Path, data: bytes | memoryview) -> None:
    """Write under a temporary name in the target's folder, then rename: a file appears under
    its final name complete or not at all. An existing file (or link) of that name is replaced."""
    temp = target.with_name(f".unpack-{secrets.token_hex(6)}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
