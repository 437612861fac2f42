"""What gets packed: the folder walk and the three label sources."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import write_image

from packer.errors import EmptySourceError, LabelsError, SourceError
from packer.packing.source import load_source


def test_folder_labels_are_sorted_class_names(image_dir: Path) -> None:
    src = load_source(image_dir)
    assert src.label_source == "folders"
    assert [c.name for c in src.columns] == ["class"]
    assert src.columns[0].classes == ("cat", "dog", "eel")
    assert len(src.items) == 21
    for item in src.items:
        assert item.labels == (("cat", "dog", "eel").index(item.path.split("/")[0]),)
        assert item.size == (image_dir / item.path).stat().st_size
    assert [i.path for i in src.items] == sorted(i.path for i in src.items)


def test_walk_is_recursive_skips_hidden_and_reports_top_level_files(tmp_path: Path) -> None:
    write_image(tmp_path / "a" / "deep" / "er" / "x.jpg")
    write_image(tmp_path / "a" / ".hidden.jpg")
    write_image(tmp_path / ".cache" / "y.jpg")
    write_image(tmp_path / "b" / "y.png")
    write_image(tmp_path / "loose.jpg")
    src = load_source(tmp_path)
    assert [i.path for i in src.items] == ["a/deep/er/x.jpg", "b/y.png"]
    assert [(s.path, s.reason) for s in src.skipped] == [("loose.jpg", "not inside a class folder")]


def test_symlinks_followed_without_looping(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    write_image(outside / "z.jpg")
    root = tmp_path / "root"
    write_image(root / "a" / "x.jpg")
    os.symlink(outside, root / "b")  # a linked folder is followed
    os.symlink(root, root / "a" / "loop")  # a loop back to the root
    os.symlink(root / "missing.jpg", root / "a" / "dangling.jpg")
    src = load_source(root)
    assert [i.path for i in src.items] == ["a/x.jpg", "b/z.jpg"]
    reasons = {s.path: s.reason for s in src.skipped}
    assert reasons == {
        "a/loop": "links to a folder already walked (symlink loop or alias)",
        "a/dangling.jpg": "broken symlink",
    }


def test_a_linked_alias_of_a_folder_in_the_tree_keeps_the_real_path(tmp_path: Path) -> None:
    write_image(tmp_path / "photos" / "a.jpg")
    os.symlink(tmp_path / "photos", tmp_path / "0-link")  # sorts before the real folder
    os.symlink(tmp_path / "photos", tmp_path / "zz-link")
    src = load_source(tmp_path)
    assert [i.path for i in src.items] == ["photos/a.jpg"]
    assert [s.path for s in src.skipped] == ["0-link", "zz-link"]


def test_no_labels(tmp_path: Path) -> None:
    write_image(tmp_path / "x.jpg")
    write_image(tmp_path / "sub" / "y.jpg")
    src = load_source(tmp_path, "none")
    assert [(i.path, i.labels) for i in src.items] == [("sub/y.jpg", ()), ("x.jpg", ())]
    assert src.columns == []


def test_errors_for_missing_empty_and_classless_sources(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="not a folder"):
        load_source(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(EmptySourceError, match="no files to pack"):
        load_source(tmp_path / "empty")
    write_image(tmp_path / "flat" / "x.jpg")
    with pytest.raises(EmptySourceError, match="--labels none"):
        load_source(tmp_path / "flat")


def _csv(tmp_path: Path, text: str, name: str = "labels.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_string_and_integer_columns(image_dir: Path, tmp_path: Path) -> None:
    table = _csv(
        tmp_path,
        "file,species,weight\ndog/dog_1.jpg,canine,7\ncat/cat_0.png,feline,-3\n"
        "eel/eel_2.jpg,fish,7\n",
    )
    src = load_source(image_dir, table)
    assert src.label_source == "csv"
    assert [c.name for c in src.columns] == ["species", "weight"]
    assert src.columns[0].classes == ("canine", "feline", "fish")
    assert src.columns[1].classes is None
    assert [(i.path, i.labels) for i in src.items] == [
        ("cat/cat_0.png", (1, -3)),
        ("dog/dog_1.jpg", (0, 7)),
        ("eel/eel_2.jpg", (2, 7)),
    ]


def test_tsv_with_chosen_columns(image_dir: Path, tmp_path: Path) -> None:
    table = _csv(tmp_path, "a\timg\tb\nx\tcat/cat_1.jpg\t5\n", name="labels.tsv")
    src = load_source(image_dir, table, path_column="img", label_columns=["b"])
    assert [(i.path, i.labels) for i in src.items] == [("cat/cat_1.jpg", (5,))]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "path,label\ncat/none.jpg,a\ncat/cat_1.jpg,b\n",
            r"names 1 file\(s\) that do not exist.*cat/none.jpg",
        ),
        ("path,label\n../secret.jpg,a\n", r"labels.csv:2: path '../secret.jpg' is not inside"),
        ("path,label\n/etc/passwd,a\n", "is not inside the source folder"),
        ("path,label\ncat/cat_1.jpg,a\ncat/./cat_1.jpg,b\n", "listed twice"),
        ("path,label\ncat/cat_1.jpg,\n", "empty value in label column 'label'"),
        ("path,label\ncat/cat_1.jpg\n", "expected 2 columns"),
        ("path,label\n", "no rows"),
        ("", "empty labels file"),
    ],
)
def test_csv_errors_are_one_line_and_name_the_problem(
    image_dir: Path, tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(LabelsError, match=message) as info:
        load_source(image_dir, _csv(tmp_path, text))
    assert "\n" not in str(info.value)


def test_csv_unknown_column(image_dir: Path, tmp_path: Path) -> None:
    table = _csv(tmp_path, "path,label\ncat/cat_1.jpg,a\n")
    with pytest.raises(LabelsError, match="no label column 'nope'"):
        load_source(image_dir, table, label_columns=["nope"])
    with pytest.raises(LabelsError, match="no column 'where'"):
        load_source(image_dir, table, path_column="where")
