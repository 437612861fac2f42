"""Look at a store before training on it: see its images, list its records, pull one out,
and time how fast this machine reads it.

Every function takes a ``Store`` (from ``open_store``) or a store's path; a store opened
here from a path is closed before the function returns. Nothing here prints: each function
returns plain data (or writes the one file it was asked to), for the CLI or a notebook to show.

    contact_sheet   a PNG grid of a seeded sample (or of one class), each image labelled
    list_records    where records live and what they hold: shard, offset, labels, path, shape
    extract         one record's image as a file (its original bytes when they fit the suffix)
    bench_store     the device's sequential read against the reader's, cold: which is the limit
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from packer.errors import PackerError, UsageError
from packer.imaging import jpeg_turbo
from packer.reading.reader import open_reader
from packer.store.access import Store
from packer.store.record import CRC32_BY, Record, checksum

__all__ = [
    "LABEL_STRIP",
    "StoreLike",
    "contact_sheet",
    "list_records",
    "extract",
    "bench_store",
    "drop_cached",
    "read_files",
]

StoreLike = Store | Path | str

LABEL_STRIP = 16  # px of label text under each contact-sheet tile
_STRIP_BACKGROUND = (32, 32, 32)
_TEXT = (235, 235, 235)
_MAX_LISTED_CLASSES = 50  # an unknown-class error names at most this many
_JPEG_QUALITY = 95  # when a record has to be re-encoded as JPEG by ``extract``
# Pillow format -> the suffix ``extract`` gives a path that has none.
_SUFFIX_OF = {"JPEG": ".jpg", "MPO": ".jpg", "PNG": ".png", "WEBP": ".webp", "TIFF": ".tif"}
# Payload formats whose bytes are a valid file of another format (an MPO is a JPEG + extras).
_SAME_AS = {"MPO": "JPEG"}


@contextmanager
def opened(store: StoreLike) -> Iterator[Store]:
    """The store itself, or a store opened from a path and closed afterwards."""
    if isinstance(store, Store):
        yield store
        return
    opened = Store(store)
    try:
        yield opened
    finally:
        opened.close()


# -- labels -------------------------------------------------------------------------------


def all_labels(store: Store) -> np.ndarray:
    """Every record's labels in store order, (num_records, label columns) int64, read shard by
    shard without the payloads (HDF5: the small labels column; LMDB: one cursor walk)."""
    columns = len(store.manifest.label_columns)
    parts = [np.zeros((0, columns), np.int64)]
    parts += [
        store.shard(n).read_labels() for n, s in enumerate(store.manifest.shards) if s.num_records
    ]
    labels = np.concatenate(parts)
    if len(labels) != len(store):
        raise UsageError(f"{store.path}: read {len(labels)} labels for {len(store)} records")
    return labels


def label_column_info(store: Store, label_column: int) -> dict[str, Any]:
    columns = store.manifest.label_columns
    if not columns:
        raise UsageError(
            f"{store.path}: the store has no labels (it was packed with --labels none)"
        )
    if not 0 <= label_column < len(columns):
        names = ", ".join(f"{i} ({c['name']})" for i, c in enumerate(columns))
        raise UsageError(
            f"label column {label_column} out of range; {store.path} has label columns {names}"
        )
    return columns[label_column]


def _label_names(store: Store, labels: Sequence[int]) -> list[str | None]:
    """Each label's class name, or None for an integer column."""
    names: list[str | None] = []
    for column, value in zip(store.manifest.label_columns, labels):
        classes = column.get("classes")
        names.append(classes[value] if classes and 0 <= value < len(classes) else None)
    return names


def _label_text(store: Store, labels: Sequence[int]) -> str:
    """The label text: a class name ("cat"), an integer ("7"), columns joined ("cat, 7")."""
    names = _label_names(store, labels)
    return ", ".join(name if name is not None else str(v) for name, v in zip(names, labels))


def _listing(items: Sequence[str], limit: int = _MAX_LISTED_CLASSES) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... and {len(items) - limit} more" if len(items) > limit else "")


