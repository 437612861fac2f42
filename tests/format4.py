"""LMDB stores as packers of format 4 and before wrote them: one record a value.

``as_format4`` rewrites every shard of a freshly packed LMDB store the way the format 4 writer
laid it out ("records": a value per record, ``u32 n | msgpack meta | payload``; "columns" for
raw pixels of one shape: a value of pixels per record and a group of labels, CRC-32s and paths
per 4,096 records), with the manifest of format 4 to match, so that tests can check that such
stores still open, read, verify, unpack, convert and grow.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
from helpers import rewrite_manifest, shard_checksum

from packer import open_store
from packer.store.lmdb_store import (
    GROUP,
    META_KEY,
    PLACES,
    LmdbShardReader,
    _value_places,
    columns_key,
    record_key,
)
from packer.store.record import Record, pack_value


def as_format4(store: Path) -> None:
    """Rewrite the LMDB store at ``store`` (packed by this packer) as format 4 wrote it."""
    manifest = json.loads((store / "manifest.json").read_text())
    with open_store(store) as opened:
        shards = [
            (shard, [record for _, record in opened.indexed_records(number, verify=False)])
            for number, shard in enumerate(manifest["shards"])
        ]
    for shard, records in shards:
        file = store / shard["file"]
        reader = LmdbShardReader(file)
        meta = {k: v for k, v in reader.meta.items() if k not in ("block_starts", PLACES)}
        reader.close()
        file.unlink()
        _write_shard(file, meta, records)
        data = file.read_bytes()
        shard["bytes"], shard["checksum"] = len(data), shard_checksum(data)
    manifest["format_version"] = 4
    rewrite_manifest(store, manifest)


def _write_shard(file: Path, meta: dict[str, Any], records: list[Record]) -> None:
    env = lmdb.open(str(file), subdir=False, map_size=1 << 30, lock=False, meminit=True)
    columns = meta["raw_shape"] is not None
    with env.begin(write=True) as txn:
        for i, record in enumerate(records):
            txn.put(record_key(i), bytes(record.data) if columns else pack_value(record))
        if columns:
            for first in range(0, len(records), GROUP):
                group = records[first : first + GROUP]
                n = meta["num_label_columns"]
                value = {
                    "l": np.array([r.labels for r in group], "<i8")
                    .reshape(len(group), n)
                    .tobytes(),
                    "c": np.array([r.crc32 for r in group], "<u4").tobytes(),
                    "p": [r.path for r in group],
                }
                txn.put(columns_key(first), msgpack.packb(value))
    meta = (
        {**meta, "layout": "columns", "group": GROUP} if columns else {**meta, "layout": "records"}
    )
    smallest = min((len(txn_value) for txn_value in _values(env, len(records))), default=0)
    if records and smallest > env.stat()["psize"] // 2:
        places = _value_places(env, len(records))
        if places is not None:
            meta[PLACES] = places.astype("<u8").tobytes()
    with env.begin(write=True) as txn:
        txn.put(META_KEY, msgpack.packb(meta))
    env.sync(True)
    env.close()


def _values(env: lmdb.Environment, count: int) -> list[bytes]:
    with env.begin() as txn:
        return [txn.get(record_key(i)) for i in range(count)]
