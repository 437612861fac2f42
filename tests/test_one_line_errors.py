"""The bad command lines and places of issue 29 that gave tracebacks: each is now one line on
stderr naming what is wrong and where, exit status 1, from a real ``packer`` process."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import assert_one_line_error, packer_command, write_image

from packer import PackOptions, pack
from packer.arguments import WORKERS_PER_CORE, default_workers


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one-line") / "images"
    for i in range(4):
        write_image(root / ("cat" if i % 2 else "dog") / f"{i}.jpg", seed=i)
    return root


@pytest.fixture(scope="module")
def store(images: Path) -> Path:
    return pack(images, images.parent / "s.lmdb", PackOptions(seed=1, workers=1)).store


def _read_only_mount(folder: Path) -> Iterator[Path]:
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _immutable(folder: Path, exists: bool = False) -> Iterator[Path]:
    folder.mkdir(exist_ok=exists)
    made = subprocess.run(["chattr", "+i", str(folder)], capture_output=True)
    if made.returncode:
        pytest.skip(f"cannot make a folder immutable here: {made.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


@pytest.fixture(params=["read-only", "immutable"])
def unwritable(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A folder nothing can be written into, even by root: a read-only file system (Errno
    30) or an immutable folder (chattr +i, Errno 1)."""
    make = _read_only_mount if request.param == "read-only" else _immutable
    yield from make(tmp_path / request.param)


def test_pack_into_an_unwritable_place(images: Path, unwritable: Path) -> None:
    out = unwritable / "out.lmdb"
    done = packer_command("pack", images, out, "--seed", "1")
    line = assert_one_line_error(done, out, f"cannot write {out}.partial")
    assert line.endswith(("Read-only file system", "Operation not permitted"))
    assert not list(unwritable.iterdir())


def test_convert_into_an_unwritable_place(store: Path, unwritable: Path) -> None:
    out = unwritable / "out.h5"
    assert_one_line_error(packer_command("convert", store, out), out, f"{out}.partial")


def test_inspect_grid_into_an_unwritable_place(store: Path, unwritable: Path) -> None:
    sheet = unwritable / "grid.png"
    done = packer_command("inspect", store, "--grid", sheet)
    assert_one_line_error(done, f"{sheet}: cannot write it: ")


def test_append_to_a_store_in_an_immutable_folder(images: Path, tmp_path: Path) -> None:
    out = pack(images, tmp_path / "home" / "s.h5", PackOptions("hdf5", seed=1, workers=1)).store
    more = tmp_path / "more"
    write_image(more / "eel" / "e.jpg", seed=50)
    for _ in _immutable(out.parent, exists=True):
        done = packer_command("pack", more, out, "--append")
    assert_one_line_error(done, out, f"cannot write {out}.append.partial")


@pytest.mark.parametrize(
    "command", [["pack", "IMAGES", "OUT"], ["inspect", "STORE", "--grid", "OUT"]]
)
def test_a_negative_seed(images: Path, store: Path, tmp_path: Path, command: list[str]) -> None:
    given = {"IMAGES": images, "STORE": store, "OUT": tmp_path / "out.lmdb"}
    done = packer_command(*[given.get(a, a) for a in command], "--seed", "-1")
    assert_one_line_error(done, "--seed must be a whole number from 0 to ", "not -1")
    assert not (tmp_path / "out.lmdb").exists()


def test_a_csv_label_beyond_int64(images: Path, tmp_path: Path) -> None:
    table = tmp_path / "labels.csv"
    rows = [f"{p.relative_to(images)},{n}" for p, n in zip(sorted(images.rglob("*.jpg")), range(4))]
    rows[2] = rows[2].rsplit(",", 1)[0] + ",9223372036854775808"  # 2**63
    table.write_text("path,count\n" + "\n".join(rows) + "\n")
    done = packer_command("pack", images, tmp_path / "out.lmdb", "--labels", table)
    assert_one_line_error(
        done, f"{table}:4: label 9223372036854775808 in column 'count' does not fit in 64 bits"
    )
    rows[2] = rows[2].rsplit(",", 1)[0] + ",-9223372036854775808"  # -2**63 fits
    table.write_text("path,count\n" + "\n".join(rows) + "\n")
    done = packer_command("pack", images, tmp_path / "out.lmdb", "--labels", table, "-q")
    assert done.returncode == 0, done.stderr


def test_a_semicolon_separated_csv_is_named_as_such(images: Path, tmp_path: Path) -> None:
    table = tmp_path / "labels.csv"
    rows = [f"{p.relative_to(images)};{p.parent.name}" for p in sorted(images.rglob("*.jpg"))]
    table.write_text("path;class\n" + "\n".join(rows) + "\n")
    done = packer_command("pack", images, tmp_path / "out.lmdb", "--labels", table)
    assert_one_line_error(done, table, "separated by ';'", "comma- or tab-separated")


def test_more_workers_than_the_machine_can_use(images: Path, store: Path, tmp_path: Path) -> None:
    """Issue 29: --workers 10000 forked thousands of processes. One past the limit is refused
    before anything starts (the test asks for no more, so that a packer without the check
    packs instead of forking thousands); so are verify's and unpack's thread counts."""
    limit = WORKERS_PER_CORE * default_workers()
    too_many = str(limit + 1)
    message = f"--workers {too_many}: more than {WORKERS_PER_CORE} workers per core"
    out = tmp_path / "out.lmdb"
    assert_one_line_error(packer_command("pack", images, out, "--workers", too_many), message)
    assert not out.exists() and not (tmp_path / "out.lmdb.partial").exists()
    done = packer_command("inspect", store, "--verify", "--workers", too_many)
    assert_one_line_error(done, message)
    done = packer_command("unpack", store, tmp_path / "files", "--workers", too_many)
    assert_one_line_error(done, message)
    done = packer_command("pack", images, out, "--workers", str(limit), "-q")
    assert done.returncode == 0, done.stderr