# -- contact sheet ------------------------------------------------------------------------


def positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive integer, not {value!r}")


def _class_members(store: Store, class_name: str, label_column: int) -> np.ndarray:
    column = label_column_info(store, label_column)
    values = all_labels(store)[:, label_column]
    classes = column.get("classes")
    if classes:
        if class_name not in classes:
            raise UsageError(
                f"no class {class_name!r} in label column {column['name']!r} of {store.path}; "
                f"classes: {_listing(list(classes))}"
            )
        wanted = classes.index(class_name)
    else:  # an integer column: the class is the integer, written as text
        present = [str(v) for v in np.unique(values)]
        if class_name.strip() not in present:
            raise UsageError(
                f"no class {class_name!r} in label column {column['name']!r} of {store.path} "
                f"(integer labels, no class names); classes: {_listing(present)}"
            )
        wanted = int(class_name)
    return np.flatnonzero(values == wanted)


def _letterbox(image: np.ndarray, tile: int) -> tuple[Image.Image, tuple[int, int]]:
    """The image scaled to fit tile x tile, aspect kept, and its offset in the tile."""
    im = Image.fromarray(image[:, :, 0] if image.shape[2] == 1 else image).convert("RGB")
    scale = min(tile / im.width, tile / im.height)
    size = (
        min(tile, max(1, round(im.width * scale))),
        min(tile, max(1, round(im.height * scale))),
    )
    if size != im.size:
        im = im.resize(size, Image.Resampling.BILINEAR)
    return im, ((tile - size[0]) // 2, (tile - size[1]) // 2)


def _fit_text(draw: ImageDraw.ImageDraw, text: str, font: Any, width: int) -> str:
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "...", font=font) > width:
        text = text[:-1]
    return text + "..."


def contact_sheet(
    store: StoreLike,
    out_path: Path | str,
    *,
    count: int = 64,
    columns: int = 8,
    tile: int = 128,
    seed: int = 0,
    class_name: str | None = None,
    label_column: int = 0,
) -> list[int]:
    """Write a PNG contact sheet of ``count`` records and return their indices, in grid order.

    Which records: ``numpy.random.default_rng(seed).choice(n, count, replace=False)`` over the
    store's ``n`` records, sorted (so the reads go forward through the shards); with
    ``class_name``, the same draw over only the records whose label in ``label_column`` is
    that class (its name, or the integer as text for a column without class names); that
    reads every label first (HDF5: the small labels datasets; LMDB: one pass over the
    records). ``count`` is capped at the number of records there are to draw from.

    Layout: ``columns`` tiles per row, filled row by row in the order of the returned list, so
    the sheet is exactly ``columns * tile`` px wide and ``rows * (tile + LABEL_STRIP)`` px high,
    ``rows = ceil(shown / columns)``. Each tile is the record decoded upright (``store[i]``),
    converted to RGB (grey repeated, alpha dropped), scaled with bilinear resampling to the
    largest size that fits ``tile`` x ``tile`` with its aspect kept (each side
    ``max(1, round(side * scale))``), and centred on black (left/top padding the floor of
    half the slack). Under each tile a ``LABEL_STRIP`` (16) px dark strip holds its label in
    Pillow's default font: the class name or the integer, several columns joined by ", ",
    cut with "..." when too long; ``#index`` for a store without labels.

    Raises:
        UsageError: a non-positive count, columns or tile; an unknown ``class_name`` (the
            message lists the column's classes); a store with no labels when ``class_name``
            is given; nothing to show (an empty store or class).
        CorruptRecordError: a shown record fails its checksum or does not decode.
    """
    positive(count=count, columns=columns, tile=tile)
    with opened(store) as s:
        if class_name is not None:
            pool = _class_members(s, class_name, label_column)
        else:
            pool = np.arange(len(s))
        if len(pool) == 0:
            what = f"class {class_name!r}" if class_name is not None else str(s.path)
            raise UsageError(f"nothing to show: {what} has no records")
        take = min(count, len(pool))
        chosen = np.random.default_rng(seed).choice(len(pool), take, replace=False)
        indices = sorted(int(i) for i in pool[chosen])

        rows = math.ceil(len(indices) / columns)
        cell = tile + LABEL_STRIP
        sheet = Image.new("RGB", (columns * tile, rows * cell))
        draw = ImageDraw.Draw(sheet)
        font = ImageFont.load_default()
        for k, index in enumerate(indices):
            row, col = divmod(k, columns)
            x, y = col * tile, row * cell
            image, labels = s[index]
            im, (dx, dy) = _letterbox(image, tile)
            sheet.paste(im, (x + dx, y + dy))
            draw.rectangle((x, y + tile, x + tile - 1, y + cell - 1), fill=_STRIP_BACKGROUND)
            text = _label_text(s, [int(v) for v in labels]) if len(labels) else f"#{index}"
            draw.text((x + 3, y + tile + 2), _fit_text(draw, text, font, tile - 6), _TEXT, font)
    _written(Path(out_path), lambda out: sheet.save(out, "PNG"))
    return indices


