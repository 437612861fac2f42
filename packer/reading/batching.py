"""From spans of records to finished batches: read a window, gather a batch, finish it.

    read_window (sequential reads) -> Ordered (each column put in yield order) -> .rows
      (a batch: slices, and raw pixels copied into its rows) -> finish_batch (verify, decode,
      collate)

``read_window`` and ``Ordered`` run in the reader's producer thread; ``finish_batch`` runs in
its pool of decode threads (CRC-32, libjpeg-turbo and Pillow release the GIL for the heavy part).
"""

from __future__ import annotations

import itertools
import logging
import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from packer.augment import Augment, record_rng
from packer.errors import CorruptRecordError
from packer.fork_gate import FORK_GATE
from packer.reading.batch_memory import BatchMemory
from packer.reading.epoch import Span
from packer.store.access import DAMAGE, Store, record_pixels
from packer.store.base import Fetched
from packer.store.record import Record, checksum
from packer.store.row_checks import rows_intact

__all__ = [
    "Window",
    "Batch",
    "read_window",
    "Ordered",
    "batch_labels",
    "concat",
    "split_window",
    "finish_batch",
    "merge_batches",
]

log = logging.getLogger(__name__)


@dataclass
class Window:
    """The records of a few spans, column by column: the shuffle buffer's contents."""

    data: np.ndarray | list[bytes | memoryview]  # (n, h, w, c) when every record has one shape
    labels: np.ndarray  # (n, label columns)
    paths: list[str]
    crc32: np.ndarray
    shapes: np.ndarray
    formats: list[str]
    shards: np.ndarray  # shard number of each record, for error messages
    indices: np.ndarray  # global record index of each record
    # Raw pixels checked as they were read: True where the CRC-32 matched. None: unchecked.
    intact: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.paths)

    def rows(self, start: int, stop: int, data: Any = None) -> Window:
        """Records ``start`` to ``stop``, as views and list slices (``data``: their payloads,
        where the caller has them apart)."""
        return Window(
            data=self.data[start:stop] if data is None else data,
            labels=self.labels[start:stop],
            paths=self.paths[start:stop],
            crc32=self.crc32[start:stop],
            shapes=self.shapes[start:stop],
            formats=self.formats[start:stop],
            shards=self.shards[start:stop],
            indices=self.indices[start:stop],
            intact=None if self.intact is None else self.intact[start:stop],
        )

    def picked(self, at: np.ndarray, data: Any = None) -> Window:
        """The records at positions ``at``, in that order, each column gathered (``data``:
        their payloads, where the caller has them apart)."""
        return Window(
            data=data if data is not None else _gathered(self.data, at),
            labels=self.labels[at],
            paths=_picked(self.paths, at),
            crc32=self.crc32[at],
            shapes=self.shapes[at],
            formats=_picked(self.formats, at),
            shards=self.shards[at],
            indices=self.indices[at],
            intact=None if self.intact is None else self.intact[at],
        )


@dataclass
class Batch:
    images: np.ndarray | list[Any]
    labels: Any  # ndarray (n,) for one label column, (n, k) for k columns, (n, 0) for none;
    # a tensor with output="torch"
    paths: list[str]
    skipped: int  # records dropped from this batch by on_error="skip"
    nbytes: int  # payload bytes read for it
    sources: Any = None  # a mixture's: the store each record came from (ndarray, or tensor)
    per_source: list[int] | None = None  # a mixture's: how many records each store gave


