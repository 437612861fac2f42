"""LMDB blocks (format 5): the recipe in docs/format.md reads them with plain lmdb, a store is
about the size of its files, and stores of format 4 (one record a value) still do everything."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from format4 import as_format4
from helpers import held_by_a_thread, rewrite_lmdb_record, run_in_child, write_image

from packer import PackOptions, open_reader, open_store, pack, read_manifest
from packer.cli import cli
from packer.errors import StoreError
from packer.inspect.convert import convert_store
from packer.inspect.unpack import unpack_store
from packer.store import lmdb_blocks, lmdb_store
from packer.store.lmdb_store import LmdbShardReader
from packer.store.verify import verify_store

DOCS = Path(__file__).resolve().parents[1] / "docs" / "format.md"
_MARK = "<!-- tested: read a record of a blocks shard with plain lmdb -->"


def _recipe() -> Any:
    """The read_record function of docs/format.md's recipe, run as the page shows it."""
    text = DOCS.read_text()
    found = re.search(re.escape(_MARK) + r"\s*```python\n(.*?)```", text, re.S)
    assert found, "the recipe's code block is not under its marker in docs/format.md"
    namespace: dict[str, Any] = {}
    exec(compile(found.group(1), str(DOCS), "exec"), namespace)
    return namespace["read_record"]


def _folder(root: Path, count: int, size: tuple[int, int]) -> Path:
    for i in range(count):
        ext = ".png" if i % 2 else ".jpg"
        write_image(root / f"c{i % 3}" / f"{i:03d}{ext}", size=size, seed=i)
    return root


