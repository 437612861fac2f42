"""``pack --append``: new images join an existing store as new shards; a new manifest takes
the old one's place in one rename.

Existing shards, records and class indices never change; a class the store has not seen
gets the next free index. New shards are written beside the store, in ``OUT.append.partial``
(resumable like any pack), moved into the store once all are finished, and only then does
the new manifest replace the old. A reader that opened the store before keeps reading the
shards its manifest names, which are untouched.

The manifest records a digest of each pack's and each append's inputs (root folder, paths,
sizes, labels): an append whose inputs the store already holds adds nothing, so running the
same command again, after a kill that came after the commit, cannot add its images twice.
"""

from __future__ import annotations

import os
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from packer.errors import LabelsError, UsageError
from packer.packing.options import PackOptions
from packer.packing.source import LabelColumn, Source
from packer.packing.stats import RecordStats
from packer.store.manifest import Manifest, fsync_path, read_manifest, write_manifest

__all__ = ["appending_path", "open_base", "earlier_pack", "relabel", "grown", "add_shards"]

# How a record is stored: an appended image must be stored the way the others are.
_STORAGE_OPTIONS = (
    *("backend", "raw", "encode", "quality", "max_side", "size", "fit", "mode", "compression"),
)


def appending_path(store: Path) -> Path:
    """The staging folder of an append to ``store``: ``OUT.append.partial``."""
    return store.with_name(store.name + ".append.partial")


def open_base(store: Path, options: PackOptions) -> tuple[Manifest, PackOptions]:
    """The store's manifest, and ``options`` with the store's storage options: an option left
    at its default takes the store's value; one set to something else is an error."""
    base = read_manifest(store)
    defaults = PackOptions()
    recorded = base.options
    adopted: dict[str, Any] = {}
    conflicts = []
    for name in _STORAGE_OPTIONS:
        theirs = recorded.get(name)
        if name == "size" and theirs is not None:
            theirs = tuple(theirs)
        mine = getattr(options, name)
        if mine != theirs and mine != getattr(defaults, name) and name != "backend":
            conflicts.append(f"--{name.replace('_', '-')} {mine} (the store has {theirs})")
        adopted[name] = theirs
    if options.backend != base.backend:
        conflicts.append(f"a {options.backend} store (the store is {base.backend})")
    if conflicts:
        raise UsageError(
            f"{store}: appended images are stored the way the store's others are; "
            f"drop {', '.join(conflicts)}"
        )
    known = {f.name for f in fields(PackOptions)}
    return base, replace(options, **{k: v for k, v in adopted.items() if k in known})


def earlier_pack(base: Manifest, root: Path, digest: str) -> str | None:
    """When the store already holds the inputs of ``digest`` under ``root``: which pack or
    append put them there, in a few words; else None. Stores and appends from before this
    digest was recorded have none to match."""
    root_name = str(root.resolve())
    source = base.source
    if source.get("inputs_sha256") == digest and source.get("root") == root_name:
        return f"packed on {base.created}"
    appends = source.get("appends")
    for entry in appends if isinstance(appends, list) else []:
        if not isinstance(entry, dict):
            continue  # a store another tool made: nothing of ours to match
        if entry.get("inputs_sha256") == digest and entry.get("root") == root_name:
            first = entry["first_shard"]
            return (
                f"appended on {entry['created']} as shards {first}..{first + entry['shards'] - 1}"
            )
    return None


def relabel(src: Source, base: Manifest) -> Source:
    """``src`` with its labels in the store's numbering: a class the store knows keeps its
    index, a new one gets the next free index."""
    if src.label_source != base.label_source:
        raise LabelsError(
            f"{src.root}: labels come from {src.label_source}, "
            f"but the store's came from {base.label_source}; pass the same kind of labels"
        )
    names = [c["name"] for c in base.label_columns]
    if [c.name for c in src.columns] != names:
        raise LabelsError(
            f"{src.root}: label columns {[c.name for c in src.columns]} "
            f"differ from the store's {names}"
        )
    columns: list[LabelColumn] = []
    mappings: list[list[int] | None] = []
    for new, old in zip(src.columns, base.label_columns):
        known = old["classes"]
        if (new.classes is None) != (known is None):
            kind = "integers" if known is None else "class names"
            raise LabelsError(f"{src.root}: the store's column {new.name!r} holds {kind}")
        if known is None:
            columns.append(new)
            mappings.append(None)
            continue
        extended = list(known) + [c for c in (new.classes or ()) if c not in known]
        index = {name: i for i, name in enumerate(extended)}
        columns.append(LabelColumn(new.name, tuple(extended)))
        mappings.append([index[name] for name in new.classes or ()])
    labels = src.items.labels.copy()
    for column, mapping in enumerate(mappings):
        if mapping is not None:
            labels[:, column] = np.asarray(mapping, np.int64)[labels[:, column]]
    return Source(src.root, src.items.with_labels(labels), columns, src.label_source, src.skipped)


def grown(base: Manifest, added: Manifest) -> Manifest:
    """The manifest of ``base`` with ``added``'s shards after its own."""
    stats = RecordStats.from_json(base.stats)
    stats.merge(RecordStats.from_json(added.stats))
    shape = base.storage.shape if base.storage.shape == added.storage.shape else None
    history = {
        "root": added.source["root"],
        "files": added.source["files"],
        "packed_bytes": added.source["packed_bytes"],
        "inputs_sha256": added.source["inputs_sha256"],
        "records": added.num_records,
        "seed": added.seed,
        "created": added.created,
        "first_shard": len(base.shards),
        "shards": len(added.shards),
    }
    return replace(
        base,
        num_records=base.num_records + added.num_records,
        shards=base.shards + added.shards,
        storage=replace(base.storage, shape=shape),
        label_columns=added.label_columns,
        packer_version=added.packer_version,
        format_version=added.format_version,  # the manifest is written anew, in this format
        stats=stats.to_json(),
        skipped=base.skipped + added.skipped,
        source={**base.source, "appends": [*base.source.get("appends", []), history]},
    )


def add_shards(staged: Path, store: Path, manifest: Manifest, first: int) -> None:
    """Move the new shards (from index ``first``) into the store, then swap the manifest."""
    for shard in manifest.shards[first:]:
        os.replace(staged / shard.file, store / shard.file)
    fsync_path(store)
    write_manifest(store, manifest)