def read_window(
    store: Store,
    spans: Sequence[Span],
    rows: np.ndarray | None = None,
    verify: bool = False,
    fetched: Callable[[int], Fetched | None] | None = None,
) -> Window:
    """Read ``spans`` (one sequential read each) into one Window.

    ``fetched(k)``: the bytes of ``spans[k]`` where they were read ahead (packer.reading.readahead),
    taken from there rather than read again; asked for one span at a time, so that each
    span's bytes are let go once its records are read.

    Raw pixels of one shape land in the first rows of ``rows`` (an (n, h, w, c) array of at
    least the spans' records, which the caller keeps from window to window). With ``verify``
    their CRC-32s are checked as the window is read, in one CRC-32 pass (see row_checks),
    into the window's ``intact``.
    """
    total = sum(len(s) for s in spans)
    out = rows[:total] if rows is not None else None
    starts = store.manifest.shard_starts()
    blocks, row = [], 0
    for k, span in enumerate(spans):
        target = out[row : row + len(span)] if out is not None else None
        ahead = fetched(k) if fetched is not None else None
        try:
            with FORK_GATE:
                shard = store.shard(span.shard)
                blocks.append(shard.read_block(span.start, span.stop, target, ahead))
        except DAMAGE as e:
            raise store.unreadable(span.shard, span.start, span.stop, e, target) from e
        row += len(span)
    data = out if out is not None else [payload for block in blocks for payload in block.data]
    crc32 = np.concatenate([b.crc32 for b in blocks]) if blocks else np.zeros(0, np.uint32)
    return Window(
        data=data,
        labels=np.concatenate([b.labels for b in blocks]) if blocks else np.zeros((0, 0), np.int64),
        paths=_joined(b.paths for b in blocks),
        crc32=crc32,
        shapes=np.concatenate([b.shapes for b in blocks]) if blocks else np.zeros((0, 3), np.int32),
        formats=_joined(b.formats for b in blocks),
        shards=np.concatenate([np.full(len(s), s.shard) for s in spans])
        if spans
        else np.zeros(0, int),
        indices=np.concatenate(
            [np.arange(starts[s.shard] + s.start, starts[s.shard] + s.stop) for s in spans]
        )
        if spans
        else np.zeros(0, int),
        intact=rows_intact(out, crc32) if verify and out is not None else None,
    )


class Ordered:
    """A window's records in the order they are yielded, cut into batches front to back.

    Each column is put in that order once a window, not once a batch: per batch, a gather
    of every column cost more than a raw batch's pixels, and a mixture's batch, drawn from
    a window of each store, paid it twice. Raw pixels of one shape are the exception: they
    stay as read and are copied once, into the rows of each batch's own array. A clean
    window of them (see ``stored``) orders only what its batches carry, labels and paths:
    the other columns serve only the batch that crosses into the next window, which
    gathers its own.
    """

    def __init__(self, window: Window, order: np.ndarray) -> None:
        data = window.data
        self.order = order
        self.pixels = data if isinstance(data, np.ndarray) else None
        # Raw pixels whose every checksum matched as they were read (or were not to be
        # checked): a batch of them is finished once gathered (``stored``).
        intact = window.intact
        self.clean = self.pixels is not None and (intact is None or bool(intact.all()))
        # Every column in order but raw pixels (copied per batch); None for a clean window,
        # which keeps its columns as read (``as_read``) for the batch that crosses out of it.
        self.records: Window | None = None
        self.as_read: Window | None = None
        if self.clean:
            self.as_read = window
            self.paths, labels = _picked(window.paths, order), window.labels[order]
        else:
            self.records = window.picked(order, data=[] if self.pixels is not None else None)
            self.paths, labels = self.records.paths, self.records.labels
        self.labels = batch_labels(labels)  # what a batch of them carries

    def __len__(self) -> int:
        return len(self.order)

    def rows(self, start: int, stop: int, out: np.ndarray | None = None) -> Window:
        """Records ``start`` to ``stop`` of the order; ``out``: rows of a batch array to copy
        raw pixels into, so a batch that spans two windows is copied once, not gathered and
        then joined."""
        if self.pixels is None:
            assert self.records is not None
            return self.records.rows(start, stop)
        pixels = self._copied(start, stop, out)
        if self.as_read is not None:
            return self.as_read.picked(self.order[start:stop], pixels)
        assert self.records is not None
        return self.records.rows(start, stop, pixels)

    def stored(self, start: int, stop: int, out: np.ndarray) -> Batch:
        """Records ``start`` to ``stop`` of a clean window as a finished batch, their pixels
        copied into ``out``: what finish_batch makes of ``rows`` with nothing to do per
        image, without the Window in between (a raw batch's Python cost, twice over in a
        mixture)."""
        assert self.clean, "stored() is for clean raw windows"
        pixels = self._copied(start, stop, out)
        return Batch(pixels, self.labels[start:stop], self.paths[start:stop], 0, pixels.nbytes)

    def _copied(self, start: int, stop: int, out: np.ndarray | None) -> np.ndarray:
        assert self.pixels is not None
        # mode="clip": the order's indices are in range, and mode="raise" would copy through
        # a temporary buffer when given ``out``.
        return self.pixels.take(self.order[start:stop], axis=0, out=out, mode="clip")


