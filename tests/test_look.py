"""packer.inspect.look on real packed stores: contact sheets, listings, extraction, shuffle quality
and the throughput bench. Tiles are recomputed from the source files, independently."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import store_path, write_image
from PIL import Image, ImageDraw, ImageFont

from packer import PackOptions, open_reader, open_store, pack
from packer.errors import UsageError
from packer.imaging import jpeg_turbo
from packer.inspect.look import (
    LABEL_STRIP,
    bench_store,
    contact_sheet,
    extract,
    list_records,
)
from packer.inspect.shuffle_report import shuffle_quality
from packer.store import record

CLASSES = ("ant", "bee", "cow", "dog")
PER_CLASS = 24
N = len(CLASSES) * PER_CLASS
# (width, height): square, wide, tall, small; letterboxing is tested both ways
SIZES = [(24, 24), (40, 12), (12, 40), (17, 29), (33, 21), (9, 9)]


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4 classes x 24 images, JPEG and PNG, six shapes: class-sorted by path."""
    root = tmp_path_factory.mktemp("look") / "images"
    n = 0
    for name in CLASSES:
        for i in range(PER_CLASS):
            ext = ".png" if i % 4 == 0 else ".jpg"
            write_image(root / name / f"{name}_{i:02d}{ext}", size=SIZES[i % len(SIZES)], seed=n)
            n += 1
    return root


@pytest.fixture(scope="module")
def stores(source: Path) -> dict[str, Path]:
    out = {}
    tmp = source.parent
    for backend in ("lmdb", "hdf5"):
        for kind, extra in [("shuffled", {"seed": 1}), ("sorted", {"shuffle": False})]:
            path = store_path(tmp, backend, f"{kind}-{backend}")
            pack(source, path, PackOptions(backend=backend, workers=2, shards=2, **extra))  # type: ignore[arg-type]
            out[f"{kind}-{backend}"] = path
    out["raw"] = store_path(tmp, "lmdb", "raw")
    pack(source, out["raw"], PackOptions(raw=True, seed=2, workers=2))
    return out


@pytest.fixture
def shuffled(stores: dict[str, Path], backend: str) -> Path:
    return stores[f"shuffled-{backend}"]


