"""A reader's saved state: which run it belongs to, and how far that run's epoch has got.

    {"version": 2, "epoch": 3, "records_done": 1920, "phases": [{"world_size": 2, "workers": 1,
     "batch_size": 32, "drop_last": false, "batches": 30}], "seed": 0, "stores": [...], ...}

The run is named by what fixes an epoch's order: each store (name, records, a fingerprint of
its manifest), each store's records per epoch, the seed, chunk sizes, buffer (and, in a
mixture, each store's share of it), shuffle and remainder. The progress is the list of
phases (see packer.reading.lanes), which any world size or batch size can continue from,
and ``records_done``, the records all ranks together have used up: one number, checked
against the phases when the state is loaded. Plain ints, strings and lists, so json and
torch.save keep it as it is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from packer.errors import StateError
from packer.reading.lanes import Layout, Phase
from packer.store.manifest import Manifest

__all__ = ["VERSION", "fingerprint", "run_identity", "to_state", "from_state"]

# 2: each share's first window opens as it is read (epoch.opening_order); a state of version
# 1 would resume into another order.
VERSION = 2


def fingerprint(manifest: Manifest) -> str:
    """What tells one store from another, wherever it is copied to: its records, its shards'
    files and checksums, its shuffle seed and when it was made."""
    shards = [[s.file, s.num_records, s.checksum] for s in manifest.shards]
    made = [manifest.backend, manifest.num_records, shards, manifest.seed, manifest.created]
    return hashlib.sha256(json.dumps(made).encode()).hexdigest()[:16]


def run_identity(
    names: Sequence[str],
    manifests: Sequence[Manifest],
    quotas: Sequence[int],
    chunk_sizes: Sequence[int],
    *,
    seed: int,
    shuffle: bool,
    buffer_chunks: int,
    remainder: str,
    window_chunks: Sequence[int],
) -> dict[str, Any]:
    """The fields of a state that must match the reader that loads it; for a mixture, each
    store's share of the shuffle buffer too (``window_chunks``)."""
    mixture = {"window_chunks": list(window_chunks)} if len(names) > 1 else {}
    return {
        "stores": [
            {"name": name, "records": m.num_records, "fingerprint": fingerprint(m)}
            for name, m in zip(names, manifests, strict=True)
        ],
        "quotas": list(quotas),
        "seed": seed,
        "shuffle": shuffle,
        "chunk_sizes": list(chunk_sizes),
        "buffer_chunks": buffer_chunks,
        "remainder": remainder,
        **mixture,
    }


def to_state(
    identity: dict[str, Any], epoch: int, phases: Sequence[Phase], done: int
) -> dict[str, Any]:
    """A state to save: ``epoch`` read as far as ``phases`` took it, ``done`` records in all."""
    return {
        "version": VERSION,
        "epoch": epoch,
        "records_done": done,
        "phases": [
            {
                "world_size": p.layout.world_size,
                "workers": p.layout.workers,
                "batch_size": p.layout.batch_size,
                "drop_last": p.layout.drop_last,
                "batches": p.batches,
            }
            for p in phases
        ],
        **identity,
    }


def from_state(state: Any, identity: dict[str, Any]) -> tuple[int, tuple[Phase, ...], int]:
    """(epoch, phases, records_done) of a saved state, once it is known to be one of this
    run; anything else is refused with one line naming what differs or is damaged."""
    if not isinstance(state, dict):
        raise StateError(f"a reader state is a dict, not {type(state).__name__}")
    if "version" not in state and {"epoch", "batch"} <= set(state):
        raise StateError(
            "state has no store or layout (saved by packer 0.1): it cannot be resumed exactly"
        )
    if "window_chunks" in identity and "window_chunks" not in state and "version" in state:
        raise StateError(
            "state of a mixture saved by an older packer, which gave each store a whole "
            "shuffle buffer: its order cannot be resumed exactly"
        )
    for key in ("version", "epoch", "records_done", "phases", *identity):
        if key not in state:
            raise StateError(f"state is damaged: it has no {key!r}")
    if state["version"] == 1:
        raise StateError(
            "state saved by an older packer, which ordered the first window of each epoch "
            "otherwise: its order cannot be resumed exactly"
        )
    if state["version"] != VERSION:
        raise StateError(f"state has version {state['version']!r}; this packer reads {VERSION}")
    _check_run(state, identity)
    epoch, done = state["epoch"], state["records_done"]
    if not _whole(epoch) or not _whole(done):
        raise StateError(f"state is damaged: epoch {epoch!r}, records_done {done!r}")
    if not isinstance(state["phases"], list):
        raise StateError("state is damaged: 'phases' is not a list")
    return epoch, tuple(_phase(p, n) for n, p in enumerate(state["phases"])), done


def _check_run(state: dict[str, Any], identity: dict[str, Any]) -> None:
    saved, here = state["stores"], identity["stores"]
    if not isinstance(saved, list) or not all(isinstance(s, dict) for s in saved):
        raise StateError("state is damaged: 'stores' is not a list of stores")
    if len(saved) != len(here):
        raise StateError(
            f"state was saved reading {len(saved)} store(s), this reader reads {len(here)}"
        )
    for number, (was, now) in enumerate(zip(saved, here, strict=True)):
        if was != now:
            which = f"store {number} " if len(here) > 1 else ""
            raise StateError(
                f"state was saved from another {which}store: {_store(was)}; this reader "
                f"reads {_store(now)}"
            )
    for key, value in identity.items():
        if key != "stores" and state[key] != value:
            raise StateError(
                f"state was saved with {key} {state[key]!r}, this reader has {key} {value!r}: "
                "the epoch's order depends on it"
            )


def _store(entry: dict[str, Any]) -> str:
    return (
        f"{entry.get('name', '?')} ({entry.get('records', '?')} records, "
        f"fingerprint {entry.get('fingerprint', '?')})"
    )


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _phase(entry: Any, number: int) -> Phase:
    keys = ("world_size", "workers", "batch_size", "batches")
    if not isinstance(entry, dict) or not all(_whole(entry.get(k)) for k in keys):
        raise StateError(f"state is damaged: phase {number} is {entry!r}")
    if min(entry["world_size"], entry["workers"], entry["batch_size"]) < 1:
        raise StateError(f"state is damaged: phase {number} is {entry!r}")
    layout = Layout(
        entry["world_size"], entry["workers"], entry["batch_size"], bool(entry.get("drop_last"))
    )
    return Phase(layout, entry["batches"])