def concat(parts: Sequence[Window], data: np.ndarray | None = None) -> Window:
    """One Window of ``parts`` back to back (a batch that spans two shuffle windows).

    ``data``: the parts' pixels, already side by side (gathered into one array's rows).
    """
    if len(parts) == 1:
        return parts[0]
    arrays = all(isinstance(p.data, np.ndarray) for p in parts)
    if data is None:
        data = np.concatenate([p.data for p in parts]) if arrays else None
    return Window(
        data=data if data is not None else [d for p in parts for d in p.data],
        labels=np.concatenate([p.labels for p in parts]),
        paths=_joined(p.paths for p in parts),
        crc32=np.concatenate([p.crc32 for p in parts]),
        shapes=np.concatenate([p.shapes for p in parts]),
        formats=_joined(p.formats for p in parts),
        shards=np.concatenate([p.shards for p in parts]),
        indices=np.concatenate([p.indices for p in parts]),
        intact=None
        if any(p.intact is None for p in parts)
        else np.concatenate([p.intact for p in parts]),
    )


def _picked(items: list[Any], order: np.ndarray) -> list[Any]:
    """``[items[i] for i in order]``, the loop in C: a list per column per batch, where
    the Python loop cost raw batches more than their pixels' copy."""
    if len(order) < 2:
        return [items[int(i)] for i in order]
    return list(operator.itemgetter(*order.tolist())(items))


def _gathered(data: np.ndarray | list[Any], at: np.ndarray) -> np.ndarray | list[Any]:
    return data[at] if isinstance(data, np.ndarray) else _picked(data, at)


def _joined(lists: Iterable[list[Any]]) -> list[Any]:
    """The lists one after another, as one list (the loop in C)."""
    return list(itertools.chain.from_iterable(lists))


