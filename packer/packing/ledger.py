"""What an unfinished pack has done, kept beside its shards so that it can resume.

    OUT.partial/
        pack.json              what is being packed: a fingerprint of inputs and options, the seed
        shard-00003.lmdb       a shard, finished or not
        shard-00003.done.json  written only once the shard is on disk and hashed

A shard with its ``.done.json`` (and the size that file records) is kept by a resumed pack;
any other shard file is redone from scratch. The done file carries everything the manifest
needs from that shard, so a resumed pack never reads a finished shard again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packer.packing.options import PackOptions
from packer.packing.scan import Skipped
from packer.packing.source import Source
from packer.packing.stats import RecordStats
from packer.store.manifest import PACK_PLAN, SHARD_DONE_SUFFIX, ShardInfo, fsync_path

__all__ = ["Ledger", "PackIdentity", "ShardResult", "inputs_digest"]

log = logging.getLogger(__name__)

# Options that change how a pack runs, never what it writes: a resume may differ in these.
_RUN_ONLY = ("workers", "overwrite", "resume", "seed", "dask")


@dataclass
class ShardResult:
    """One finished shard and what the manifest needs to know of it."""

    info: ShardInfo
    stats: RecordStats
    skipped: list[Skipped] = field(default_factory=list)
    source_bytes: int = 0  # bytes of the source files packed into it
    shapes: list[tuple[int, int, int]] = field(default_factory=list)  # first two distinct
    resumed: bool = False  # finished by an earlier run (not saved: true only when read back)

    def add_shape(self, shape: tuple[int, int, int]) -> None:
        if len(self.shapes) < 2 and shape not in self.shapes:
            self.shapes.append(shape)

    def to_json(self) -> dict[str, Any]:
        return {
            "info": asdict(self.info),
            "stats": self.stats.to_json(),
            "skipped": [[s.path, s.reason] for s in self.skipped],
            "source_bytes": self.source_bytes,
            "shapes": [list(s) for s in self.shapes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ShardResult:
        return cls(
            ShardInfo.from_json(data["info"]),
            RecordStats.from_json(data["stats"]),
            [Skipped(path, reason) for path, reason in data["skipped"]],
            int(data["source_bytes"]),
            [(int(h), int(w), int(c)) for h, w, c in data["shapes"]],
            resumed=True,
        )


@dataclass(frozen=True)
class PackIdentity:
    """What makes two packs the same pack: the same files, labels and output options."""

    source_root: str
    files: int
    inputs_sha256: str  # over every (path, size, labels) and every skipped file, in order
    options: dict[str, Any]
    seed: int | None  # the seed the user gave; None: drawn at random and kept in pack.json
    base: str = ""  # for an append: the store as it was (its records and shards)

    @classmethod
    def of(cls, src: Source, options: PackOptions, base: str = "") -> PackIdentity:
        chosen = {k: v for k, v in options.to_json().items() if k not in _RUN_ONLY}
        return cls(
            str(src.root.resolve()), len(src.items), inputs_digest(src), chosen, options.seed, base
        )

    def difference(self, saved: dict[str, Any]) -> str | None:
        """Why an unfinished pack described by ``saved`` is not this pack; None if it is."""
        if saved.get("base", "") != self.base:
            return f"the store changed since (it had {saved.get('base')}, now {self.base})"
        if saved.get("source_root") != self.source_root:
            return f"it packs {saved.get('source_root')}, not {self.source_root}"
        if saved.get("inputs_sha256") != self.inputs_sha256:
            was = saved.get("files")
            return (
                f"the source folder changed since (it had {was} files, now {self.files})"
                if was != self.files
                else "files in the source folder changed since (paths, sizes or labels)"
            )
        old = saved.get("options") or {}
        changed = sorted(
            k for k in set(old) | set(self.options) if old.get(k) != self.options.get(k)
        )
        if changed:
            return "the options differ: " + ", ".join(
                f"--{k.replace('_', '-')} was {old.get(k)!r}, now {self.options.get(k)!r}"
                for k in changed
            )
        if self.seed is not None and saved.get("seed") != self.seed:
            return f"it was packed with --seed {saved.get('seed')}, not {self.seed}"
        return None


def inputs_digest(src: Source) -> str:
    """sha256 over the label columns, every (path, size, labels) and every skipped file, in
    order: what tells one pack's inputs from another's."""
    digest = hashlib.sha256()
    for column in src.columns:
        digest.update(json.dumps(column.to_json()).encode())
    for item in src.items:
        digest.update(f"{item.path}\0{item.size}\0{item.labels}\n".encode())
    for skipped in src.skipped:
        digest.update(f"{skipped.path}\0{skipped.reason}\n".encode())
    return digest.hexdigest()


class Ledger:
    """Reads and writes the resume records inside one staging folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def saved_plan(self) -> dict[str, Any] | None:
        """The pack.json of an unfinished pack in this folder, or None if there is none."""
        try:
            data = json.loads((self.folder / PACK_PLAN).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def begin(self, identity: PackIdentity, seed: int, num_shards: int) -> None:
        _write_json(
            self.folder / PACK_PLAN, {**asdict(identity), "seed": seed, "shards": num_shards}
        )

    def finish(self, shard: Path, result: ShardResult) -> None:
        """Record ``shard`` as finished, once its bytes are durable."""
        fsync_path(shard)
        _write_json(_done_path(shard), result.to_json())

    def finished(self, shard: Path) -> ShardResult | None:
        """The result of ``shard`` if a previous run finished it and it is still intact."""
        try:
            result = ShardResult.from_json(json.loads(_done_path(shard).read_text("utf-8")))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("%s: unreadable resume record (%s); the shard is redone", shard, e)
            return None
        size = shard.stat().st_size if shard.exists() else None
        if result.info.file != shard.name or size != result.info.bytes:
            log.warning("%s: not the shard its resume record describes; it is redone", shard)
            return None
        return result

    def count_finished(self) -> int:
        return sum(1 for _ in self.folder.glob("*" + SHARD_DONE_SUFFIX))

    def clear(self, shard: Path) -> None:
        """Remove whatever an earlier run left of ``shard``, before it is written again."""
        for path in (_done_path(shard), shard, shard.with_name(shard.name + "-lock")):
            path.unlink(missing_ok=True)

    def forget(self) -> None:
        """Drop the resume records, once the manifest has taken their place."""
        for path in self.folder.glob("*" + SHARD_DONE_SUFFIX):
            path.unlink()
        (self.folder / PACK_PLAN).unlink(missing_ok=True)


def _done_path(shard: Path) -> Path:
    return shard.with_name(shard.name + SHARD_DONE_SUFFIX)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    temp = path.with_name(path.name + ".tmp")
    with open(temp, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, path)
    fsync_path(path.parent)