def test_the_format_page_recipe_reads_every_record_with_plain_lmdb(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_store, "BLOCK_BYTES", 16 << 10)  # many blocks, some records alone
    source = _folder(tmp_path / "images", 30, (48, 40))
    write_image(source / "c0" / "big.png", size=(120, 100), seed=99)  # ~36 KB: a block alone
    store = tmp_path / "s.lmdb"
    pack(source, store, PackOptions(seed=3, workers=1, shards=2))
    manifest = read_manifest(store)
    with open_store(store) as opened:  # closed before plain lmdb opens the files
        expected = [(bytes(r.data), r.labels, r.path) for r in opened.records()]
        blocks = sum(len(opened.shard(n).meta["block_starts"]) // 8 for n in range(2))
    assert blocks > 4
    read_record = _recipe()
    got = [
        read_record(str(store / shard.file), i)
        for shard in manifest.shards
        for i in range(shard.num_records)
    ]
    assert [(bytes(data), labels, path) for data, labels, path in got] == expected


@pytest.mark.parametrize("backend", ["lmdb", "hdf5"])
def test_a_store_of_small_files_is_about_their_size(tmp_path: Path, backend: str) -> None:
    """300 noise images of 1-3 KB: one value a record made an LMDB store about 1.5x its
    files (a 4 KB page each); blocks make it their size plus a few bytes a record."""
    source = _folder(tmp_path / "images", 300, (24, 20))
    files = sum(p.stat().st_size for p in source.rglob("*") if p.is_file())
    store = tmp_path / ("s.lmdb" if backend == "lmdb" else "s.h5")
    pack(source, store, PackOptions(backend=backend, seed=0, workers=1))  # type: ignore[arg-type]
    shards = sum(s.bytes for s in read_manifest(store).shards)
    assert shards <= 1.05 * files + (32 << 10), (shards, files)


VARIANTS = {
    "records": {},
    "columns": {"raw": True, "size": (8, 8)},
    "raw records": {"raw": True},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_format_4_store_still_reads_verifies_unpacks_converts_and_grows(
    image_dir: Path, tmp_path: Path, variant: str
) -> None:
    extra = VARIANTS[variant]
    store = tmp_path / "old.lmdb"
    pack(image_dir, store, PackOptions(seed=2, workers=1, **extra))  # type: ignore[arg-type]
    with open_store(store) as opened:
        expected = [(bytes(r.data), r.labels, r.path) for r in opened.records()]
        pixels = opened[5][0]
    as_format4(store)
    assert read_manifest(store).format_version == 4
    shard = store / read_manifest(store).shards[0].file
    reader = LmdbShardReader(shard)
    layout = reader.meta["layout"]
    reader.close()
    assert layout == ("records" if variant != "columns" else "columns")

    with open_store(store) as opened:  # random access and the records in order
        assert [(bytes(r.data), r.labels, r.path) for r in opened.records()] == expected
        assert (opened[5][0] == pixels).all()
    with open_reader(store, batch_size=4, decode=False, with_paths=True) as loader:
        seen = sorted(p for _, _, paths in loader for p in paths)
    assert seen == sorted(path for _, _, path in expected)
    assert verify_store(store).ok
    runner = CliRunner()
    head = runner.invoke(cli, ["inspect", str(store), "--head", "3"])
    assert head.exit_code == 0 and expected[0][2] in head.output
    one = tmp_path / "one.png"
    extracted = runner.invoke(cli, ["inspect", str(store), "--extract", "0", str(one)])
    assert extracted.exit_code == 0 and one.stat().st_size > 0, extracted.output
    unpacked = unpack_store(store, tmp_path / "files")
    assert unpacked.files == len(expected)
    converted = tmp_path / "c.h5"
    convert_store(store, converted)
    with open_store(converted) as opened:
        assert [(bytes(r.data), r.labels, r.path) for r in opened.records()] == expected

    more = tmp_path / "more"
    write_image(more / "cat" / "new.png", size=(20, 18), seed=77)
    pack(more, store, PackOptions(seed=2, workers=1, append=True, **extra))  # type: ignore[arg-type]
    grown = read_manifest(store)
    assert grown.format_version == 5 and len(grown.shards) == 2
    layouts = []
    for info in grown.shards:
        reader = LmdbShardReader(store / info.file)
        layouts.append(reader.meta["layout"])
        reader.close()
    assert layouts == [layout, "blocks"]  # the old shard kept as it was, the new one in blocks
    with open_store(store) as opened:
        paths = [r.path for r in opened.records()]
    assert paths[: len(expected)] == [path for _, _, path in expected]
    assert paths[len(expected) :] == ["cat/new.png"]
    assert verify_store(store).ok


def _blocks_of(reader: Any) -> int:
    """The blocks of the first shard of ``reader``'s store."""
    return len(reader._producer._open_stores()[0].shard(0).meta["block_starts"]) // 8


def _parses(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the block headers parsed from here on (a list: one entry a parse)."""
    parsed: list[int] = []
    real = lmdb_blocks.parse_block

    def counted(*args: Any, **kwargs: Any) -> Any:
        parsed.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(lmdb_blocks, "parse_block", counted)
    return parsed


def _held() -> list[tuple[tuple[int, int], Any]]:
    """The (shard reader, block) keys and headers the process's header cache holds now."""
    return list(lmdb_blocks._HEADERS._held.items())


def test_a_small_stores_headers_are_parsed_in_its_first_epoch_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lmdb_store, "BLOCK_BYTES", 4 << 10)  # a block or two a record
    store = tmp_path / "s.lmdb"
    pack(_folder(tmp_path / "images", 80, (32, 24)), store, PackOptions(seed=3, workers=1))
    parsed = _parses(monkeypatch)
    with open_reader(store, batch_size=8, chunk_size=4, buffer_chunks=2, with_paths=True) as r:
        first = [paths for _, _, paths in r.epoch(0)]
        blocks = _blocks_of(r)
        assert blocks > 40 and len(parsed) == blocks  # each once, though chunks cut blocks
        again = [paths for _, _, paths in r.epoch(0)]
        assert len(parsed) == blocks and again == first
        owner = r._producer._open_stores()[0].shard(0)._blocks._owner
    # Closed: its headers are let go.
    assert not [key for key in lmdb_blocks._HEADERS._held if key[0] == owner]


def test_headers_beyond_the_budget_are_parsed_each_epoch_and_those_kept_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose headers outgrow the budget: the cache keeps the headers it took first,
    epoch after epoch, and only the others are parsed again (a least-recently-used cache
    would let each go before an epoch in a new order came back to it)."""
    monkeypatch.setattr(lmdb_store, "BLOCK_BYTES", 4 << 10)
    store = tmp_path / "s.lmdb"
    pack(_folder(tmp_path / "images", 40, (32, 24)), store, PackOptions(seed=3, workers=1))
    with open_reader(store, batch_size=8, with_paths=True) as r:
        expected = [paths for _, _, paths in r.epoch(1)]
        owner = r._producer._open_stores()[0].shard(0)._blocks._owner
        sizes = [index.nbytes() for key, index in _held() if key[0] == owner]
    budget = sum(sizes) // 2
    monkeypatch.setattr(lmdb_blocks._HEADERS, "budget", budget)
    parsed = _parses(monkeypatch)
    # across_epochs=False: an epoch's parses are counted once it ends, and a producer gone on
    # into the next epoch would add that epoch's first blocks (seen once in CI)
    with open_reader(store, batch_size=8, with_paths=True, across_epochs=False) as r:
        blocks = _blocks_of(r)
        assert blocks == len(sizes) > 8
        kept_after = []
        for epoch in (0, 1):
            before = len(parsed)
            got = [paths for _, _, paths in r.epoch(epoch)]
            held = dict(_held())
            assert sum(index.nbytes() for index in held.values()) <= budget
            kept_after.append(set(held))
            if epoch == 1:  # each block not kept parsed again (twice where chunks cut it)
                assert blocks - len(held) <= len(parsed) - before <= 2 * (blocks - len(held))
        assert got == expected
        assert 0 < len(kept_after[0]) < blocks and kept_after[1] == kept_after[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks only where os.fork exists")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded")  # on purpose
def test_a_child_forked_while_the_header_cache_is_locked_reads(tmp_path: Path) -> None:
    """DataLoader workers fork while the parent's prefetch thread may hold the header
    cache's lock: the child must get it free and read, not wait forever."""
    store = tmp_path / "s.lmdb"
    pack(_folder(tmp_path / "images", 12, (16, 12)), store, PackOptions(seed=3, workers=1))

    def reads_every_record() -> bool:
        with open_store(store) as opened:
            return len(list(opened.records())) == 12

    with held_by_a_thread(lmdb_blocks._HEADERS._lock):  # as a reader's thread holds it
        run_in_child(reads_every_record, seconds=20)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks only where os.fork exists")
def test_a_forked_child_starts_with_the_whole_budget(tmp_path: Path) -> None:
    """The parent's headers would fill a child's budget with headers of shard readers the
    child never uses: the child parses and keeps its own."""
    store = tmp_path / "s.lmdb"
    pack(_folder(tmp_path / "images", 12, (16, 12)), store, PackOptions(seed=3, workers=1))
    with open_store(store) as opened:
        assert len(list(opened.records())) == 12
        assert _held()  # the parent keeps its headers while its store is open

        def parses_and_keeps_its_own() -> bool:
            if _held() or lmdb_blocks._HEADERS._bytes:
                return False
            with open_store(store) as mine:
                return len(list(mine.records())) == 12 and bool(_held())

        run_in_child(parses_and_keeps_its_own, seconds=20)


def test_a_raw_record_of_the_wrong_size_is_named(tmp_path: Path) -> None:
    """A block whose header is whole but one of whose raw records is short (its offsets say
    so): the read names the record and its size, where the rows would shift."""
    store = tmp_path / "s.lmdb"
    source = _folder(tmp_path / "images", 30, (16, 12))
    pack(source, store, PackOptions(seed=3, workers=1, raw=True, size=(8, 8)))
    rewrite_lmdb_record(store, 17, data=bytes(8 * 8 * 3 - 3))
    with open_reader(store, batch_size=8, shuffle=False) as r, pytest.raises(StoreError) as caught:
        for _ in r.epoch(0):
            pass
    message = str(caught.value)
    assert "\n" not in message and "record 17 has 189 payload bytes" in message, message
    assert "needs 192" in message