def split_window(window: Window, parts: int) -> list[Window]:
    """``window`` in up to ``parts`` consecutive pieces of near-equal size (at least 8 records)."""
    pieces = max(1, min(parts, len(window) // 8))
    if pieces == 1:
        return [window]
    bounds = np.linspace(0, len(window), pieces + 1).astype(int).tolist()
    return [window.rows(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


def merge_batches(
    parts: list[Batch], stack: bool = True, memory: BatchMemory | None = None
) -> Batch:
    """The finished pieces of one batch, back in one Batch; with ``stack`` (no user collate),
    lists of images become one array when their shapes agree: one copy for the whole batch
    (into ``memory``, where given)."""
    if len(parts) == 1:
        batch = parts[0]
    else:
        batch = Batch(
            [image for part in parts for image in part.images],
            np.concatenate([part.labels for part in parts]),
            [path for part in parts for path in part.paths],
            sum(part.skipped for part in parts),
            sum(part.nbytes for part in parts),
        )
    if stack and isinstance(batch.images, list):
        batch.images = _stack(batch.images, memory)
    return batch


def batch_labels(labels: np.ndarray) -> np.ndarray:
    """A batch's labels from a window's (n, columns): (n,) for one label column."""
    return labels[:, 0] if labels.shape[1] == 1 else labels


def finish_batch(
    window: Window,
    *,
    store: Store,
    decode: bool,
    mode: str,
    verify: bool,
    on_error: str,
    transform: Callable[[np.ndarray], Any] | None,
    size: tuple[int, int] | None,
    fit: str,
    collate: Callable[[list[Any]], Any] | None,
    stop: threading.Event | None = None,
    augment: Augment | None = None,
    seed: int = 0,
    epoch: int = 0,
) -> Batch:
    """Verify checksums, decode, transform and collate one gathered batch.

    A bad record raises CorruptRecordError naming store, shard, record and original path,
    or with ``on_error="skip"`` is logged, counted and left out of the batch. Once ``stop``
    is set (the epoch was abandoned, or Ctrl-C), the next record raises Stopped instead.
    ``augment`` runs on each record with its draws keyed by (``seed``, ``epoch``, record).
    """
    # Raw pixels of one shape with nothing to do per image: the batch is already one array.
    # Only the checksums are per record (checked as read, into ``intact``), and a damaged
    # record sends the batch down the general path below, which names it.
    as_stored = transform is None and collate is None and size is None and augment is None
    checked = not verify or (window.intact is not None and bool(window.intact.all()))
    if isinstance(window.data, np.ndarray) and as_stored and checked:
        return Batch(window.data, batch_labels(window.labels), window.paths, 0, window.data.nbytes)
    images: list[Any] = []
    keep: list[int] = []
    # What the user's code gets must be writable; images bound for merge_batches' stack are
    # copied there anyway, so they are not copied here too.
    writable = transform is not None or collate is not None
    one_image = partial(
        _one_image,
        decode=decode,
        mode=mode,
        verify=verify,
        writable=writable,
        size=size,
        fit=fit,
        augment=augment,
        seed=seed,
        epoch=epoch,
    )
    for i in range(len(window)):
        if stop is not None and stop.is_set():
            raise Stopped("the epoch was stopped")
        try:
            image = one_image(window, i)
        except Exception as e:  # name the record it concerns, whatever went wrong
            reason = (
                str(e) if isinstance(e, _Damaged) else f"does not decode: {type(e).__name__}: {e}"
            )
            error = CorruptRecordError(
                str(store.path),
                store.manifest.shards[int(window.shards[i])].file,
                int(window.indices[i]),
                window.paths[i],
                reason,
            )
            if on_error != "skip":
                raise error from e
            log.warning("skipped %s", error)
            continue
        if transform is not None:
            try:
                image = transform(image)
            except Exception as e:  # the user's own code: re-raised as it is, with a pointer
                if hasattr(e, "add_note"):
                    e.add_note(
                        f"packer: in transform of record {int(window.indices[i])} ({window.paths[i]})"
                    )
                raise
        images.append(image)
        keep.append(i)
    labels = batch_labels(window.labels[keep] if len(keep) != len(window) else window.labels)
    if collate is not None:
        stacked: np.ndarray | list[Any] = collate(images)
    else:
        stacked = images  # stacked by merge_batches, once for the whole batch
    nbytes = (
        window.data.nbytes
        if isinstance(window.data, np.ndarray)
        else sum(len(d) for d in window.data)
    )
    return Batch(stacked, labels, [window.paths[i] for i in keep], len(window) - len(keep), nbytes)


def _one_image(
    window: Window,
    i: int,
    *,
    decode: bool,
    mode: str,
    verify: bool,
    writable: bool,
    size: tuple[int, int] | None,
    fit: str,
    augment: Augment | None,
    seed: int,
    epoch: int,
) -> Any:
    payload = window.data[i]
    if verify and not (
        window.intact[i] if window.intact is not None else checksum(payload) == window.crc32[i]
    ):
        raise _Damaged("checksum mismatch (the stored bytes are damaged)")
    if isinstance(payload, np.ndarray):  # raw pixels of the store's one shape
        if size is None and augment is None:
            return payload
        shape, fmt = payload.shape, "raw"
    elif decode or window.formats[i] == "raw":
        shape, fmt = window.shapes[i], window.formats[i]
    else:
        return bytes(payload)  # decode=False: the encoded bytes, for the user's own decoder
    h, w, c = (int(v) for v in shape)
    record = Record(payload, (), window.paths[i], 0, (h, w, c), fmt)
    if augment is not None:
        rng = record_rng(seed, epoch, int(window.indices[i])) if augment.random else None
        return record_pixels(record, mode, place=partial(augment.place, rng=rng))
    return record_pixels(record, mode, writable, size, fit, plain_first=True)


class Stopped(Exception):
    """A batch given up on because its epoch stopped; nobody waits for it."""


class _Damaged(Exception):
    """A payload that fails its checksum."""


def _stack(images: list[Any], memory: BatchMemory | None = None) -> np.ndarray | list[Any]:
    """One array when every image is an array of one shape (in ``memory``, where given and
    they share a type), else the list, every array in it writable (a transform may write in
    place)."""
    if images and all(isinstance(im, np.ndarray) for im in images):
        first = images[0]
        if all(im.shape == first.shape for im in images):
            out = None
            if memory is not None and all(im.dtype == first.dtype for im in images):
                out = memory.empty((len(images), *first.shape), first.dtype)
            return np.stack(images, out=out)
    return [
        im.copy() if isinstance(im, np.ndarray) and not im.flags.writeable else im for im in images
    ]
