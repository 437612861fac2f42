"""Stores from an untrusted source: no code runs, and every hostile manifest, shard file or
record value gets one clear PackerError naming the store (and shard, and record), from
open_store, open_reader and `packer inspect` alike: never a crash, a hang or a huge allocation.

Each hostile store is a real packed store edited on disk (manifest.json with json, LMDB values
with lmdb, HDF5 columns with h5py). All of them are probed in one child process with a 4 GiB
address-space limit and a timeout, so a regression shows up as a failed test, not a dead
runner: a crash names the case it died on, a huge allocation fails (or shows in the RSS).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h5py
import lmdb
import msgpack
import numpy as np
import pytest
import tables
from click.testing import CliRunner
from format4 import as_format4
from helpers import rewrite_manifest, shard_checksum, write_image

import packer
from packer import PackOptions, open_reader, open_store, pack
from packer.cli import cli
from packer.errors import StoreError
from packer.store.lmdb_store import META_KEY, columns_key, record_key

# -- no code from a store ---------------------------------------------------------------

_UNPICKLERS = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}
_RUNS_DATA = {"eval", "exec", "compile", "__import__", "yaml.load", "yaml.unsafe_load"}


class _CodeFromData(ast.NodeVisitor):
    """Finds, in a module's source, every way data could become code: an unpickler imported;
    eval/exec/compile; yaml.load; numpy or torch loads that allow pickles; and tables.open_file
    (PyTables unpickles attributes) anywhere but behind the guard, pytables_store._open_file."""

    def __init__(self) -> None:
        self.found: list[str] = []
        self.function = ""

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    def visit_Import(self, node: ast.Import) -> None:
        self._imports([alias.name for alias in node.names], node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        self._imports([node.module or ""], node)

    def _imports(self, modules: list[str], node: ast.AST) -> None:
        for module in modules:
            if module.split(".")[0] in _UNPICKLERS:
                self._flag(node, f"imports {module}")

    def visit_Call(self, node: ast.Call) -> None:
        name = ast.unparse(node.func)
        keywords = {k.arg: ast.unparse(k.value) for k in node.keywords}
        if name in _RUNS_DATA or name.endswith("read_pickle"):
            self._flag(node, name)
        elif name in ("np.load", "numpy.load") and keywords.get("allow_pickle") != "False":
            self._flag(node, f"{name} without allow_pickle=False")
        elif name == "torch.load" and keywords.get("weights_only") != "True":
            self._flag(node, "torch.load without weights_only=True")
        elif name == "tables.open_file" and self.function != "_open_file":
            self._flag(node, "tables.open_file without the attribute check")
        if keywords.get("allow_pickle") == "True":
            self._flag(node, "allow_pickle=True")
        self.generic_visit(node)

    def _flag(self, node: ast.AST, what: str) -> None:
        self.found.append(f"line {getattr(node, 'lineno', '?')}: {what}")


def _code_from_data(source: str) -> list[str]:
    visitor = _CodeFromData()
    visitor.visit(ast.parse(source))
    return visitor.found


def test_no_module_of_packer_can_run_code_from_a_store() -> None:
    package = Path(packer.__file__).parent
    sources = sorted(package.rglob("*.py"))
    assert len(sources) > 20
    found = {source.name: _code_from_data(source.read_text(encoding="utf-8")) for source in sources}
    assert {name: lines for name, lines in found.items() if lines} == {}
    assert "def _open_file(" in (package / "store" / "pytables_store.py").read_text()


_SAFE_SOURCE = """
'''Never pickle: msgpack.'''
import msgpack, re, yaml, pickletools
re.compile("x")
yaml.safe_load(f)
np.load(p, allow_pickle=False)
torch.load(p, weights_only=True)
def _open_file(p):
    return tables.open_file(p)
