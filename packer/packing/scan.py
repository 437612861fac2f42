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

__all__ = ["FoundFile", "Skipped", "walk"]


@dataclass(frozen=True, slots=True)
class FoundFile:
    path: str  # relative to the source root, "/"-separated: the name a record keeps
    size: int


@dataclass(frozen=True, slots=True)
class Skipped:
    path: str
    reason: str


def walk(
    root: Path, progress: Callable[[int], None] | None = None
) -> tuple[list[FoundFile], list[Skipped]]:
    """Find every candidate file under ``root``, sorted by relative path.

    Hidden entries (a name starting with ".") are left out. Symlinks are followed, to
    files and folders alike, but a folder already visited (same device and inode) is not
    entered again: a symlink loop ends instead of looping, and a link to a folder that is
    also in the tree is reported rather than packed twice. Real folders are walked before
    linked ones, so the real path is the one kept. Broken links, unreadable folders and
    names that are not valid UTF-8 are returned as ``Skipped``.
    """
    found: list[FoundFile] = []
    skipped: list[Skipped] = []
    visited: set[tuple[int, int]] = set()
    real: list[tuple[str, os.stat_result]] = [("", root.stat())]  # folders to list
    linked: list[tuple[str, os.stat_result]] = []  # reached through a symlink: listed last
    while real or linked:
        rel_dir, dir_stat = real.pop() if real else linked.pop()
        if (dir_stat.st_dev, dir_stat.st_ino) in visited:
            skipped.append(
                Skipped(rel_dir, "links to a folder already walked (symlink loop or alias)")
            )
            continue
        visited.add((dir_stat.st_dev, dir_stat.st_ino))
        try:
            entries = sorted(os.scandir(root / rel_dir if rel_dir else root), key=lambda e: e.name)
        except OSError as e:
            skipped.append(Skipped(rel_dir or ".", f"cannot list folder: {e.strerror}"))
            continue
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            if not _is_utf8(rel):
                skipped.append(Skipped(repr(rel), "file name is not valid UTF-8"))
                continue
            try:
                st = entry.stat(follow_symlinks=True)
            except OSError as e:
                reason = "broken symlink" if entry.is_symlink() else f"cannot stat: {e.strerror}"
                skipped.append(Skipped(rel, reason))
                continue
            if stat.S_ISDIR(st.st_mode):
                (linked if entry.is_symlink() else real).append((rel, st))
            elif stat.S_ISREG(st.st_mode):
                found.append(FoundFile(rel, st.st_size))
                if progress is not None and len(found) % 1000 == 0:
                    progress(len(found))
            else:
                skipped.append(Skipped(rel, "not a regular file"))
    found.sort(key=lambda f: f.path)
    skipped.sort(key=lambda s: s.path)
    return found, skipped


def _is_utf8(name: str) -> bool:
    # os.scandir decodes undecodable bytes as lone surrogates; those cannot be stored as text.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
