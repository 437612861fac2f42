"""The pack's file list in arrays (issue 23): the same entries, order and labels as a list of
objects would hold, at a fraction of the memory."""

from __future__ import annotations

import os
import pickle
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from packer.packing.file_list import FileList, FileListBuilder, SourceItem
from packer.packing.scan import walk
from packer.packing.source import load_source


def _touch(path: Path, size: int = 3) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)


def test_the_walk_meets_files_in_the_order_of_their_paths(tmp_path: Path) -> None:
    # Names around "/" in sort order: "a-b" < "a/..." < "a0" as strings, while a folder
    # "a" sorts before "a-b" by name: the walk must still give sorted paths.
    names = ["a/x", "a/y/z", "a-b", "a0", "a.txt", "b/c/d/e", "b/c-d", "b/c/a", "é/1", "z"]
    for i, name in enumerate(names):
        _touch(tmp_path / name, size=i + 1)
    (tmp_path / ".hidden").write_bytes(b"h")
    os.symlink(tmp_path / "b" / "c", tmp_path / "link")  # a linked folder: walked last
    files, skipped = walk(tmp_path)
    paths = [item.path for item in files]
    assert paths == sorted(names)
    assert [item.size for item in files] == [names.index(p) + 1 for p in paths]
    assert [s.path for s in skipped] == ["link"]  # already walked as b/c


def test_files_through_a_linked_folder_are_sorted_in(tmp_path: Path) -> None:
    root = tmp_path / "root"
    _touch(root / "real" / "b")
    _touch(root / "a")
    _touch(tmp_path / "outside" / "x")
    os.symlink(tmp_path / "outside", root / "m")  # walked after the real folders
    files, skipped = walk(root)
    assert [item.path for item in files] == ["a", "m/x", "real/b"] and not skipped


def test_folder_labels_and_views(tmp_path: Path) -> None:
    for name in ["dog/1", "cat/2", "cat/1", "cat-x/3", "loose"]:
        _touch(tmp_path / name)
    src = load_source(tmp_path)
    assert [(i.path, i.labels) for i in src.items] == [
        ("cat-x/3", (1,)),
        ("cat/1", (0,)),
        ("cat/2", (0,)),
        ("dog/1", (2,)),
    ]
    assert src.columns[0].classes == ("cat", "cat-x", "dog")
    assert [s.path for s in src.skipped] == ["loose"]
    items = src.items
    shuffled = items.take([3, 0, 2])
    assert [i.path for i in shuffled] == ["dog/1", "cat-x/3", "cat/2"]
    assert [i.path for i in shuffled[1:]] == ["cat-x/3", "cat/2"]
    assert shuffled[-1] == SourceItem("cat/2", 3, (0,))
    assert shuffled.sizes.tolist() == [3, 3, 3] and shuffled.labels[:, 0].tolist() == [2, 1, 0]
    joined = FileList.concat([shuffled[:1], items[1:2]])
    assert [i.path for i in joined] == ["dog/1", "cat/1"]
    with pytest.raises(IndexError):
        shuffled[3]
    again = pickle.loads(pickle.dumps(shuffled[1:]))  # a view travels as its own entries
    assert list(again) == list(shuffled[1:]) and len(again._blob) == len(b"cat-x/3cat/2")


def test_a_million_entries_take_a_small_fraction_of_a_list_of_objects() -> None:
    count = 200_000
    tracemalloc.start()
    builder = FileListBuilder()
    for i in range(count):
        builder.add(f"n{i % 1000:08d}/n{i % 1000:08d}_{i:08d}.JPEG", 1000 + i)
    files = builder.build(np.zeros((count, 1), np.int64))
    compact, _ = tracemalloc.get_traced_memory()
    objects = list(files)
    as_objects, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    per_entry = compact / count
    assert per_entry < 80, per_entry  # 32 bytes of path + 3 arrays of int64
    assert (as_objects - compact) / count > 3 * per_entry
    assert (
        objects[12_345]
        == SourceItem("n00000345/n00000345_00012345.JPEG", 13_345, (0,))
        == files[12_345]
    )