# -- records ------------------------------------------------------------------------------


def list_records(
    store: StoreLike, *, head: int | None = None, index: int | None = None
) -> list[dict[str, Any]]:
    """What the store holds, record by record: the first ``head`` records, or record ``index``
    alone, or (neither given) every record, in store order.

    Each record is a dict::

        index        global record index (what ``store[i]`` and the reader's batches use)
        shard        file name of its shard, e.g. "shard-00000.lmdb"
        offset       its index inside that shard
        labels       list of int, one per label column
        classes      list, per label column: the class name, or None for an integer column
        path         original path, relative to the packed folder
        bytes        payload size in bytes
        shape        [height, width, channels] as the reader yields it (upright)
        format       "JPEG", "PNG", ... or "raw" for decoded pixels
        crc32        the stored CRC-32 of the payload
        checksum_ok  whether the payload still matches it (a listing never stops at damage)

    Raises:
        UsageError: both ``head`` and ``index`` given, a negative ``head``, or an index out of range.
    """
    if head is not None and index is not None:
        raise UsageError("give head or index, not both")
    if head is not None and (not isinstance(head, int) or head < 0):
        raise UsageError(f"head must be 0 or more, not {head!r}")
    with opened(store) as s:
        if index is not None:
            if not isinstance(index, int) or not 0 <= index < len(s):
                raise UsageError(
                    f"record {index!r} out of range: {s.path} has {len(s)} records (0..{len(s) - 1})"
                )
            return [_describe(s, index, s.record(index, verify=False))]
        records = s.records() if head is None else islice(s.records(), head)
        return [_describe(s, i, record) for i, record in enumerate(records)]


def _describe(store: Store, index: int, record: Record) -> dict[str, Any]:
    shard, offset = store.locate(index)
    labels = [int(v) for v in record.labels]
    return {
        "index": index,
        "shard": store.manifest.shards[shard].file,
        "offset": offset,
        "labels": labels,
        "classes": _label_names(store, labels),
        "path": record.path,
        "bytes": len(record.data),
        "shape": [int(v) for v in record.shape],
        "format": record.format,
        "crc32": int(record.crc32),
        "checksum_ok": checksum(record.data) == record.crc32,
    }


# -- extract ------------------------------------------------------------------------------


def _format_of_suffix(suffix: str) -> str | None:
    Image.init()
    return Image.registered_extensions().get(suffix.lower())


def _suffix_of_format(fmt: str) -> str:
    if fmt in _SUFFIX_OF:
        return _SUFFIX_OF[fmt]
    Image.init()
    for suffix, name in Image.registered_extensions().items():
        if name == fmt:
            return suffix
    return ".png"


