"""What to pack: the list of source files with their labels, from class folders, a CSV or none.

Labels are stored as integers, one per label column. A column of strings is mapped to
indices through its sorted class names, which go into the manifest; a column of integers
is stored as given.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from packer.errors import EmptySourceError, LabelsError, SourceError
from packer.packing.file_list import FileList, SourceItem
from packer.packing.scan import Skipped, walk

__all__ = ["LabelColumn", "SourceItem", "Source", "load_source"]

_PATH_COLUMN_NAMES = ("path", "file", "filename", "image", "img", "relpath")
_INTEGER = re.compile(r"^[+-]?\d+$")


@dataclass(frozen=True)
class LabelColumn:
    name: str
    classes: tuple[str, ...] | None  # None: an integer column, stored as given

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "classes": list(self.classes) if self.classes else None}


@dataclass
class Source:
    root: Path
    items: FileList  # sorted by path
    columns: list[LabelColumn]
    label_source: str  # "folders" | "csv" | "none"
    skipped: list[Skipped]  # found by the walk but not packable (reported, never silent)


def load_source(
    root: Path | str,
    labels: str | Path = "folders",
    *,
    path_column: str | None = None,
    label_columns: list[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> Source:
    """List what to pack from ``root``.

    Args:
        root: the source folder.
        labels: ``"folders"`` (the first folder under root is the class), ``"none"``, or the
            path of a CSV/TSV file with a path column and one or more label columns.
        path_column: the CSV column holding paths; default: the first one named like
            "path"/"file"/"filename"/"image", else the first column.
        label_columns: the CSV columns to use as labels; default: all but the path column.
        progress: called with the number of files found so far during a folder walk.
    """
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"{root}: not a folder")
    if str(labels) == "none":
        found, skipped = walk(root, progress)
        source = Source(root, found, [], "none", skipped)
    elif str(labels) == "folders":
        source = _from_folders(root, *walk(root, progress))
    else:
        source = _from_csv(root, Path(labels), path_column, label_columns)
    if not source.items:
        raise EmptySourceError(f"{root}: no files to pack (hidden files are ignored)")
    return source


def _from_folders(root: Path, found: FileList, skipped: list[Skipped]) -> Source:
    if not len(found):
        raise EmptySourceError(f"{root}: no files to pack (hidden files are ignored)")
    classes, label = found.top_folders()
    in_class = np.flatnonzero(label >= 0)
    if len(in_class) < len(found):
        loose = found.take(np.flatnonzero(label < 0))
        skipped += [Skipped(item.path, "not inside a class folder") for item in loose]
    if not len(in_class):
        raise EmptySourceError(
            f"{root}: no class sub-folders with files in them; "
            "put each class in its own sub-folder, or pass --labels none or --labels FILE.csv"
        )
    kept = found if len(in_class) == len(found) else found.take(in_class)
    items = kept.with_labels(label[in_class].reshape(-1, 1))
    return Source(root, items, [LabelColumn("class", tuple(classes))], "folders", skipped)


def _from_csv(
    root: Path, table: Path, path_column: str | None, label_columns: list[str] | None
) -> Source:
    header, rows = _read_table(table)
    path_col = path_column or next(
        (h for h in header if h.strip().lower() in _PATH_COLUMN_NAMES), header[0]
    )
    if path_col not in header:
        raise LabelsError(f"{table}: no column {path_col!r} (columns: {', '.join(header)})")
    label_cols = (
        label_columns if label_columns is not None else [h for h in header if h != path_col]
    )
    for name in label_cols:
        if name not in header:
            raise LabelsError(f"{table}: no label column {name!r} (columns: {', '.join(header)})")

    paths: list[str] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        rel = _inside_root(table, line, row[path_col])
        if rel in seen:
            raise LabelsError(f"{table}:{line}: {rel} is listed twice (first on line {seen[rel]})")
        seen[rel] = line
        for name in label_cols:
            if not row[name].strip():
                raise LabelsError(f"{table}:{line}: empty value in label column {name!r}")
        paths.append(rel)

    columns, codes = [], []
    for name in label_cols:
        values = [row[name].strip() for _, row in rows]
        if all(_INTEGER.match(v) for v in values):
            for (line, _), value in zip(rows, values):
                if not _is_int64(value):
                    raise LabelsError(
                        f"{table}:{line}: label {value} in column {name!r} does not fit in "
                        "64 bits (labels are stored as int64); use smaller numbers or class names"
                    )
            columns.append(LabelColumn(name, None))
            codes.append([int(v) for v in values])
        else:
            classes = sorted(set(values))
            index = {c: i for i, c in enumerate(classes)}
            columns.append(LabelColumn(name, tuple(classes)))
            codes.append([index[v] for v in values])

    items, missing = [], []
    for row_index, rel in enumerate(paths):
        try:
            size = (root / rel).stat().st_size
        except OSError:
            missing.append(rel)
            continue
        items.append(SourceItem(rel, size, tuple(col[row_index] for col in codes)))
    if missing:
        examples = ", ".join(missing[:3])
        raise LabelsError(
            f"{table} names {len(missing)} file(s) that do not exist under {root}, e.g. {examples}"
        )
    items.sort(key=lambda item: item.path)
    return Source(root, FileList.of(items), columns, "csv", [])


def _is_int64(text: str) -> bool:
    digits = text.lstrip("+-")
    return len(digits) <= 19 and -(1 << 63) <= int(text) < 1 << 63  # no 5,000-digit int()


def _read_table(table: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    try:
        text = table.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise LabelsError(f"{table}: cannot read labels file: {e}") from e
    first_line = text.split("\n", 1)[0]
    delimiter = "\t" if table.suffix.lower() == ".tsv" or "\t" in first_line else ","
    reader = csv.DictReader(text.splitlines(), delimiter=delimiter)
    header = reader.fieldnames
    if not header or len(header) < 1:
        raise LabelsError(f"{table}: empty labels file (a header line is required)")
    if len(header) == 1 and ";" in header[0]:
        raise LabelsError(
            f"{table}: its columns are separated by ';' (header {first_line.strip()!r}); "
            "packer reads comma- or tab-separated files: save it with ',' or tabs"
        )
    rows = []
    for row in reader:
        if None in row or any(v is None for v in row.values()):
            raise LabelsError(f"{table}:{reader.line_num}: expected {len(header)} columns")
        rows.append((reader.line_num, row))
    if not rows:
        raise LabelsError(f"{table}: no rows after the header")
    return list(header), rows


def _inside_root(table: Path, line: int, value: str) -> str:
    """Normalise a CSV path and refuse one that points outside the source folder."""
    raw = value.strip().replace("\\", "/")
    normal = os.path.normpath(raw) if raw else ""
    pure = PurePosixPath(normal)
    if not raw or pure.is_absolute() or normal == ".." or normal.startswith("../"):
        raise LabelsError(f"{table}:{line}: path {value!r} is not inside the source folder")
    return str(pure)
