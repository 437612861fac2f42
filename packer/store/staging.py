"""Where a pack writes before it is finished, and the rename that makes it a store.

A pack writes into ``OUT.partial/`` while holding a lock on a file inside it, so two packs
never write the same store. A pack that stops with finished shards leaves them there for
the same command to resume from (see ``packer.packing.ledger``). ``commit`` renames the finished folder to ``OUT`` in one step:
nothing appears under the final name until every shard and the manifest are on disk.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import lmdb

from packer.errors import PackInterrupted, StoreError, StoreExistsError
from packer.store.hdf5_store import is_disk_full
from packer.store.manifest import MANIFEST_NAME, Manifest, fsync_path, write_manifest

__all__ = ["Staging", "partial_path", "describe_write_error"]

log = logging.getLogger(__name__)
_LOCK_NAME = ".lock"


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


class Staging:
    """Owns ``OUT.partial`` for one pack: create, lock, then commit or discard."""

    def __init__(
        self,
        final: Path,
        overwrite: bool = False,
        keep_unfinished: bool = False,
        *,
        staged: Path | None = None,
    ) -> None:
        """Create and lock ``OUT.partial``. What an earlier, unfinished run left there is
        removed, or kept with ``keep_unfinished`` for the caller to resume from. ``staged``:
        another folder to stage in, for an append to the existing store ``final`` (which
        messages name; ``commit`` is not used)."""
        self.final = final
        self.path = staged or partial_path(final)
        if staged is None and (final.exists() or final.is_symlink()):
            if not overwrite:
                raise StoreExistsError(
                    f"{final} already exists; pass --overwrite or choose another path"
                )
            if not _is_replaceable(final):
                raise StoreExistsError(
                    f"{final} exists and is not a packer store; refusing to overwrite it"
                )
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._lock_fd = os.open(self.path / _LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o644)
        except OSError as e:  # a read-only or immutable folder, no permission
            raise StoreError(f"{final}: cannot write {self.path}: {e.strerror or e}") from e
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise StoreError(
                f"another pack is writing {final} (it holds {self.path / _LOCK_NAME})"
            ) from None
        if not keep_unfinished and self.leftovers():
            log.warning("removing %s, left by a run that did not finish", self.path)
            self.clear()

    def leftovers(self) -> list[Path]:
        """What an earlier run left in the staged folder."""
        return [p for p in self.path.iterdir() if p.name != _LOCK_NAME]

    def clear(self) -> None:
        """Empty the staged folder, keeping the lock."""
        for path in self.leftovers():
            _remove(path)

    def commit(self) -> None:
        """Make the staged folder the store; the previous store (with overwrite) goes only after."""
        old = None
        if self.final.exists() or self.final.is_symlink():
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.path, self.final)
        fsync_path(self.final.parent)
        os.unlink(self.final / _LOCK_NAME)
        os.close(self._lock_fd)
        if old is not None:
            _remove(old)

    def build(
        self,
        make: Callable[[Path], Manifest],
        action: str,
        kept: Callable[[], str | None] | None = None,
        commit: Callable[[Manifest], None] | None = None,
    ) -> Manifest:
        """Run ``make(folder)``, which writes the shards and returns the manifest; write the
        manifest and commit. On any error the staged folder is removed; after Ctrl-C or a
        write error, which the same command can get past later, it is kept if ``kept()`` names
        finished work worth resuming from. A write error (a full disk above all) becomes a
        StoreError naming the store. ``commit``, if given, puts the result in place instead
        of the manifest and rename; the staged folder is then removed."""
        try:
            manifest = make(self.path)
            if commit is None:
                write_manifest(self.path, manifest)
                self.commit()
            else:
                commit(manifest)
                self.discard()
            return manifest
        except KeyboardInterrupt:
            note = self._keep_or_discard(kept)
            raise PackInterrupted(
                f"interrupted: nothing was written to {self.final}{note}"
            ) from None
        except (OSError, lmdb.Error, RuntimeError) as e:  # disk full, I/O error, quota: the store's
            if isinstance(e, RuntimeError) and not is_disk_full(e):  # h5py's word for ENOSPC
                self.discard()
                raise
            note = self._keep_or_discard(kept)
            reason = describe_write_error(e, self.final.parent, action)
            raise StoreError(f"{self.final}: {reason}; nothing was written{note}") from e
        except BaseException:
            self.discard()
            raise

    def _keep_or_discard(self, kept: Callable[[], str | None] | None) -> str:
        """Keep the staged folder if it holds finished work; the note says so to the user."""
        note = kept() if kept is not None else None
        if note is None:
            self.discard()
            return ""
        self.release()
        return f"; {note}"

    def release(self) -> None:
        """Leave the staged folder as it is, for a later run; unlock it."""
        os.close(self._lock_fd)

    def discard(self) -> None:
        """Remove the staged folder and its lock: nothing is left behind."""
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)


def describe_write_error(e: Exception, folder: Path, action: str) -> str:
    """One line for an error while writing a store; a full disk is named as such, since LMDB
    reports a short write as a plain I/O error (EIO)."""
    free = shutil.disk_usage(folder).free
    if is_disk_full(e) or "No space left" in str(e) or free < 64 << 20:
        return f"no space left on device ({free:,} bytes free); free some space and {action} again"
    return str(e)


def _is_replaceable(path: Path) -> bool:
    if path.is_dir() and not path.is_symlink():
        return (path / MANIFEST_NAME).is_file() or not any(path.iterdir())
    return False


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
