"""Walk a source folder: every non-hidden regular file, in a reproducible order.

Only ``stat`` is done here; whether a file is an image is decided later, in the worker
pool, by Pillow (an image is what Pillow can identify, not what its extension says).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packer.packing.file_list import FileList, FileListBuilder

__all__ = ["Skipped", "walk"]


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    reason: str


def walk(
    root: Path, progress: Callable[[int], None] | None = None
) -> tuple[FileList, list[Skipped]]:
    """Find every candidate file under ``root``, sorted by relative path.

    Hidden entries (a name starting with ".") are left out. Symlinks are followed, to
    files and folders alike, but a folder already visited (same device and inode) is not
    entered again: a symlink loop ends instead of looping, and a link to a folder that is
    also in the tree is reported rather than packed twice. Real folders are walked before
    linked ones, so the real path is the one kept. Broken links, unreadable folders and
    names that are not valid UTF-8 are returned as ``Skipped``.

    The files go straight into a FileList (packer.packing.file_list): ~40 bytes a file plus
    its name, where a list of objects took ~0.5 KB. Each folder is listed in the order of
    its names with a folder's name read as "name/", and entered where it comes: so the walk
    meets files in the order of their relative paths, and needs no sort of millions of
    names at the end; only files reached through a linked folder, walked last, do.
    """
    found = FileListBuilder()
    skipped: list[Skipped] = []
    visited: set[tuple[int, int]] = set()
    linked: list[tuple[str, os.stat_result]] = []  # reached through a symlink: walked last
    walked_linked = False

    def enter(rel_dir: str, dir_stat: os.stat_result) -> None:
        if (dir_stat.st_dev, dir_stat.st_ino) in visited:
            skipped.append(
                Skipped(rel_dir, "links to a folder already walked (symlink loop or alias)")
            )
            return
        visited.add((dir_stat.st_dev, dir_stat.st_ino))
        # Folders still to finish, each as (its path, its entries left): depth first.
        stack: list[tuple[str, list[Any]]] = [(rel_dir, _listing(root, rel_dir, skipped))]
        while stack:
            parent, entries = stack[-1]
            if not entries:
                stack.pop()
                continue
            key, st, is_link = entries.pop()
            name = key[:-1] if key.endswith("/") else key
            rel = f"{parent}/{name}" if parent else name
            if isinstance(st, int):  # a regular file's size
                found.add(rel, st)
                if progress is not None and len(found) % 1000 == 0:
                    progress(len(found))
            elif stat.S_ISDIR(st.st_mode):
                if is_link:
                    linked.append((rel, st))
                elif (st.st_dev, st.st_ino) in visited:
                    skipped.append(
                        Skipped(rel, "links to a folder already walked (symlink loop or alias)")
                    )
                else:
                    visited.add((st.st_dev, st.st_ino))
                    stack.append((rel, _listing(root, rel, skipped)))
            else:
                skipped.append(Skipped(rel, "not a regular file"))

    enter("", root.stat())
    while linked:
        walked_linked = True
        enter(*linked.pop(0))
    files = found.build()
    if walked_linked:
        files = files.sorted_by_path().compact()
    skipped.sort(key=lambda s: s.path)
    return files, skipped


def _listing(
    root: Path, rel_dir: str, skipped: list[Skipped]
) -> list[tuple[str, int | os.stat_result, bool]]:
    """The entries of one folder to walk, last first (they are popped), in the order of the
    paths under them: by name, a folder's name read as "name/". Each is (that name, a
    regular file's size or else its stat, is a symlink): no stat kept for a file."""
    try:
        with os.scandir(root / rel_dir if rel_dir else root) as listing:
            entries: list[tuple[str, int | os.stat_result, bool]] = []
            for entry in listing:
                if entry.name.startswith("."):
                    continue
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if not _is_utf8(rel):
                    skipped.append(Skipped(repr(rel), "file name is not valid UTF-8"))
                    continue
                try:
                    st = entry.stat(follow_symlinks=True)
                except OSError as e:
                    reason = (
                        "broken symlink" if entry.is_symlink() else f"cannot stat: {e.strerror}"
                    )
                    skipped.append(Skipped(rel, reason))
                    continue
                if stat.S_ISREG(st.st_mode):
                    entries.append((entry.name, st.st_size, False))
                else:
                    folder = stat.S_ISDIR(st.st_mode)
                    entries.append(
                        (entry.name + "/" if folder else entry.name, st, entry.is_symlink())
                    )
    except OSError as e:
        skipped.append(Skipped(rel_dir or ".", f"cannot list folder: {e.strerror}"))
        return []
    entries.sort(key=lambda e: e[0], reverse=True)
    return entries


def _is_utf8(name: str) -> bool:
    # os.scandir decodes undecodable bytes as lone surrogates; those cannot be stored as text.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