"""


def test_the_scan_finds_each_way_data_becomes_code() -> None:
    """The scan above can fail: each of these is found, and none of the safe forms is."""
    unsafe = [
        "import pickle",
        "from cloudpickle import loads",
        "import marshal as m",
        "eval(text)",
        "exec(code)",
        "yaml.load(f)",
        "np.load(p)",
        "np.load(p, allow_pickle=True)",
        "numpy.load(p, mmap_mode='r')",
        "torch.load(p)",
        "pandas.read_pickle(p)",
        "tables.open_file(p)",
    ]
    for line in unsafe:
        assert _code_from_data(line), line
    assert _code_from_data(_SAFE_SOURCE) == []


def refused_everywhere(path: Path, message: str) -> None:
    """open_store, open_reader and `packer inspect` all refuse ``path`` with ``message``."""
    with pytest.raises(StoreError, match=message):
        open_store(path)
    with pytest.raises(StoreError, match=message):
        open_reader(path, batch_size=2)
    done = CliRunner().invoke(cli, ["inspect", str(path)])
    assert done.exit_code == 1 and re.search(message, done.output), done.output


def test_a_plain_hdf5_file_that_would_unpickle_code_is_refused(tmp_path: Path) -> None:
    """PyTables unpickles attributes as it opens a file: one holding a pickle that calls
    os.system is refused before PyTables sees it, however it is opened."""
    marker = tmp_path / "ran"
    exploit = b"cos\nsystem\n(S'touch " + str(marker).encode() + b"'\ntR."  # pickle protocol 0
    for where in ("/", "/samples", "/labels"):
        path = tmp_path / f"exploit{where.replace('/', '-')}.h5"
        with h5py.File(path, "w") as f:
            f["samples"] = np.zeros((4, 8, 8, 3), np.uint8)
            f["labels"] = np.arange(4)
            f[where].attrs["note"] = np.bytes_(exploit)
        message = f"attribute 'note' of {where}.* pickle that would run code"
        refused_everywhere(path, message)
        assert not marker.exists()
    # A file PyTables wrote itself, with a pickled dict among its attributes, still opens.
    path = tmp_path / "tables.h5"
    with tables.open_file(str(path), "w") as f:
        images = f.create_earray("/", "samples", tables.UInt8Atom(), (0, 8, 8, 3))
        images.append(np.zeros((3, 8, 8, 3), np.uint8))
        f.create_array("/", "labels", np.arange(3))
        images._v_attrs.meta = {"source": "camera", "sizes": [1, 2]}
    with open_store(path) as store:
        assert len(store) == 3 and store[2][1].tolist() == [2]


@pytest.mark.parametrize(
    ("images", "chunks"),
    [((10, 100_000, 100_000, 3), (1, 64, 64, 3)), ((10**9, 8, 8, 3), (1024, 8, 8, 3))],
)
def test_a_plain_hdf5_file_claiming_terabytes_is_refused(
    tmp_path: Path, images: tuple[int, ...], chunks: tuple[int, ...]
) -> None:
    """A 2 KB file whose arrays claim 300 GB (huge images) or 192 GB (a billion rows):
    HDF5 would read the chunks never written as zeros, into buffers of that size."""
    path = tmp_path / "bomb.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("samples", images, np.uint8, chunks=chunks)
        f.create_dataset("labels", (images[0],), np.int64, chunks=(min(images[0], 4096),))
    message = r"/(samples|labels) .* claims [\d,]+ bytes, which a [\d,]+-byte file cannot hold"
    refused_everywhere(path, message)


# -- the stores ---------------------------------------------------------------------------

BASES: dict[str, tuple[str, dict[str, Any]]] = {
    "lmdb": ("lmdb", {}),
    "hdf5": ("hdf5", {}),
    "raw-lmdb": ("lmdb", {"raw": True, "size": (8, 8)}),  # one shape: read into one buffer
    "raw-hdf5": ("hdf5", {"raw": True, "size": (8, 8)}),
    "rawvar-lmdb": ("lmdb", {"raw": True}),  # raw pixels, each record its own shape
    "rawvar-hdf5": ("hdf5", {"raw": True}),
}
# The same LMDB stores as format 4 wrote them (tests/format4.py): one value a record.
OLD_BASES = {"old-lmdb": "lmdb", "old-raw-lmdb": "raw-lmdb", "old-rawvar-lmdb": "rawvar-lmdb"}
SHARD = {"lmdb": "shard-00000.lmdb", "hdf5": "shard-00000.h5"}
_SUMMARY, _HEAD, _VERIFY = (), ("--head", "100"), ("--verify",)


@dataclass
class Case:
    base: str
    edit: Callable[[Path, dict[str, Any]], Any]  # (store folder, manifest dict) -> None
    names: list[str] = field(default_factory=list)  # what every message must name
    cli: tuple[tuple[str, ...], ...] = (_SUMMARY, _VERIFY)  # `packer inspect` options to run


def _set(*keys: Any, value: Any) -> Callable[[Path, dict[str, Any]], None]:
    """An edit setting manifest[keys[0]][keys[1]]... to ``value``."""

    def edit(store: Path, manifest: dict[str, Any]) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value

    return edit


def _drop(key: str) -> Callable[[Path, dict[str, Any]], None]:
    return lambda store, manifest: manifest.pop(key)


def _text(text: str) -> Callable[[Path, dict[str, Any]], str]:
    return lambda store, manifest: text  # the manifest file's whole new text


def _move_record(delta: int) -> Callable[[Path, dict[str, Any]], None]:
    def edit(store: Path, manifest: dict[str, Any]) -> None:
        manifest["shards"][0]["num_records"] += delta
        manifest["num_records"] += delta

    return edit


def _shift(store: Path, manifest: dict[str, Any]) -> None:  # the total still adds up
    manifest["shards"][0]["num_records"] -= 1
    manifest["shards"][1]["num_records"] += 1


def _symlink_out(store: Path, manifest: dict[str, Any]) -> None:
    shard = store / manifest["shards"][0]["file"]
    outside = store.parent / "elsewhere" / shard.name
    outside.parent.mkdir()
    shutil.move(shard, outside)
    shard.symlink_to(outside)


def _replace_shard(make: Callable[[Path], None]) -> Callable[[Path, dict[str, Any]], None]:
    def edit(store: Path, manifest: dict[str, Any]) -> None:
        shard = store / manifest["shards"][0]["file"]
        shard.unlink()
        make(shard)

    return edit


def _huge_manifest(store: Path, manifest: dict[str, Any]) -> str:
    (store / "manifest.json").write_text("{}")
    os.truncate(store / "manifest.json", 100 << 20)  # sparse: no disk, no memory
    return "as is"


def _lmdb_value(index: int, change: Callable[[bytes], bytes]) -> Callable[[Path, Any], None]:
    """An edit rewriting record ``index`` of shard 0 (or its __packer__ meta, index -1)."""
    return _lmdb_key(META_KEY if index < 0 else record_key(index), change)


def _lmdb_key(key: bytes, change: Callable[[bytes], bytes | None]) -> Callable[[Path, Any], None]:
    """An edit rewriting the value of ``key`` in shard 0, or deleting it where change gives None."""

    def edit(store: Path, manifest: dict[str, Any]) -> None:
        env = lmdb.open(str(store / SHARD["lmdb"]), subdir=False, lock=False, map_size=1 << 26)
        with env.begin(write=True) as txn:
            value = change(txn.get(key))
            if value is None:
                txn.delete(key)
            else:
                txn.put(key, value)
        env.close()

    return edit


def _columns(**changes: Any) -> Callable[[bytes], bytes]:
    """A column group (raw LMDB layout) with ``changes``: a value, or a function of the old one."""

    def change(value: bytes) -> bytes:
        group = msgpack.unpackb(value)
        for key, new in changes.items():
            group[key] = new(group[key]) if callable(new) else new
        return msgpack.packb(group)

    return change


def _with_header(value: bytes, header: bytes) -> bytes:
    """A block value with its header (zlib-compressed msgpack) replaced by ``header``."""
    (length,) = struct.unpack_from("<I", value, len(value) - 4)
    return value[: len(value) - 4 - length] + header + struct.pack("<I", len(header))


def _zeros_deflated(megabytes: int) -> bytes:
    deflate = zlib.compressobj(9)
    parts = [deflate.compress(bytes(1 << 20)) for _ in range(megabytes)]
    return b"".join(parts) + deflate.flush()


def _header(**changes: Callable[[Any], Any]) -> Callable[[bytes], bytes]:
    """A block value whose header has fields changed by functions of their old values."""

    def change(value: bytes) -> bytes:
        (length,) = struct.unpack_from("<I", value, len(value) - 4)
        header = msgpack.unpackb(zlib.decompress(value[len(value) - 4 - length : -4]))
        for key, new in changes.items():
            header[key] = new(header[key])
        return _with_header(value, zlib.compress(msgpack.packb(header)))

    return change


def _shorten_record(index: int, by: int) -> Callable[[bytes], bytes]:
    """Block offsets (u32 bytes) with record ``index`` ending ``by`` bytes early."""

    def change(offsets: bytes) -> bytes:
        values = np.frombuffer(offsets, "<u4").copy()
        values[index + 1] -= by
        return values.tobytes()

    return change


def _meta(**changes: Any) -> Callable[[bytes], bytes]:
    """A record value whose msgpack meta has ``changes`` (the payload and its CRC kept)."""

    def change(value: bytes) -> bytes:
        n = int.from_bytes(value[:4], "little")
        meta = {**msgpack.unpackb(value[4 : 4 + n]), **changes}
        packed = msgpack.packb(meta)
        return len(packed).to_bytes(4, "little") + packed + value[4 + n :]

    return change


def _meta_is(raw: Any) -> Callable[[bytes], bytes]:
    def change(value: bytes) -> bytes:
        packed = msgpack.packb(raw)
        n = int.from_bytes(value[:4], "little")
        return len(packed).to_bytes(4, "little") + packed + value[4 + n :]

    return change


def _truncate_lmdb(store: Path, manifest: dict[str, Any]) -> None:
    shard = store / SHARD["lmdb"]
    os.truncate(shard, shard.stat().st_size // 2)  # the manifest is resealed to match


def _h5(change: Callable[[h5py.File], None]) -> Callable[[Path, Any], None]:
    def edit(store: Path, manifest: dict[str, Any]) -> None:
        with h5py.File(store / SHARD["hdf5"], "r+") as f:
            change(f)

    return edit


def _put(f: h5py.File, name: str, at: Any, value: Any) -> None:
    f[name][at] = value


def _recreate(name: str, make: Callable[[h5py.File], Any]) -> Callable[[h5py.File], None]:
    def change(f: h5py.File) -> None:
        data = make(f)
        del f[name]
        if isinstance(data, dict):
            f.create_dataset(name, **data)
        else:
            f[name] = data

    return change


_S0, _R = "shard-00000", "record"
CASES: dict[str, Case] = {
    # counts that disagree with the shards
    "more-records-lmdb": Case("lmdb", _move_record(+1), [f"{_S0}.lmdb"], (_HEAD, _VERIFY)),
    "more-records-hdf5": Case("hdf5", _move_record(+1), [f"{_S0}.h5"], (_HEAD, _VERIFY)),
    "fewer-records-lmdb": Case("lmdb", _move_record(-1), [f"{_S0}.lmdb"], (_HEAD, _VERIFY)),
    "fewer-records-hdf5": Case("hdf5", _move_record(-1), [f"{_S0}.h5"], (_HEAD, _VERIFY)),
    "shifted-records": Case("lmdb", _shift, ["shard-0000"], (_HEAD, _VERIFY)),
    "total-off": Case("lmdb", _set("num_records", value=99), ["do not add up"]),
    # shard files that leave the store, or are no file
    "dotdot": Case("lmdb", _set("shards", 0, "file", value="../x.lmdb"), ["'../x.lmdb'"]),
    "absolute": Case("hdf5", _set("shards", 0, "file", value="/etc/passwd"), ["/etc/passwd"]),
    "symlink-out-lmdb": Case("lmdb", _symlink_out, [f"{_S0}.lmdb", "outside the store"]),
    "symlink-out-hdf5": Case("hdf5", _symlink_out, [f"{_S0}.h5", "outside the store"]),
    "fifo": Case("lmdb", _replace_shard(os.mkfifo), [f"{_S0}.lmdb", "not a regular file"]),
    "folder": Case("hdf5", _replace_shard(Path.mkdir), [f"{_S0}.h5", "not a regular file"]),
    "missing": Case("lmdb", _replace_shard(lambda p: None), [f"{_S0}.lmdb"], (_HEAD, _VERIFY)),
    # absurd sizes and wrong types
    "count-1e15": Case("lmdb", _set("num_records", value=10**15), ["absurd record count"]),
    "count-1e11": Case("lmdb", _move_record(10**11), [f"{_S0}.lmdb", "cannot fit"]),
    "count-negative": Case("hdf5", _set("shards", 1, "num_records", value=-1), ["shards[1]"]),
    "count-string": Case("lmdb", _set("shards", 0, "num_records", value="12"), ["shards[0]"]),
    "bytes-string": Case("lmdb", _set("shards", 0, "bytes", value="32768"), ["shards[0].bytes"]),
    "shape-terabytes": Case(
        "raw-hdf5", _set("storage", "shape", value=[10**6, 10**6, 3]), ["storage.shape"]
    ),
    "shape-gigabyte": Case(  # under the cap per record, but 12 of them cannot fit the file
        "raw-lmdb", _set("storage", "shape", value=[16384, 16384, 3]), [f"{_S0}.lmdb"]
    ),
    "shape-negative": Case("raw-hdf5", _set("storage", "shape", value=[-8, 8, 3]), ["shape"]),
    "shape-string": Case("raw-lmdb", _set("storage", "shape", value="8x8x3"), ["shape"]),
    "payload-kind": Case("lmdb", _set("storage", "payload", value="zip"), ["storage.payload"]),
    "colour-mode": Case("hdf5", _set("storage", "mode", value="CMYK"), ["storage.mode"]),
    "storage-string": Case("lmdb", _set("storage", value="x"), ["storage"]),
    "no-shards": Case("lmdb", _drop("shards"), ["shards is missing"]),
    "no-seed": Case("hdf5", _drop("seed"), ["seed is missing"]),
    "unknown-field": Case("lmdb", _set("evil", value=1), ["'evil'"]),
    "json-list": Case("lmdb", _text("[1, 2]"), ["not a packer-store manifest"]),
    "json-string": Case("lmdb", _text('"store"'), ["not a packer-store manifest"]),
    "json-null": Case("lmdb", _text("null"), ["not a packer-store manifest"]),
    "json-deep": Case("lmdb", _text("[" * 100_000 + "]" * 100_000), ["unreadable manifest"]),
    "json-bigint": Case("lmdb", _text('{"format": ' + "9" * 5000 + "}"), ["unreadable"]),
    "json-nan": Case("lmdb", _set("stats", "payload_bytes", "mean", value=float("nan")), ["NaN"]),
    "json-huge": Case("lmdb", _huge_manifest, ["104,857,600-byte manifest"]),
    "json-not-utf8": Case("lmdb", _text("\udcff"), ["unreadable manifest"]),
    "version-newer": Case("lmdb", _set("format_version", value=99), ["upgrade packer"]),
    "version-zero": Case("lmdb", _set("format_version", value=0), ["format_version 0"]),
    "version-string": Case("lmdb", _set("format_version", value="1"), ["format_version"]),
    "stats-string": Case("lmdb", _set("stats", value="x"), ["stats"]),
    "mean-string": Case("lmdb", _set("stats", "payload_bytes", "mean", value="big"), ["mean"]),
    "histogram-keys": Case(
        "hdf5", _set("stats", "height", "histogram", value={"x": 1}), ["histogram"]
    ),
    "label-past-classes": Case(
        "lmdb", _set("stats", "label_counts", value=[{"99": 5}]), ["label_counts"]
    ),
    "classes-string": Case(
        "lmdb", _set("label_columns", 0, "classes", value="abc"), ["label_columns[0].classes"]
    ),
    "skipped-ints": Case("lmdb", _set("skipped", value=[1, 2]), ["skipped[0]"]),
    "max-pixels-string": Case("lmdb", _set("options", "max_pixels", value="lots"), ["max_pixels"]),
    # hostile LMDB values: the msgpack meta, the length prefix, the shard's own meta
    "meta-path-int": Case(
        "old-lmdb", _lmdb_value(3, _meta(p=5)), [_R + " 3", "'p'"], (_HEAD, _VERIFY)
    ),
    "meta-labels-text": Case(
        "old-lmdb", _lmdb_value(3, _meta(l="abc")), [_R + " 3"], (_HEAD, _VERIFY)
    ),
    "meta-label-2**64": Case(
        "old-lmdb", _lmdb_value(3, _meta(l=[2**64 - 1])), [_R + " 3"], (_HEAD, _VERIFY)
    ),
    "meta-crc-text": Case("old-lmdb", _lmdb_value(3, _meta(c="x")), [_R + " 3"], (_HEAD, _VERIFY)),
    "meta-shape-pair": Case(
        "old-lmdb", _lmdb_value(3, _meta(s=[1, 2])), [_R + " 3"], (_HEAD, _VERIFY)
    ),
    "meta-format-none": Case(
        "old-lmdb", _lmdb_value(3, _meta(f=None)), [_R + " 3"], (_HEAD, _VERIFY)
    ),
    "meta-a-list": Case(
        "old-lmdb", _lmdb_value(3, _meta_is([1, 2, 3])), [_R + " 3"], (_HEAD, _VERIFY)
    ),
    "meta-shape-terapixels": Case(  # raw pixels: a naive np.empty(shape) would take 3 TB
        "old-rawvar-lmdb",
        _lmdb_value(3, _meta(s=[2**20, 2**20, 3])),
        [_R + " 3", "1048576"],
        (_VERIFY,),  # --head lists records without decoding them: nothing to refuse
    ),
    "length-past-value": Case(
        "old-lmdb",
        _lmdb_value(3, lambda v: (len(v) + 100).to_bytes(4, "little") + v[4:]),
        [_R + " 3", "meta length"],
        (_HEAD, _VERIFY),
    ),
    "length-garbage": Case(
        "old-lmdb",
        _lmdb_value(3, lambda v: b"\x30\0\0\0" + b"\xc1" * 60),
        [_R + " 3"],
        (_HEAD, _VERIFY),
    ),
    # LMDB blocks (format 5): 12 records a shard, one block
    "block-garbage": Case(
        "lmdb",
        _lmdb_value(0, lambda v: b"\xc1" * 100),
        [_R + "s 0..11", "header"],
        (_HEAD, _VERIFY),
    ),
    "block-length-past-value": Case(
        "lmdb",
        _lmdb_value(0, lambda v: v[:-4] + (len(v) + 100).to_bytes(4, "little")),
        [_R + "s 0..11", "header length"],
        (_HEAD, _VERIFY),
    ),
    "block-missing": Case(
        "lmdb", _lmdb_value(0, lambda v: None), [_R + "s 0..11 are missing"], (_HEAD, _VERIFY)
    ),
    "block-header-bomb": Case(  # 128 KB that would inflate to 128 MB
        "lmdb",
        _lmdb_value(0, lambda v: _with_header(v, _zeros_deflated(128))),
        [_R + "s 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "block-paths-fewer": Case(
        "lmdb",
        _lmdb_value(0, _header(paths=lambda p: p.rsplit("\0", 1)[0])),
        [_R + "s 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "block-a-million-formats": Case(
        "lmdb",
        _lmdb_value(0, _header(formats=lambda f: ["JPEG"] * 10**6)),
        [_R + "s 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "block-offsets-past-value": Case(
        "lmdb",
        _lmdb_value(0, _header(offsets=lambda o: o[:-4] + (1 << 31).to_bytes(4, "little"))),
        [_R + "s 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "block-starts-garbage": Case(
        "lmdb",
        _lmdb_value(-1, lambda v: msgpack.packb({**msgpack.unpackb(v), "block_starts": b"\1"})),
        [f"{_S0}.lmdb", "block_starts"],
        (_HEAD, _VERIFY),
    ),
    "block-starts-past-records": Case(
        "lmdb",
        _lmdb_value(
            -1,
            lambda v: msgpack.packb(
                {**msgpack.unpackb(v), "block_starts": np.array([0, 99], "<u8").tobytes()}
            ),
        ),
        [f"{_S0}.lmdb", "block_starts"],
        (_HEAD, _VERIFY),
    ),
    "raw-block-row-short": Case(  # records 3 and 4 are the wrong size: either is named
        "raw-lmdb",
        _lmdb_value(0, _header(offsets=_shorten_record(3, 10))),
        ["needs 192"],
        (_VERIFY,),
    ),
    # raw pixels of one shape in format 4's LMDB layout: values hold pixels alone, the rest is
    # in column groups
    "payload-short-of-shape": Case(
        "old-raw-lmdb", _lmdb_value(3, lambda v: v[:-10]), [_R + " 3", "182"], (_VERIFY,)
    ),
    "raw-record-missing": Case(
        "old-raw-lmdb", _lmdb_value(3, lambda v: None), [_R + " 3 is missing"], (_VERIFY,)
    ),
    "columns-missing": Case(
        "old-raw-lmdb",
        _lmdb_key(columns_key(0), lambda v: None),
        ["records 0..11 are missing"],
        (_HEAD, _VERIFY),
    ),
    "columns-garbage": Case(
        "old-raw-lmdb",
        _lmdb_key(columns_key(0), lambda v: b"\xc1\xc1"),
        ["records 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "columns-labels-short": Case(
        "old-raw-lmdb",
        _lmdb_key(columns_key(0), _columns(l=lambda b: b[:-8])),
        ["0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "columns-path-int": Case(
        "old-raw-lmdb",
        _lmdb_key(columns_key(0), _columns(p=lambda p: [7, *p[1:]])),
        ["damaged"],
        (_HEAD, _VERIFY),
    ),
    "columns-a-billion-paths": Case(
        "old-raw-lmdb",
        _lmdb_key(columns_key(0), lambda v: msgpack.packb({"l": b"", "c": b"", "p": [""] * 10**6})),
        ["records 0..11", "damaged"],
        (_HEAD, _VERIFY),
    ),
    "layout-unknown": Case(
        "raw-lmdb",
        _lmdb_value(-1, lambda v: msgpack.packb({**msgpack.unpackb(v), "layout": "rows"})),
        [f"{_S0}.lmdb", "'rows'"],
        (_HEAD, _VERIFY),
    ),
    "layout-shape-huge": Case(
        "raw-lmdb",
        _lmdb_value(-1, lambda v: msgpack.packb({**msgpack.unpackb(v), "raw_shape": [2**20] * 3})),
        [f"{_S0}.lmdb", "raw_shape"],
        (_HEAD, _VERIFY),
    ),
    "shard-meta-garbage": Case(
        "lmdb", _lmdb_value(-1, lambda v: b"\xc1\xc1"), [f"{_S0}.lmdb"], (_HEAD, _VERIFY)
    ),
    "shard-meta-columns": Case(
        "lmdb",
        _lmdb_value(-1, lambda v: msgpack.packb({**msgpack.unpackb(v), "num_label_columns": 7})),
        [f"{_S0}.lmdb"],
        (_HEAD, _VERIFY),
    ),
    "truncated-resealed-lmdb": Case(
        "lmdb", _truncate_lmdb, [f"{_S0}.lmdb", "truncated"], (_HEAD, _VERIFY)
    ),
    # hostile HDF5 columns
    "offsets-past-data": Case(
        "hdf5",
        _h5(lambda f: _put(f, "offsets", 4, 10**9)),
        [f"{_S0}.h5", _R + " "],
        (_HEAD, _VERIFY),
    ),
    "offsets-backwards": Case(
        "hdf5", _h5(lambda f: _put(f, "offsets", 4, 0)), [f"{_S0}.h5", _R + " "], (_HEAD, _VERIFY)
    ),
    "data-terabyte": Case(
        "hdf5",
        _h5(lambda f: f["data"].resize((1 << 40,))),
        [f"{_S0}.h5", "/data"],
        (_HEAD, _VERIFY),
    ),
    "images-terapixel": Case(
        "raw-hdf5",
        _h5(
            _recreate(
                "images",
                lambda f: {
                    "shape": (len(f["crc32"]), 10**6, 10**6, 3),
                    "dtype": np.uint8,
                    "chunks": (1, 64, 64, 3),
                },
            )
        ),
        [f"{_S0}.h5", "/images"],
        (_HEAD, _VERIFY),
    ),
    "images-other-shape": Case(  # a row size the reader's buffers were not made for
        "raw-hdf5",
        _h5(_recreate("images", lambda f: np.zeros((len(f["crc32"]), 9, 9, 3), np.uint8))),
        [f"{_S0}.h5", "/images"],
        (_VERIFY,),  # --head lists records as they claim to be
    ),
    "format-code": Case(
        "hdf5",
        _h5(lambda f: _put(f, "formats", 3, 200)),
        [_R + " 3", "format code"],
        (_HEAD, _VERIFY),
    ),
    "labels-text": Case(
        "hdf5",
        _h5(_recreate("labels", lambda f: np.array([[b"cat"]] * len(f["crc32"])))),
        [f"{_S0}.h5", "/labels"],
        (_HEAD, _VERIFY),
    ),
    "crc-column-short": Case(
        "hdf5",
        _h5(_recreate("crc32", lambda f: f["crc32"][:-2])),
        [f"{_S0}.h5", "/crc32"],
        (_HEAD, _VERIFY),
    ),
    "shard-attr-garbage": Case(
        "hdf5",
        _h5(lambda f: f.attrs.__setitem__("packer", "{not json")),
        [f"{_S0}.h5"],
        (_HEAD, _VERIFY),
    ),
    "shape-column-terapixels": Case(
        "rawvar-hdf5",
        _h5(lambda f: _put(f, "shapes", 3, [2**30, 2**30, 3])),
        [_R + " 3", "1073741824"],
        (_VERIFY,),
    ),
}


def _reseal(store: Path) -> None:
    """Make the manifest's size and checksum of each shard file changed by an edit match the
    file again, so that only the edit itself is hostile."""
    try:
        manifest = json.loads((store / "manifest.json").read_text())
        shards = list(manifest["shards"])
    except (ValueError, KeyError, TypeError):
        return  # the edit was to the manifest itself
    for shard in shards:
        file = store / str(shard.get("file"))
        if file.is_file() and not file.is_symlink():
            data = file.read_bytes()
            if shard_checksum(data) != shard["checksum"]:
                shard["bytes"], shard["checksum"] = len(data), shard_checksum(data)
    rewrite_manifest(store, manifest)


def _make_case(base: Path, to: Path, case: Case) -> Path:
    store = Path(shutil.copytree(base, to / base.name))
    manifest = json.loads((store / "manifest.json").read_text())
    text = case.edit(store, manifest)
    if text == "as is":
        return store
    if isinstance(text, str):
        (store / "manifest.json").write_text(text, errors="surrogateescape")
        return store
    rewrite_manifest(store, manifest)
    _reseal(store)
    return store


# Runs in a child: every probe of every case, one JSON line per case as it finishes.
_PROBE = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
from click.testing import CliRunner
from packer import open_reader, open_store
from packer.cli import cli
from packer.errors import PackerError

def outcome(call):
    try:
        call()
    except PackerError as e:
        return {"error": type(e).__name__, "message": str(e)}
    except BaseException as e:
        return {"error": "not a PackerError: " + type(e).__name__, "message": str(e)[:1000]}
    return {"error": None, "message": ""}

def read_store(path):
    with open_store(path) as store:
        for i in range(len(store)):
            store[i]
        for _ in store.indexed_records():
            pass

def read_epoch(path):
    with open_reader(path, batch_size=4, workers=2) as reader:
        for _ in reader:
            pass

def inspect(path, args):
    done = CliRunner().invoke(cli, ["inspect", path, *args])
    crashed = done.exception is not None and not isinstance(done.exception, SystemExit)
    return {"exit": done.exit_code, "output": done.output[-3000:],
            "crashed": repr(done.exception) if crashed else None}

for line in sys.stdin:
    case = json.loads(line)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    path = case["path"]
    result = {
        "name": case["name"],
        "store": outcome(lambda: read_store(path)),
        "reader": outcome(lambda: read_epoch(path)),
        "cli": {" ".join(args) or "summary": inspect(path, args) for args in case["cli"]},
    }
    result["rss_growth_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    print(json.dumps(result), flush=True)
"""


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Packs the base stores, makes every hostile case from them, probes all in one child."""
    tmp = tmp_path_factory.mktemp("hostile")
    root = tmp / "images"
    for i in range(24):  # 12 per shard; sizes differ, so the rawvar stores have no one shape
        ext = ".png" if i % 3 == 0 else ".jpg"
        write_image(root / f"c{i % 3}" / f"{i:02d}{ext}", size=(10 + i, 12 + i % 5), seed=i)
    bases = {}
    for name, (backend, extra) in BASES.items():
        bases[name] = tmp / "bases" / (name + (".lmdb" if backend == "lmdb" else ".h5"))
        options = PackOptions(backend=backend, seed=1, workers=2, shards=2, **extra)
        pack(root, bases[name], options)
    for name, new in OLD_BASES.items():
        bases[name] = Path(shutil.copytree(bases[new], tmp / "old" / bases[new].name))
        as_format4(bases[name])
    lines = []
    for name, case in CASES.items():
        store = _make_case(bases[case.base], tmp / "cases" / name, case)
        lines.append(json.dumps({"name": name, "path": str(store), "cli": case.cli}))
    done = subprocess.run(
        [sys.executable, "-c", _PROBE],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=240,
    )
    results = {r["name"]: r for r in map(json.loads, done.stdout.splitlines())}
    for name in CASES:
        if name not in results:  # the child died on this case (SIGBUS, abort, out of memory)
            results[name] = {"died": f"returncode {done.returncode}: {done.stderr[-3000:]}"}
            break
    return results


@pytest.mark.parametrize("name", list(CASES))
def test_a_hostile_store_gets_a_clear_error(probed: dict[str, dict[str, Any]], name: str) -> None:
    assert name in probed, "not probed: the child died on an earlier case"
    result = probed[name]
    assert "died" not in result, result.get("died")
    case = CASES[name]
    store_name = f"{name}/"  # every message names the store (its folder is the case's name)
    for probe in ("store", "reader"):
        got = result[probe]
        assert got["error"] is not None and not got["error"].startswith("not a"), (probe, got)
        assert "\n" not in got["message"] and store_name in got["message"], (probe, got)
        assert all(part in got["message"] for part in case.names), (probe, case.names, got)
    for command, done in result["cli"].items():
        output = done["output"]
        assert done["crashed"] is None and "Traceback" not in output, (command, done)
        assert done["exit"] == 1 and store_name in output, (command, done)
        assert all(part in output for part in case.names), (command, case.names, output)
    assert result["rss_growth_kb"] < 300_000  # nothing was allocated from a hostile size