def _expected_tile(file: Path, tile: int) -> np.ndarray:
    """The letterboxed tile as documented: RGB, bilinear to fit, centred on black."""
    with Image.open(file) as im:
        im = im.convert("RGB")
        scale = min(tile / im.width, tile / im.height)
        size = (max(1, round(im.width * scale)), max(1, round(im.height * scale)))
        im = im.resize(size, Image.Resampling.BILINEAR)
        canvas = Image.new("RGB", (tile, tile))
        canvas.paste(im, ((tile - size[0]) // 2, (tile - size[1]) // 2))
    return np.asarray(canvas, dtype=np.int16)


def _expected_strip(text: str, tile: int) -> np.ndarray:
    strip = Image.new("RGB", (tile, LABEL_STRIP), (32, 32, 32))
    ImageDraw.Draw(strip).text((3, 2), text, (235, 235, 235), ImageFont.load_default())
    return np.asarray(strip, dtype=np.int16)


# -- contact sheet ------------------------------------------------------------------------


def test_contact_sheet_size_and_tiles(shuffled: Path, source: Path, tmp_path: Path) -> None:
    tile, columns = 48, 4
    out = tmp_path / "sheet.png"
    shown = contact_sheet(shuffled, out, count=10, columns=columns, tile=tile, seed=3)

    assert shown == sorted(np.random.default_rng(3).choice(N, 10, replace=False).tolist())
    with Image.open(out) as im:
        assert im.format == "PNG"
        assert im.size == (columns * tile, 3 * (tile + LABEL_STRIP))
        sheet = np.asarray(im.convert("RGB"), dtype=np.int16)

    store = open_store(shuffled)
    cell = tile + LABEL_STRIP
    for k, index in enumerate(shown):
        row, col = divmod(k, columns)
        x, y = col * tile, row * cell
        path = store.record(index).path  # "bee/bee_07.jpg": the tile is that file
        got = sheet[y : y + tile, x : x + tile]
        assert np.abs(got - _expected_tile(source / path, tile)).max() <= 1, (k, path)
        strip = sheet[y + tile : y + cell, x : x + tile]
        assert np.array_equal(strip, _expected_strip(path.split("/")[0], tile)), (k, path)
    for k in (10, 11):  # the unused cells of the last row stay black
        row, col = divmod(k, columns)
        assert not sheet[row * cell : (row + 1) * cell, col * tile : (col + 1) * tile].any()
    store.close()


def test_contact_sheet_default_grid_is_exact(shuffled: Path, tmp_path: Path) -> None:
    """More asked for than there are: every record, and the sheet still columns * tile wide."""
    shown = contact_sheet(shuffled, tmp_path / "all.png", count=500, tile=20, columns=8)
    assert shown == list(range(N))
    with Image.open(tmp_path / "all.png") as im:
        assert im.size == (8 * 20, (N // 8) * (20 + LABEL_STRIP))


def test_contact_sheet_one_class(shuffled: Path, tmp_path: Path) -> None:
    store = open_store(shuffled)
    shown = contact_sheet(store, tmp_path / "bee.png", count=6, tile=16, class_name="bee")
    assert len(shown) == 6 and shown == sorted(set(shown))
    assert all(store.record(i).labels == (CLASSES.index("bee"),) for i in shown)

    every = contact_sheet(store, tmp_path / "cow.png", count=100, tile=16, class_name="cow")
    assert every == [i for i in range(N) if store.record(i).labels == (CLASSES.index("cow"),)]
    assert len(every) == PER_CLASS

    with pytest.raises(UsageError, match=r"no class 'cat'.*classes: ant, bee, cow, dog"):
        contact_sheet(store, tmp_path / "x.png", class_name="cat")
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(UsageError, match="label column 3 out of range"):
        contact_sheet(store, tmp_path / "x.png", class_name="ant", label_column=3)
    with pytest.raises(UsageError, match="count must be a positive integer"):
        contact_sheet(store, tmp_path / "x.png", count=0)
    store.close()


def test_contact_sheet_raw_store(stores: dict[str, Path], source: Path, tmp_path: Path) -> None:
    shown = contact_sheet(stores["raw"], tmp_path / "raw.png", count=3, columns=3, tile=32)
    with Image.open(tmp_path / "raw.png") as im:
        sheet = np.asarray(im.convert("RGB"), dtype=np.int16)
    with open_store(stores["raw"]) as store:
        for k, index in enumerate(shown):
            path = store.record(index).path
            got = sheet[0:32, k * 32 : (k + 1) * 32]
            assert np.abs(got - _expected_tile(source / path, 32)).max() <= 1


# -- list_records, extract ----------------------------------------------------------------


def test_list_records_matches_store_record(shuffled: Path) -> None:
    store = open_store(shuffled)
    listed = list_records(store, head=5) + list_records(store, index=N - 1)
    assert [r["index"] for r in listed] == [0, 1, 2, 3, 4, N - 1]
    files = [s.file for s in store.manifest.shards]
    for row in listed:
        record = store.record(row["index"])
        shard, offset = store.locate(row["index"])
        assert row["shard"] == files[shard] and row["offset"] == offset
        assert row["labels"] == list(record.labels)
        assert row["classes"] == [CLASSES[record.labels[0]]]
        assert row["classes"][0] == row["path"].split("/")[0]
        assert row["path"] == record.path
        assert row["bytes"] == len(record.data)
        assert row["shape"] == list(record.shape)
        assert row["format"] == record.format
        assert row["crc32"] == record.crc32
        assert row["checksum_ok"] is True
    assert list_records(store, index=N - 1)[0]["shard"] == files[-1]
    assert len(list_records(store)) == N
    assert list_records(store, head=0) == []
    with pytest.raises(UsageError, match="out of range"):
        list_records(store, index=N)
    with pytest.raises(UsageError, match="not both"):
        list_records(store, head=1, index=1)
    store.close()


def test_extract_original_bytes(shuffled: Path, source: Path, tmp_path: Path) -> None:
    rows = list_records(shuffled)
    jpeg = next(r for r in rows if r["format"] == "JPEG")
    png = next(r for r in rows if r["format"] == "PNG")

    out = extract(shuffled, jpeg["index"], tmp_path / "a.jpg")
    assert out == tmp_path / "a.jpg"
    assert out.read_bytes() == (source / jpeg["path"]).read_bytes()
    assert extract(shuffled, jpeg["index"], tmp_path / "b.JPEG").read_bytes() == out.read_bytes()
    assert (
        extract(shuffled, png["index"], tmp_path / "c.png").read_bytes()
        == (source / png["path"]).read_bytes()
    )
    # no suffix: the payload's own
    assert extract(shuffled, jpeg["index"], tmp_path / "plain") == tmp_path / "plain.jpg"

    # another suffix: decoded and re-saved, the pixels the store decodes to
    with open_store(shuffled) as store:
        pixels, _ = store[jpeg["index"]]
    converted = extract(shuffled, jpeg["index"], tmp_path / "d.png")
    with Image.open(converted) as im:
        assert im.format == "PNG"
        assert np.array_equal(np.asarray(im.convert("RGB")), pixels)
    with pytest.raises(UsageError, match="no writer"):
        extract(shuffled, 0, tmp_path / "e.notaformat")
    with pytest.raises(UsageError, match="out of range"):
        extract(shuffled, -1, tmp_path / "f.png")


def test_extract_raw(stores: dict[str, Path], tmp_path: Path) -> None:
    with open_store(stores["raw"]) as store:
        pixels, _ = store[5]
        assert store.record(5).format == "raw"
        out = extract(store, 5, tmp_path / "raw.png")
        with Image.open(out) as im:
            assert im.format == "PNG"
            assert np.array_equal(np.asarray(im), pixels)
        assert extract(store, 5, tmp_path / "raw") == tmp_path / "raw.png"
        with Image.open(extract(store, 5, tmp_path / "raw.jpg")) as im:
            assert im.format == "JPEG" and im.size == (pixels.shape[1], pixels.shape[0])


# -- shuffle quality ----------------------------------------------------------------------


def test_reader_order_is_the_readers(shuffled: Path) -> None:
    """record_order (the plan shuffle_quality scores, no I/O) is exactly what the reader yields."""
    index_of = {r["path"]: r["index"] for r in list_records(shuffled)}
    options = {"chunk_size": 7, "buffer_chunks": 3, "seed": 5, "rank": 0, "world_size": 1}
    with open_reader(shuffled, batch_size=16, with_paths=True, **options) as reader:
        for epoch in (0, 2):
            got = [index_of[p] for _, _, paths in reader.epoch(epoch) for p in paths]
            assert got == reader.record_order(epoch).tolist()


def test_shuffle_quality_sorted_store(stores: dict[str, Path], backend: str) -> None:
    store = stores[f"sorted-{backend}"]
    narrow = shuffle_quality(store, chunk_size=8, buffer_chunks=2, batch_size=16, epochs=2)
    assert narrow["records"] == N and narrow["classes"] == len(CLASSES)
    stored = narrow["stored"]
    # class-sorted: one run per class, 24 long; random runs are about 1.3 long
    assert stored["mean_run"] == PER_CLASS and stored["max_run"] == PER_CLASS
    assert stored["mean_run"] > 5 * stored["random_mean_run"]
    assert stored["max_run"] > 3 * stored["random_max_run"]
    assert stored["run_ratio"] == pytest.approx(stored["mean_run"] / stored["random_mean_run"])
    # every chunk of 8 holds one class: TV = 1 - 1/4
    assert stored["chunk_tv"] == pytest.approx(0.75)
    assert stored["chunk_tv"] > 2 * stored["random_chunk_tv"]
    # two chunks per window: a batch of 16 holds at most 2 classes
    assert narrow["reader"]["batch_tv"] >= 0.5
    assert narrow["reader"]["tv_ratio"] > 1.5

    # every chunk in one window: the reader's order is a random permutation
    wide = shuffle_quality(store, chunk_size=8, buffer_chunks=N // 8, batch_size=16, epochs=2)
    assert wide["stored"] == stored  # the stored order does not depend on the reader
    assert 0.6 < wide["reader"]["tv_ratio"] < 1.5
    assert 0.6 < wide["reader"]["run_ratio"] < 1.5
    assert wide["reader"]["tv_ratio"] < narrow["reader"]["tv_ratio"]


def test_shuffle_quality_shuffled_store(shuffled: Path) -> None:
    result = shuffle_quality(shuffled, chunk_size=8, buffer_chunks=2, batch_size=16)
    for section in ("stored", "reader"):
        assert 0.6 < result[section]["run_ratio"] < 1.5, result
        assert 0.6 < result[section]["tv_ratio"] < 1.5, result
        assert all(isinstance(v, float) for v in result[section].values())
    assert result["stored"]["max_run"] < PER_CLASS / 2
    # the same seed gives the same figures; the default chunk size is the reader's
    assert shuffle_quality(shuffled, chunk_size=8, buffer_chunks=2, batch_size=16) == result
    assert shuffle_quality(shuffled)["chunk_size"] == open_reader(shuffled, batch_size=1).chunk_size
    with pytest.raises(UsageError, match="label column 1 out of range"):
        shuffle_quality(shuffled, label_column=1)
    with pytest.raises(UsageError, match="buffer_chunks must be a positive integer"):
        shuffle_quality(shuffled, buffer_chunks=0)


def test_shuffle_quality_needs_labels(source: Path, tmp_path: Path) -> None:
    store = tmp_path / "nolabels.lmdb"
    pack(source, store, PackOptions(labels="none", workers=2, check="header"))
    with pytest.raises(UsageError, match="no labels"):
        shuffle_quality(store)
    # a sheet of an unlabelled store names each tile by its index
    assert len(contact_sheet(store, tmp_path / "s.png", count=2, tile=16)) == 2
    with pytest.raises(UsageError, match="no labels"):
        contact_sheet(store, tmp_path / "s.png", class_name="ant")


# -- bench --------------------------------------------------------------------------------


def test_bench_store(shuffled: Path) -> None:
    result = bench_store(shuffled, seconds=2.0, batch_size=16)
    assert result["records"] == N
    for section in ("device", "reader", "decoded"):
        figures = result[section]
        assert figures["images"] == N and figures["complete"] is True, figures
        assert figures["images_per_s"] > 0 and figures["mb_per_s"] > 0
        assert figures["seconds"] > 0
    shard_files = [f for f in Path(shuffled).iterdir() if f.name.startswith("shard-")]
    assert result["device"]["bytes"] == sum(f.stat().st_size for f in shard_files)
    assert result["cold"] is True  # Linux: the store's pages were dropped before each read
    # A store this small reads whole in a blink: no claim about what limits it.
    assert result["bound"] == "none" and "too little to tell" in result["verdict"]
    fast = result["accelerators"]  # what this process uses, so a slow decode can be explained
    assert fast["crc32"] == ("zlib" if record._crc32 is zlib.crc32 else "ISA-L")
    assert (fast["jpeg"] == "libjpeg-turbo") == jpeg_turbo.ENABLED
    if not jpeg_turbo.ENABLED:
        assert fast["jpeg"].startswith("Pillow: ")


def test_bench_store_stops_early(shuffled: Path) -> None:
    result = bench_store(shuffled, seconds=1e-9, batch_size=16)
    assert 0 < result["device"]["bytes"] <= 1 << 20  # one read of 1 MB at most
    assert result["reader"]["images"] == result["decoded"]["images"] == 16
    assert not result["reader"]["complete"] and not result["decoded"]["complete"]
    with pytest.raises(UsageError, match="seconds must be positive"):
        bench_store(shuffled, seconds=0)


def test_bench_names_what_limits_the_reader() -> None:
    """The verdict of inspect --bench, from figures a slow disk and two cores would give."""
    from packer.inspect.look import _bound

    def figures(device: float, reader: float, raw_rate: float, decoded_rate: float) -> dict:
        part = {"complete": False, "seconds": 5.0}
        return {
            "device": {**part, "mb_per_s": device},
            "reader": {**part, "mb_per_s": reader, "images_per_s": raw_rate},
            "decoded": {**part, "mb_per_s": reader, "images_per_s": decoded_rate},
        }

    assert _bound(figures(120, 50, 600, 600))[0] == "packer"  # 0.42 of the device
    bound, verdict = _bound(figures(120, 115, 1400, 900))
    assert bound == "decoding" and "900 images/s" in verdict
    assert _bound(figures(120, 115, 1400, 1390))[0] == "device"