def extract(store: StoreLike, index: int, out_path: Path | str) -> Path:
    """Write record ``index``'s image to ``out_path`` and return the path written.

    - An encoded payload (the source file's bytes, or the pack's re-encoding) whose format is
      the one ``out_path``'s suffix names (``.jpg``/``.jpeg`` for JPEG, ``.png`` for PNG, ...)
      is written byte for byte: ``out.jpg`` gets the stored JPEG, EXIF and all.
    - Otherwise (another suffix, or raw pixels) the record is decoded as ``store[index]``
      would be (upright, the store's colour mode) and saved by Pillow in the suffix's format;
      JPEG at quality 95, dropping any alpha channel.
    - A path without a suffix gets the natural one: the payload's own (``.jpg``, ``.png``,
      ...), or ``.png`` for raw pixels.

    The record's checksum is verified first.

    Raises:
        UsageError: index out of range, or a suffix Pillow cannot write.
        CorruptRecordError: the record fails its checksum or does not decode.
    """
    out = Path(out_path)
    with opened(store) as s:
        if not isinstance(index, int) or not 0 <= index < len(s):
            raise UsageError(
                f"record {index!r} out of range: {s.path} has {len(s)} records (0..{len(s) - 1})"
            )
        record = s.record(index)
        stored = None if record.format == "raw" else _SAME_AS.get(record.format, record.format)
        if not out.suffix:
            out = out.with_name(out.name + _suffix_of_format(stored or "PNG"))
        wanted = _format_of_suffix(out.suffix)
        if wanted is None or wanted not in Image.SAVE:
            raise UsageError(
                f"cannot write {out.name}: Pillow has no writer for {out.suffix!r}; "
                "use e.g. .png, .jpg, .webp, .bmp or .tif"
            )
        if stored is not None and stored == wanted:
            _written(out, lambda out: out.write_bytes(bytes(record.data)))
            return out
        pixels, _ = s[index]  # upright, the store's mode; verified and decoded like the reader
        im = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
        options: dict[str, Any] = {}
        if wanted == "JPEG":
            options["quality"] = _JPEG_QUALITY
            if im.mode in ("RGBA", "LA"):
                im = im.convert("RGB" if im.mode == "RGBA" else "L")
        try:
            _written(out, lambda out: im.save(out, wanted, **options))
        except (OSError, ValueError, KeyError) as e:  # the encoder's, not the file system's
            raise UsageError(f"cannot save record {index} as {wanted}: {e}") from e
    return out


def _written(out: Path, write: Callable[[Path], object]) -> None:
    """``write(out)``; a place that cannot take the file (read-only, immutable, no
    permission, full) is a one-line error naming it."""
    try:
        write(out)
    except OSError as e:
        if e.errno is None:  # an encoder's error, for the caller
            raise
        raise PackerError(f"{out}: cannot write it: {e.strerror}") from e


# -- throughput ---------------------------------------------------------------------------


