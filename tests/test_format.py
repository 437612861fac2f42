"""The on-disk contract: record values and the manifest, including hostile manifests."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from helpers import shard_checksum

from packer.errors import IncompleteStoreError, ManifestError
from packer.store.manifest import (
    FORMAT_VERSION,
    Manifest,
    ShardInfo,
    Storage,
    read_manifest,
    write_manifest,
)
from packer.store.record import (
    BLOCK_BYTES,
    Record,
    block_value,
    checksum,
    pack_value,
    parse_block,
    read_source,
    unpack_value,
)


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


_LONG_NAME = "".join(hashlib.sha256(bytes([i])).hexdigest() for i in range(6))  # 384, unshrinkable


# msgpack writes a CRC (and a shape's numbers) in 1, 2, 3 or 5 bytes, zlib compresses the
# header by what it holds: the room left after the bytes read must hold it whatever the
# widths. A format name too long for that room gives a record the writer joins instead.
@pytest.mark.parametrize("crc", [0, 0x7F, 0xFF, 0xFFFF, 0x10000, 0xFFFFFFFF])
@pytest.mark.parametrize(
    ("shape", "fmt"),
    [((40, 64, 3), "JPEG"), ((2**31 - 1, 70_000, 4), "F" * 31), ((1, 1, 1), _LONG_NAME)],
)
def test_a_large_record_read_framed_is_the_block_block_value_writes(
    tmp_path: Path, crc: int, shape: tuple[int, int, int], fmt: str
) -> None:
    source = tmp_path / "a.jpg"
    source.write_bytes(_with_crc(np.random.default_rng(7).bytes(BLOCK_BYTES + 17), crc))
    data = source.read_bytes()
    args = (str(source), len(data), "d/a.jpg", (7, -2))
    framed = read_source(*args, framed=True).record(shape, fmt)
    assert framed.crc32 == crc and bytes(framed.data) == data
    assert (framed.value is not None) == (fmt != _LONG_NAME)
    joined = block_value([Record(data, (7, -2), "d/a.jpg", crc, shape, fmt)], 2)
    if framed.value is not None:
        assert bytes(framed.value) == joined
    index = parse_block(joined, 1, 2)
    assert (index.paths, index.formats, index.crc32.tolist()) == (["d/a.jpg"], [fmt], [crc])
    assert index.labels.tolist() == [[7, -2]] and index.shapes.tolist() == [list(shape)]
    plain = read_source(*args, framed=False).record(shape, fmt)
    assert plain.value is None and bytes(plain.data) == data and plain.crc32 == crc
    small = tmp_path / "small.jpg"  # a record that shares a block: never framed
    small.write_bytes(data[:1000])
    assert read_source(str(small), 1000, "s.jpg", (), framed=True).record(shape, fmt).value is None
    # The file changed since the scan: what it holds now is read, one byte past the size
    # expected at most, so that the caller sees the length differ.
    source.write_bytes(data + b"more")
    assert len(read_source(*args, framed=True).data) == len(data) + 1
    source.write_bytes(data[:-5])
    assert bytes(read_source(*args, framed=True).data) == data[:-5]


def _with_crc(data: bytes, crc: int) -> bytes:
    """``data`` and four bytes more, whose CRC-32 is ``crc``: each step of the CRC's register
    is undone from the wanted end state, then the bytes that lead there are worked out."""
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        table.append(c)
    by_top_byte = {entry >> 24: i for i, entry in enumerate(table)}
    indices, c = [], crc ^ 0xFFFFFFFF
    for _ in range(4):
        i = by_top_byte[c >> 24]
        indices.append(i)
        c = ((c ^ table[i]) << 8) & 0xFFFFFFFF
    tail, c = bytearray(), checksum(data) ^ 0xFFFFFFFF
    for i in reversed(indices):
        tail.append((c ^ i) & 0xFF)
        c = table[i] ^ (c >> 8)
    return data + bytes(tail)


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
            ShardInfo("shard-00000.lmdb", 2, 10, "xxh3_128:" + "ab" * 16, 5),
            ShardInfo("shard-00001.lmdb", 1, 10, "sha256:" + "cd" * 32, 5),
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
    ("backend", "extra"),
    [
        ("lmdb", {"raw": True, "size": (4, 4)}),
        ("lmdb", {}),
        ("hdf5", {"raw": True, "size": (4, 4)}),
    ],
)
def test_new_stores_are_format_5_and_format_1_and_2_stores_still_read_and_verify(
    image_dir: Path, tmp_path: Path, backend: str, extra: dict[str, object]
) -> None:
    """Packs, conversions and appends are written as format 5, whose shard checksums are
    xxh3-128 and whose manifest has a checksum of its own (an older packer refuses them as
    newer than it reads). A store an older packer wrote, with a sha256 per shard and no
    manifest checksum, still opens, and verify checks that sha256."""
    from packer import PackOptions, pack
    from packer.inspect.convert import convert_store
    from packer.store.verify import verify_store

    out = tmp_path / ("out.lmdb" if backend == "lmdb" else "out.h5")
    pack(image_dir, out, PackOptions(backend=backend, workers=1, **extra))  # type: ignore[arg-type]
    assert read_manifest(out).format_version == FORMAT_VERSION == 5
    other = "hdf5" if backend == "lmdb" else "lmdb"
    converted = convert_store(out, tmp_path / ("c.h5" if other == "hdf5" else "c.lmdb"))
    assert converted.format_version == 5
    more = tmp_path / "more"
    (more / "extra").mkdir(parents=True)
    (more / "extra" / "one.png").write_bytes((next(image_dir.rglob("*.png"))).read_bytes())
    options = PackOptions(backend=backend, workers=1, append=True, **extra)  # type: ignore[arg-type]
    pack(more, out, options)
    grown = read_manifest(out)
    assert grown.format_version == 5 and len(grown.shards) == 2
    for shard in grown.shards:
        assert shard.checksum == shard_checksum((out / shard.file).read_bytes())

    # As an older packer wrote it: format 2 (1 for what 2 did not change), a sha256 a shard.
    data = json.loads((out / "manifest.json").read_text())
    data["format_version"] = 2 if backend == "lmdb" and extra else 1
    del data["manifest_checksum"]  # format 4's
    sha256 = {}
    for shard in data["shards"]:
        del shard["checksum"]
        shard["sha256"] = sha256[shard["file"]] = hashlib.sha256(
            (out / shard["file"]).read_bytes()
        ).hexdigest()
    (out / "manifest.json").write_text(json.dumps(data))
    old = read_manifest(out)
    assert [s.checksum for s in old.shards] == [f"sha256:{sha256[s.file]}" for s in old.shards]
    assert verify_store(out).ok
    last = out / old.shards[-1].file
    last.write_bytes(last.read_bytes() + b"\0")  # one byte more: the sha256 no longer matches
    data["shards"][-1]["bytes"] += 1
    (out / "manifest.json").write_text(json.dumps(data))
    reasons = [p.reason for p in verify_store(out).problems]
    assert "sha256 mismatch: the file changed after it was packed" in reasons


def test_a_shard_has_exactly_one_well_formed_checksum(tmp_path: Path) -> None:
    data = _manifest().to_json()
    for entry, message in [
        ({"checksum": "xxh3_128:" + "ab" * 15}, "checksum is"),  # too short
        ({"checksum": "md5:" + "ab" * 16}, "checksum is"),
        ({"checksum": "sha256:" + "AB" * 32}, "checksum is"),  # lower-case hex only
        ({"sha256": "ab" * 32}, "one checksum"),  # both
    ]:
        changed = json.loads(json.dumps(data))
        changed["shards"][0].update(entry)
        with pytest.raises(ManifestError, match=message):
            read_manifest(_write_raw(tmp_path, changed))
    del data["shards"][0]["checksum"]  # neither
    with pytest.raises(ManifestError, match="one checksum"):
        read_manifest(_write_raw(tmp_path, data))


def test_size_histograms_bucket_by_the_power_of_two_at_or_below() -> None:
    """Exact at every power of two, however large: a float log2 put 2**53 - 1 with 2**53."""
    from packer.packing.stats import Distribution

    sizes = Distribution()
    for value in (0, 1, 2, 3, 4, 7, 8, 2**53 - 1, 2**53):
        sizes.add(value)
    assert dict(sizes.histogram) == {0: 1, 1: 1, 2: 2, 4: 2, 8: 1, 2**52: 1, 2**53: 1}
    assert (sizes.count, sizes.min, sizes.max, sizes.total) == (9, 0, 2**53, 2**54 + 24)
