"""Where a pack writes before it is finished, and the rename that makes it a store.

A pack writes into ``OUT.partial/`` while holding a lock on a file inside it, so two packs
never write the same store. ``commit`` renames the finished folder to ``OUT`` in one step:
nothing appears under the final name until every shard and the manifest are on disk.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import lmdb

from packer.errors import PackInterrupted, StoreError, StoreExistsError
from packer.manifest import MANIFEST_NAME, Manifest, fsync_dir, write_manifest

__all__ = ["Staging", "partial_path", "describe_write_error"]

log = logging.getLogger(__name__)
_LOCK_NAME = ".lock"


def partial_path(final: Path) -> Path:
    return final.with_name(final.name + ".partial")


class Staging:
    """Owns ``OUT.partial`` for one pack: create, lock, then commit or discard."""

    def __init__(self, final: Path, overwrite: bool = False) -> None:
        self.final = final
        self.path = partial_path(final)
        if final.exists() or final.is_symlink():
            if not overwrite:
                raise StoreExistsError(
                    f"{final} already exists; pass --overwrite or choose another path"
                )
            if not _is_replaceable(final):
                raise StoreExistsError(
                    f"{final} exists and is not a packer store; refusing to overwrite it"
                )
        if self.path.exists():
            self._remove_stale()
        self.path.mkdir(parents=True)
        self._lock_fd = os.open(self.path / _LOCK_NAME, os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _remove_stale(self) -> None:
        lock = self.path / _LOCK_NAME
        if lock.exists():
            fd = os.open(lock, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StoreError(
                    f"another pack is writing {self.final} (it holds {lock})"
                ) from None
            finally:
                os.close(fd)
        log.warning("removing %s, left by a pack that did not finish", self.path)
        shutil.rmtree(self.path)

    def commit(self) -> None:
        """Make the staged folder the store; the previous store (with overwrite) goes only after."""
        old = None
        if self.final.exists() or self.final.is_symlink():
            old = self.final.with_name(f"{self.final.name}.old-{os.getpid()}")
            os.replace(self.final, old)
        os.replace(self.path, self.final)
        fsync_dir(self.final.parent)
        os.unlink(self.final / _LOCK_NAME)
        os.close(self._lock_fd)
        if old is not None:
            _remove(old)

    def build(self, make: Callable[[Path], Manifest], action: str) -> Manifest:
        """Run ``make(folder)``, which writes the shards and returns the manifest; write the
        manifest and commit. On any error or Ctrl-C the staged folder is removed, and a
        write error (a full disk above all) becomes a StoreError naming the store."""
        try:
            manifest = make(self.path)
            write_manifest(self.path, manifest)
            self.commit()
            return manifest
        except KeyboardInterrupt:
            self.discard()
            raise PackInterrupted(f"interrupted: nothing was written to {self.final}") from None
        except (OSError, lmdb.Error) as e:  # disk full, I/O error, quota: the store's, not a file's
            self.discard()
            reason = describe_write_error(e, self.final.parent, action)
            raise StoreError(f"{self.final}: {reason}; nothing was written") from e
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        """Remove the staged folder (after an error or Ctrl-C): nothing is left behind."""
        shutil.rmtree(self.path, ignore_errors=True)
        os.close(self._lock_fd)


def describe_write_error(e: Exception, folder: Path, action: str) -> str:
    """One line for an error while writing a store; a full disk is named as such, since LMDB
    reports a short write as a plain I/O error (EIO)."""
    free = shutil.disk_usage(folder).free
    if getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e) or free < 64 << 20:
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