def bench_store(store: StoreLike, *, seconds: float = 5.0, batch_size: int = 256) -> dict[str, Any]:
    """Is the device or packer the limit? Three reads of this store on this machine, each
    from a cold page cache (the store's pages dropped first, where the OS lets us) and each
    cut off after ``seconds``:

        device     the shard files read front to back in 1 MB reads: what the storage
                   gives to a sequential reader, the ceiling for training
        reader     ``open_reader(store, batch_size=batch_size, seed=0, decode=False)``,
                   epoch 0: shuffled chunks read ahead, CRC checks, no decoding
        decoded    the same, decoding in the reader's thread pool (all cores)
            each with: images (how many were read), seconds, images_per_s, mb_per_s (10**6
            bytes per second; of the files for device, of the payloads for the others) and
            complete (True when the whole store was read in time)

    Also ``records``, ``batch_size``, ``cold`` (False where the OS kept the store's pages:
    then the figures are of memory, not of the device), ``bound`` ("device", "packer" or
    "decoding": what limits the reader, in a sentence in ``verdict``), and ``accelerators``:
    what decodes JPEGs ("libjpeg-turbo", or "Pillow: " and why) and what computes CRC-32s.

    Raises:
        UsageError: ``seconds`` not positive or ``batch_size`` not a positive integer.
    """
    if not seconds > 0:
        raise UsageError(f"seconds must be positive, not {seconds!r}")
    positive(batch_size=batch_size)
    with opened(store) as s:
        n, path = len(s), s.path
        files = [s.path / info.file for info in s.manifest.shards]
        if s.manifest.backend == "pytables":
            files = [s.path]
    cold = drop_cached(files)
    device = read_files(files, seconds)
    images = round(n * device.pop("fraction"))  # records in the bytes read, about
    device.update(images=images, images_per_s=round(images / device["seconds"], 1))
    figures = {"device": device}
    for name, decode in (("reader", False), ("decoded", True)):
        drop_cached(files)
        with open_reader(path, batch_size=batch_size, seed=0, decode=decode) as reader:
            started = time.perf_counter()
            for _images, _labels in reader.epoch(0):
                if time.perf_counter() - started >= seconds:
                    break
            stats = reader.stats()
        figures[name] = {
            "images": int(stats["images"]),
            "seconds": float(stats["seconds"]),
            "images_per_s": float(stats["images_per_s"]),
            "mb_per_s": float(stats["mb_per_s"]),
            "complete": int(stats["images"]) == n,
        }
    bound, verdict = _bound(figures)
    off = jpeg_turbo.why_off()
    return {
        "records": n,
        "batch_size": batch_size,
        "cold": cold,
        **figures,
        "bound": bound,
        "verdict": verdict,
        "accelerators": {
            "jpeg": "libjpeg-turbo" if off is None else f"Pillow: {off}",
            "crc32": CRC32_BY,
        },
    }


def _bound(figures: dict[str, dict[str, Any]]) -> tuple[str, str]:
    device, reader, decoded = figures["device"], figures["reader"], figures["decoded"]
    if device["complete"] and device["seconds"] < 1.0:
        return "none", (
            f"the whole store reads in {device['seconds']:.2f} s: too little to tell the device's "
            "speed from packer's"
        )
    # Payload megabytes against file megabytes: a store's files are a few % larger.
    share = reader["mb_per_s"] / max(device["mb_per_s"], 1e-9)
    if share < 0.9:
        return "packer", (
            f"the reader gets {share:.2f} of the device's sequential rate: packer is the limit"
        )
    if decoded["images_per_s"] < 0.9 * reader["images_per_s"]:
        return "decoding", (
            f"the reader reads at the device's speed ({share:.2f} of it); decoding on this "
            f"machine's cores is the limit ({decoded['images_per_s']:,.0f} images/s)"
        )
    return "device", (
        f"the reader reads at the device's speed ({share:.2f} of it) and decodes as fast: "
        "the device is the limit"
    )


def drop_cached(files: Sequence[Path]) -> bool:
    """Ask the OS to drop ``files``' pages from its cache, so the next read comes from the
    device; False where it cannot be asked (no posix_fadvise). Pages that a process maps
    or that are being written stay."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def read_files(files: Sequence[Path], seconds: float = math.inf) -> dict[str, Any]:
    """``files`` read front to back in 1 MB reads, cut off after ``seconds``: bytes,
    seconds, mb_per_s, complete, and the fraction of their bytes read."""
    total = sum(f.stat().st_size for f in files)
    buffer = memoryview(bytearray(1 << 20))
    nbytes = 0
    started = time.perf_counter()
    complete = True
    for file in files:
        with open(file, "rb", buffering=0) as f:
            while n := f.readinto(buffer):
                nbytes += n
                if time.perf_counter() - started >= seconds:
                    break
        if time.perf_counter() - started >= seconds:
            complete = nbytes >= total
            break
    elapsed = max(time.perf_counter() - started, 1e-6)
    return {
        "bytes": nbytes,
        "seconds": round(elapsed, 6),
        "mb_per_s": round(nbytes / 1e6 / elapsed, 1),
        "complete": complete,
        "fraction": nbytes / total if total else 1.0,
    }
