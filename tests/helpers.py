"""What the tests share besides fixtures: real image bytes made with Pillow, stores edited as
packer writes them, the packer command run as a process, and process checks. Imported as
``from helpers import ...`` (pytest puts this folder on the path); fixtures are in conftest.py."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import xxhash
from PIL import Image

SHARED = Path(__file__).resolve().parents[2] / "shared"

# What a viewer shows for each EXIF orientation, written with NumPy (independent of Pillow).
EXIF_DISPLAY: dict[int, Callable[[np.ndarray], np.ndarray]] = {
    1: lambda a: a,
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: np.rot90(np.fliplr(a), 1),
    6: lambda a: np.rot90(a, -1),
    7: lambda a: np.rot90(np.fliplr(a), -1),
    8: lambda a: np.rot90(a, 1),
}


def shard_checksum(data: bytes) -> str:
    """What a manifest of this format records for a shard file's bytes, computed here."""
    return f"xxh3_128:{xxhash.xxh3_128(data).hexdigest()}"


def image_bytes(
    size: tuple[int, int] = (32, 24),
    fmt: str = "JPEG",
    seed: int = 0,
    mode: str = "RGB",
    **save: object,
) -> bytes:
    """Real encoded image bytes: (width, height) of seeded noise in ``mode``."""
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    pixels = rng.integers(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    im = Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels, mode)
    return encoded(im, fmt, **save)


def encoded(im: Image.Image, fmt: str, **options: object) -> bytes:
    """``im`` as Pillow saves it in ``fmt`` (with its save ``options``)."""
    out = io.BytesIO()
    im.save(out, fmt, **options)
    return out.getvalue()


