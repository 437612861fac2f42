"""The on-disk contract: record values and the manifest, including hostile manifests."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from packer.errors import IncompleteStoreError, ManifestError
from packer.manifest import (
    FORMAT_VERSION,
    Manifest,
    ShardInfo,
    Storage,
    read_manifest,
    write_manifest,
)
from packer.record import Record, checksum, pack_value, unpack_value


def test_record_value_round_trip_with_zero_copy_payload() -> None:
    payload = bytes(range(256)) * 3
    record = Record(payload, (3, -1), "a/b c/ü.jpg", checksum(payload), (4, 5, 3), "JPEG")
    value = pack_value(record)
    back = unpack_value(memoryview(value))
    assert isinstance(back.data, memoryview) and back.data.obj is value  # a slice, not a copy
    assert bytes(back.data) == payload
    assert (back.labels, back.path, back.crc32, back.shape, back.format) == (
        (3, -1),
        "a/b c/ü.jpg",
        record.crc32,
        (4, 5, 3),
        "JPEG",
    )


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x01\x00",
        struct.pack("<I", 1 << 30) + b"xx",
        struct.pack("<I", 3) + b"\xc1\xc1\xc1",
        struct.pack("<I", 1) + b"\x01payload",
    ],
)
def test_damaged_record_values_raise_value_error(value: bytes) -> None:
    with pytest.raises(ValueError):
        unpack_value(value)


def _manifest(**changes: object) -> Manifest:
    fields: dict[str, object] = dict(
        backend="lmdb",
        num_records=3,
        shards=[
            ShardInfo("shard-00000.lmdb", 2, 10, "ab", 5),
            ShardInfo("shard-00001.lmdb", 1, 10, "cd", 5),
        ],
        storage=Storage("original", "RGB"),
        label_source="none",
        label_columns=[],
        seed=7,
        shuffled=True,
        packer_version="0.1.0",
        created="now",
    )
    fields.update(changes)
    return Manifest(**fields)  # type: ignore[arg-type]


def test_manifest_round_trip_and_shard_starts(tmp_path: Path) -> None:
    write_manifest(tmp_path, _manifest())
    back = read_manifest(tmp_path)
    assert back == _manifest()
    assert back.shard_starts() == [0, 2]
    assert list(json.loads((tmp_path / "manifest.json").read_text()))[:4] == [
        "format",
        "format_version",
        "backend",
        "num_records",
    ]


def _write_raw(tmp_path: Path, data: object) -> Path:
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    return tmp_path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format_version": FORMAT_VERSION + 1}, "newer than this packer understands"),
        ({"format": "something-else"}, "not a packer-store manifest"),
        ({"backend": "zip"}, "unknown backend 'zip'"),
        ({"num_records": 4}, "do not add up"),
        ({"num_records": 10**18}, "absurd record count"),
        (
            {
                "shards": [
                    {
                        "file": "../../etc/passwd",
                        "num_records": 3,
                        "bytes": 1,
                        "sha256": "",
                        "payload_bytes": 1,
                    }
                ]
            },
            "not a plain shard file name",
        ),
        ({"shards": [{"file": "shard-00000.lmdb"}]}, "malformed manifest"),
        ({"storage": None}, "malformed manifest"),
    ],
)
def test_hostile_manifests_get_clear_errors(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    data = _manifest().to_json()
    data.update(change)
    with pytest.raises(ManifestError, match=message):
        read_manifest(_write_raw(tmp_path, data))


def test_not_a_store_and_unfinished_store(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such store"):
        read_manifest(tmp_path / "out.lmdb")
    (tmp_path / "out.lmdb.partial").mkdir()
    with pytest.raises(IncompleteStoreError, match="not finished"):
        read_manifest(tmp_path / "out.lmdb")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ManifestError, match="not a packer store"):
        read_manifest(tmp_path / "folder")
    (tmp_path / "folder" / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="unreadable manifest"):
        read_manifest(tmp_path / "folder")


@pytest.mark.parametrize(
    ("backend", "extra", "version"),
    [
        ("lmdb", {"raw": True, "size": (4, 4)}, 2),  # the "columns" layout
        ("lmdb", {}, 1),
        ("hdf5", {"raw": True, "size": (4, 4)}, 1),
    ],
)
def test_a_store_is_labelled_with_the_oldest_format_that_reads_it(
    image_dir: Path, tmp_path: Path, backend: str, extra: dict[str, object], version: int
) -> None:
    """So an older packer still opens every store whose layout it knows."""
    from packer import PackOptions, pack
    from packer.convert import convert_store

    out = tmp_path / ("out.lmdb" if backend == "lmdb" else "out.h5")
    pack(image_dir, out, PackOptions(backend=backend, workers=1, **extra))  # type: ignore[arg-type]
    assert read_manifest(out).format_version == version
    other = "hdf5" if backend == "lmdb" else "lmdb"
    converted = convert_store(out, tmp_path / ("c.h5" if other == "hdf5" else "c.lmdb"))
    raw_lmdb = other == "lmdb" and "raw" in extra
    assert converted.format_version == (2 if raw_lmdb else 1)  # the target's layout decides
    more = tmp_path / "more"
    (more / "extra").mkdir(parents=True)
    (more / "extra" / "one.png").write_bytes((next(image_dir.rglob("*.png"))).read_bytes())
    options = PackOptions(backend=backend, workers=1, append=True, **extra)  # type: ignore[arg-type]
    pack(more, out, options)
    assert read_manifest(out).format_version == version  # what every shard needs, still
