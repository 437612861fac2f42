"""Look at a store before training on it: see its images, list its records, pull one out,
measure how well its order is mixed, and time how fast this machine reads it.

Every function takes a ``Store`` (from ``open_store``) or a store's path; a store opened
here from a path is closed before the function returns. Nothing here prints: each function
returns plain data (or writes the one file it was asked to), for the CLI or a notebook to show.

    contact_sheet   a PNG grid of a seeded sample (or of one class), each image labelled
    list_records    where records live and what they hold: shard, offset, labels, path, shape
    extract         one record's image as a file (its original bytes when they fit the suffix)
    shuffle_quality label runs and per-chunk / per-batch label mix, vs a random permutation
    bench_store     images/s and MB/s, reading payloads only and reading + decoding
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from packer import epoch as plan
from packer.access import Store
from packer.errors import UsageError
from packer.reader import _default_chunk_size, open_reader
from packer.record import Record, checksum

__all__ = [
    "LABEL_STRIP",
    "StoreLike",
    "contact_sheet",
    "list_records",
    "extract",
    "shuffle_quality",
    "bench_store",
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
def _opened(store: StoreLike) -> Iterator[Store]:
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


def _all_labels(store: Store) -> np.ndarray:
    """Every record's labels in store order, (num_records, label columns) int64.

    HDF5: each shard's small ``/labels`` dataset, read whole. LMDB: a label is stored beside
    its payload, so this is one sequential pass over every record (``Store.records``).
    """
    columns = len(store.manifest.label_columns)
    n = len(store)
    if store.manifest.backend == "hdf5":
        parts = [np.zeros((0, columns), np.int64)]
        for info in store.manifest.shards:
            if info.num_records == 0:
                continue
            with h5py.File(store.path / info.file, "r", locking=False) as f:
                parts.append(np.asarray(f["labels"][:], np.int64).reshape(-1, columns))
        labels = np.concatenate(parts)
    else:
        labels = np.array([r.labels for r in store.records()], np.int64).reshape(n, columns)
    if len(labels) != n:
        raise UsageError(f"{store.path}: read {len(labels)} labels for {n} records")
    return labels


def _column(store: Store, label_column: int) -> dict[str, Any]:
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


def _positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value < 1:
            raise UsageError(f"{name} must be a positive integer, not {value!r}")


def _class_members(store: Store, class_name: str, label_column: int) -> np.ndarray:
    column = _column(store, label_column)
    values = _all_labels(store)[:, label_column]
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
    _positive(count=count, columns=columns, tile=tile)
    with _opened(store) as s:
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
    sheet.save(out_path, "PNG")
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
    with _opened(store) as s:
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
    with _opened(store) as s:
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
            out.write_bytes(bytes(record.data))
            return out
        pixels, _ = s[index]  # upright, the store's mode; verified and decoded like the reader
        im = Image.fromarray(pixels[:, :, 0] if pixels.shape[2] == 1 else pixels)
        options: dict[str, Any] = {}
        if wanted == "JPEG":
            options["quality"] = _JPEG_QUALITY
            if im.mode in ("RGBA", "LA"):
                im = im.convert("RGB" if im.mode == "RGBA" else "L")
        try:
            im.save(out, wanted, **options)
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"cannot save record {index} as {wanted}: {e}") from e
    return out


# -- shuffle quality ----------------------------------------------------------------------


def _runs(codes: np.ndarray) -> tuple[float, float]:
    """(mean, max) length of the runs of equal consecutive labels."""
    if len(codes) == 0:
        return 0.0, 0.0
    starts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    lengths = np.diff(np.concatenate(([0], starts, [len(codes)])))
    return float(len(codes) / len(lengths)), float(lengths.max())


def _group_tv(codes: np.ndarray, groups: np.ndarray, p: np.ndarray) -> tuple[float, float]:
    """(mean, max) over groups of the total-variation distance between a group's label
    distribution and ``p``. ``codes`` are labels 0..K-1, ``groups`` group ids 0..G-1.

    TV = 1/2 sum_k |q_k - p_k| = 1/2 (1 + sum over labels present in the group of
    (|q_k - p_k| - p_k)), so only the (group, label) pairs that occur are counted: memory
    O(records), however many classes.
    """
    if len(codes) == 0:
        return 0.0, 0.0
    k = len(p)
    sizes = np.bincount(groups)
    pairs, counts = np.unique(groups.astype(np.int64) * k + codes, return_counts=True)
    group, label = pairs // k, pairs % k
    share = counts / sizes[group]
    excess = np.bincount(group, weights=np.abs(share - p[label]) - p[label], minlength=len(sizes))
    tv = 0.5 * (1.0 + excess)
    tv = tv[sizes > 0]
    return float(tv.mean()), float(tv.max())


def _reader_order(
    shard_sizes: Sequence[int], chunk_size: int, buffer_chunks: int, seed: int, epoch: int
) -> np.ndarray:
    """Global record indices in the order a single-process reader (rank 0 of 1, no DataLoader
    workers, shuffle on) yields them in ``epoch``: the plan of ``Reader._gathered``, no I/O."""
    starts = np.concatenate(([0], np.cumsum(shard_sizes)[:-1])).astype(np.int64)
    spans = plan.chunk_spans(shard_sizes, chunk_size)
    order = plan.shuffled_chunks(spans, seed, epoch)
    mine = plan.take_share(plan.take_share(order, 0, 1, "drop"), 0, 1, "uneven")
    stream = (seed, epoch, 0, 1, 0, 1)
    parts = [np.zeros(0, np.int64)]
    for number, window in enumerate(plan.windows(mine, buffer_chunks)):
        indices = np.concatenate(
            [np.arange(starts[s.shard] + s.start, starts[s.shard] + s.stop) for s in window]
        )
        parts.append(indices[plan.window_order(len(indices), stream, number)])
    return np.concatenate(parts)


def _ratio(value: float, baseline: float) -> float:
    return value / baseline if baseline > 0 else 1.0


def shuffle_quality(
    store: StoreLike,
    *,
    chunk_size: int | None = None,
    buffer_chunks: int = 8,
    seed: int = 0,
    label_column: int = 0,
    epochs: int = 1,
    batch_size: int = 256,
    trials: int = 5,
) -> dict[str, Any]:
    """How well mixed the store's order is, and what the reader makes of it, from labels only.

    Reads every record's label in ``label_column`` (HDF5: the small labels datasets; LMDB:
    one sequential pass over the records), never decodes an image, and compares against
    ``trials`` uniform random permutations of the same labels (seeded by ``seed``), so every
    figure has its "as if perfectly shuffled" baseline beside it.

    Statistics:
        run length   lengths of the runs of equal consecutive labels; a sorted store has runs
                     as long as its classes, a well shuffled one about 1 / (1 - sum p_k^2).
        TV           total-variation distance between a group's label distribution and the
                     whole store's, 1/2 sum_k |q_k - p_k|: 0 for a perfect sample, near 1 for a
                     group of one class among many. Even a random group of m records is at
                     some distance (about sqrt(K / m) / 2 for K classes), hence the baselines.

    Returns a dict::

        records, classes (distinct labels), label_column, chunk_size, buffer_chunks,
        batch_size, epochs, trials, seed       the inputs, and chunk_size when defaulted
        stored: the order in the shards (what chunks the reader reads)
            mean_run, max_run                  run lengths in store order
            random_mean_run, random_max_run    the same, averaged over the random permutations
            run_ratio                          mean_run / random_mean_run (1: as random)
            chunk_tv                           mean TV over chunks of chunk_size (as the reader
                                               cuts them: never across shards)
            random_chunk_tv                    the same over the random permutations
            tv_ratio                           chunk_tv / random_chunk_tv (1: as random)
        reader: the order ``open_reader(store, batch_size=batch_size, chunk_size=chunk_size,
            buffer_chunks=buffer_chunks, seed=seed)`` yields (one process, shuffle on), built
            with ``packer.epoch`` exactly as the reader builds it, averaged over ``epochs``
            epochs (max_* fields: the worst epoch)
            mean_run, max_run, random_mean_run, random_max_run, run_ratio
                                               as above, over the epoch's record stream
            batch_tv, max_batch_tv             mean and worst TV over its batches
            random_batch_tv, random_max_batch_tv  the same for batches of a random permutation
            tv_ratio                           batch_tv / random_batch_tv (1: as random)

    A ratio is 1.0 when its baseline is 0 (a single class). Ratios near 1 (say under 1.2)
    mean batches look like random samples; raise buffer_chunks (more chunks mixed per window)
    or lower chunk_size when the reader's ratios are high, which is what a store packed with
    ``--no-shuffle`` needs.

    Raises:
        UsageError: a store without labels, a label column out of range, or a non-positive
            chunk_size, buffer_chunks, epochs, batch_size or trials.
    """
    _positive(buffer_chunks=buffer_chunks, epochs=epochs, batch_size=batch_size, trials=trials)
    if chunk_size is not None:
        _positive(chunk_size=chunk_size)
    with _opened(store) as s:
        _column(s, label_column)
        values = _all_labels(s)[:, label_column]
        sizes = [info.num_records for info in s.manifest.shards]
        if chunk_size is None:
            chunk_size = _default_chunk_size(s.manifest.stats, len(s))
    n = len(values)
    _, codes = np.unique(values, return_inverse=True)
    codes = codes.reshape(-1).astype(np.int64)
    p = np.bincount(codes) / max(n, 1)

    spans = plan.chunk_spans(sizes, chunk_size)
    chunk_of = np.repeat(np.arange(len(spans)), [len(sp) for sp in spans])
    batch_of = np.arange(n) // batch_size

    rng = np.random.default_rng([seed, 0x5EED])
    random: dict[str, list[float]] = {"mean_run": [], "max_run": [], "chunk_tv": []}
    random.update({"batch_tv": [], "max_batch_tv": []})
    for _ in range(trials):
        shuffled = codes[rng.permutation(n)]
        mean_run, max_run = _runs(shuffled)
        random["mean_run"].append(mean_run)
        random["max_run"].append(max_run)
        random["chunk_tv"].append(_group_tv(shuffled, chunk_of, p)[0])
        batch_tv, max_batch_tv = _group_tv(shuffled, batch_of, p)
        random["batch_tv"].append(batch_tv)
        random["max_batch_tv"].append(max_batch_tv)
    baseline = {key: float(np.mean(v)) for key, v in random.items()}

    mean_run, max_run = _runs(codes)
    chunk_tv = _group_tv(codes, chunk_of, p)[0]
    stored = {
        "mean_run": mean_run,
        "max_run": max_run,
        "random_mean_run": baseline["mean_run"],
        "random_max_run": baseline["max_run"],
        "run_ratio": _ratio(mean_run, baseline["mean_run"]),
        "chunk_tv": chunk_tv,
        "random_chunk_tv": baseline["chunk_tv"],
        "tv_ratio": _ratio(chunk_tv, baseline["chunk_tv"]),
    }

    runs, max_runs, tvs, max_tvs = [], [], [], []
    for epoch in range(epochs):
        order = codes[_reader_order(sizes, chunk_size, buffer_chunks, seed, epoch)]
        epoch_run, epoch_max = _runs(order)
        epoch_tv, epoch_max_tv = _group_tv(order, batch_of, p)
        runs.append(epoch_run)
        max_runs.append(epoch_max)
        tvs.append(epoch_tv)
        max_tvs.append(epoch_max_tv)
    reader_run, reader_tv = float(np.mean(runs)), float(np.mean(tvs))
    reader = {
        "mean_run": reader_run,
        "max_run": float(max(max_runs)),
        "random_mean_run": baseline["mean_run"],
        "random_max_run": baseline["max_run"],
        "run_ratio": _ratio(reader_run, baseline["mean_run"]),
        "batch_tv": reader_tv,
        "max_batch_tv": float(max(max_tvs)),
        "random_batch_tv": baseline["batch_tv"],
        "random_max_batch_tv": baseline["max_batch_tv"],
        "tv_ratio": _ratio(reader_tv, baseline["batch_tv"]),
    }
    return {
        "records": n,
        "classes": len(p),
        "label_column": label_column,
        "chunk_size": chunk_size,
        "buffer_chunks": buffer_chunks,
        "batch_size": batch_size,
        "epochs": epochs,
        "trials": trials,
        "seed": seed,
        "stored": stored,
        "reader": reader,
    }


# -- throughput ---------------------------------------------------------------------------


def bench_store(store: StoreLike, *, seconds: float = 5.0, batch_size: int = 256) -> dict[str, Any]:
    """Read throughput of this store on this machine, two ways, each for at most ``seconds``
    (a small store is read once, whole; a big one is cut off after ``seconds``).

    Returns::

        records        records in the store
        sequential     payloads read in store order (``Store.records``), not verified or
                       decoded: the storage's speed, a ceiling for training
        decoded        ``open_reader(store, batch_size=batch_size, seed=0)``, epoch 0, as a
                       training loop with an instant step sees it: shuffled chunks, CRC checks,
                       decoding in the reader's thread pool (all cores)
            each with: images (how many were measured), seconds, images_per_s, mb_per_s
                       (payload megabytes, 10**6 bytes, per second) and complete (True when
                       the whole store was read in time)

    The operating system's page cache is not dropped: a store read moments ago (the first
    pass warms it for the second) reads at memory speed, not at disk speed.

    Raises:
        UsageError: ``seconds`` not positive or ``batch_size`` not a positive integer.
    """
    if not seconds > 0:
        raise UsageError(f"seconds must be positive, not {seconds!r}")
    _positive(batch_size=batch_size)
    with _opened(store) as s:
        n, path = len(s), s.path
        images = nbytes = 0
        started = time.perf_counter()
        for record in s.records():
            images += 1
            nbytes += len(record.data)
            if time.perf_counter() - started >= seconds:
                break
        elapsed = max(time.perf_counter() - started, 1e-9)
    sequential = {
        "images": images,
        "seconds": round(elapsed, 3),
        "images_per_s": round(images / elapsed, 1),
        "mb_per_s": round(nbytes / 1e6 / elapsed, 1),
        "complete": images == n,
    }

    with open_reader(path, batch_size=batch_size, seed=0) as reader:
        started = time.perf_counter()
        for _images, _labels in reader.epoch(0):
            if time.perf_counter() - started >= seconds:
                break
        stats = reader.stats()
    decoded = {
        "images": int(stats["images"]),
        "seconds": float(stats["seconds"]),
        "images_per_s": float(stats["images_per_s"]),
        "mb_per_s": float(stats["mb_per_s"]),
        "complete": int(stats["images"]) == n,
    }
    return {"records": n, "batch_size": batch_size, "sequential": sequential, "decoded": decoded}