def write_image(path: Path, **kwargs: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fmt = {".jpg": "JPEG", ".jpeg": "JPEG", ".png": "PNG", ".webp": "WEBP", ".bmp": "BMP"}[
        path.suffix
    ]
    path.write_bytes(image_bytes(fmt=str(kwargs.pop("fmt", fmt)), **kwargs))  # type: ignore[arg-type]
    return path


def rewrite_manifest(store: Path, data: object) -> None:
    """Save an edited manifest (a dict loaded from manifest.json) as packer writes one, with its
    own checksum made to match: the edit is what a test looks at, not the checksum."""
    from packer.store.manifest import manifest_bytes

    assert isinstance(data, dict)
    (store / "manifest.json").write_bytes(manifest_bytes(data))


def store_path(tmp_path: Path, backend: str, name: str = "out") -> Path:
    return tmp_path / (name + (".lmdb" if backend == "lmdb" else ".h5"))


def pack_three_ways(root: Path, into: Path, seed: int, shards: int) -> dict[str, Path]:
    """``root`` packed as LMDB and HDF5 originals and as HDF5 raw 8x8: {"lmdb", "hdf5", "raw"}."""
    from packer import PackOptions, pack

    out = {}
    for name, backend, extra in [
        ("lmdb", "lmdb", {}),
        ("hdf5", "hdf5", {}),
        ("raw", "hdf5", {"raw": True, "size": (8, 8)}),
    ]:
        out[name] = store_path(into, backend, name)
        options = PackOptions(backend=backend, seed=seed, workers=2, shards=shards, **extra)  # type: ignore[arg-type]
        pack(root, out[name], options)
    return out


def corpus_dir() -> Path:
    corpus = SHARED / "corpus" / "pillow-odd"
    if not corpus.is_dir():
        pytest.skip(
            f"shared corpus not found at {corpus} (it ships beside the project, not with it)"
        )
    return corpus


def packer_command(*args: object, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``packer ARGS`` run as a real process, as a user runs it."""
    command = [sys.executable, "-m", "packer", *map(str, args)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(
    done: subprocess.CompletedProcess[str], *names: object, code: int = 1
) -> str:
    """The run failed with exit status ``code`` and said why in one line on stderr, naming
    each of ``names``, with no traceback; returns that line."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr and len(lines) == 1, done.stderr
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    return lines[0]


def rewrite_as_legacy_hdf5(shard: Path) -> None:
    """Rewrite a packer HDF5 shard as packer wrote it before its metadata carried checksums:
    h5py's default file format (superblock v0) and ``/paths`` as variable-length UTF-8 strings
    in HDF5's global heap, the datasets created in the order that writer created them."""
    import h5py

    with h5py.File(shard, "r") as f:
        columns = {name: f[name][()] for name in f}
        payload = "images" if "images" in f else "data"
        filters = {"compression": f[payload].compression, "chunks": f[payload].chunks}
        if f[payload].compression == "gzip":
            filters["compression_opts"] = f[payload].compression_opts
        # The attributes as str: h5py writes a str as a variable-length string, as then.
        names, meta = (
            bytes(a).decode() for a in (f["formats"].attrs["format_names"], f.attrs["packer"])
        )
    path_bytes, path_offsets = columns.pop("path_bytes").tobytes(), columns.pop("path_offsets")
    paths = [path_bytes[a:b].decode() for a, b in zip(path_offsets[:-1], path_offsets[1:])]
    values = columns.pop(payload)
    with h5py.File(shard, "w", track_order=False) as f:
        extensible = (None, *values.shape[1:])
        written = f.create_dataset(
            payload,
            (0, *values.shape[1:]),
            np.uint8,
            maxshape=extensible,
            track_times=False,
            fill_time="never",
            **filters,
        )
        written.resize(values.shape)
        written[...] = values
        for name in ("offsets", "labels", "crc32", "shapes", "formats"):
            if name in columns:
                f.create_dataset(name, data=columns[name], track_times=False)
        f["formats"].attrs["format_names"] = names
        f.create_dataset("paths", data=paths, dtype=h5py.string_dtype("utf-8"), track_times=False)
        f.attrs["packer"] = meta


def rewrite_lmdb_record(store: Path, index: int, **changes: object) -> object:
    """Change fields of record ``index`` of an LMDB store in place (its block written anew,
    the shard's read-ahead places dropped, as they no longer hold), and fix the manifest's
    shard size and checksum, so that the record is the only thing wrong with the store.
    Returns the changed record."""
    import bisect

    import lmdb
    import msgpack

    from packer.store.lmdb_blocks import block_starts, record_key
    from packer.store.manifest import read_manifest, write_manifest
    from packer.store.record import Record, block_value, parse_block

    manifest = read_manifest(store)
    starts = manifest.shard_starts()
    shard = max(s for s, start in enumerate(starts) if start <= index)
    info = manifest.shards[shard]
    path = store / info.file
    env = lmdb.open(str(path), subdir=False, lock=False, max_dbs=0)
    try:
        with env.begin(write=True) as txn:
            meta = msgpack.unpackb(txn.get(b"__packer__"))
            blocks = block_starts(meta, meta["num_records"]).tolist()
            local = index - starts[shard]
            number = bisect.bisect_right(blocks, local) - 1
            first, end = blocks[number], [*blocks, meta["num_records"]][number + 1]
            value = txn.get(record_key(first))
            columns = meta["num_label_columns"]
            block = parse_block(value, end - first, columns)
            o = block.offsets.tolist()
            records = [
                Record(
                    value[o[k] : o[k + 1]],
                    tuple(block.labels[k].tolist()),
                    block.paths[k],
                    int(block.crc32[k]),
                    tuple(block.shapes[k].tolist()),  # type: ignore[arg-type]
                    block.formats[k],
                )
                for k in range(end - first)
            ]
            record = records[local - first]
            for name, new in changes.items():
                setattr(record, name, new)
            txn.put(record_key(first), block_value(records, columns, env.stat()["psize"]))
            meta.pop("value_places", None)
            txn.put(b"__packer__", msgpack.packb(meta))
    finally:
        env.close()
    data = path.read_bytes()
    info.bytes, info.checksum = len(data), shard_checksum(data)
    write_manifest(store, manifest)
    return record


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from Linux's /proc."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_in_child(body: Callable[[], bool], seconds: float = 5.0) -> None:
    """Runs ``body`` in a forked child; fails unless it returns True within ``seconds`` (a
    child that hangs is killed)."""
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        ok = False
        try:
            ok = body()
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + seconds
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail(f"the forked child hung for {seconds} s")
        time.sleep(0.01)
    assert os.waitstatus_to_exitcode(status) == 0


@contextlib.contextmanager
def held_by_a_thread(lock: contextlib.AbstractContextManager[object]) -> Iterator[None]:
    """``lock`` held by another thread while the block runs, as a reader's thread may hold
    it when the process forks."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        yield
    finally:
        release.set()
        holder.join()
