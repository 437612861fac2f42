"""Every error packer raises on purpose. The CLI turns a PackerError into one line and exit 1."""

from __future__ import annotations

__all__ = [
    "PackerError",
    "UsageError",
    "StateError",
    "SourceError",
    "EmptySourceError",
    "LabelsError",
    "BadImageError",
    "StoreExistsError",
    "StoreError",
    "IncompleteStoreError",
    "ManifestError",
    "CorruptRecordError",
    "PackInterrupted",
    "ResumeError",
]


class PackerError(Exception):
    """Base class: a problem the user can act on, with a message that says what and where."""


class UsageError(PackerError):
    """An option value that cannot work (bad size string, unknown encoding, ...)."""


class StateError(UsageError):
    """A saved reader state that is damaged, or belongs to another run (store, seed, ...)."""


class SourceError(PackerError):
    """The source folder cannot be read as asked."""


class EmptySourceError(SourceError):
    """The source holds no image to pack."""


class LabelsError(SourceError):
    """The labels file is malformed, names missing files, or escapes the source folder."""


class BadImageError(PackerError):
    """A source file is not a usable image (raised only with ``on_error="fail"``)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StoreExistsError(PackerError):
    """The output path exists and ``overwrite`` was not given."""


class StoreError(PackerError):
    """A store cannot be opened or written (not a store, disk full, ...)."""


class IncompleteStoreError(StoreError):
    """The path holds an unfinished pack: no manifest was committed."""


class ManifestError(StoreError):
    """The manifest is missing, malformed, of an unknown version, or disagrees with the shards."""


class CorruptRecordError(StoreError):
    """A record failed its checksum or could not be decoded; names store, shard, record and path."""

    def __init__(self, store: str, shard: str, index: int, path: str, reason: str) -> None:
        super().__init__(f"{store}: record {index} in {shard} ({path}): {reason}")
        self.store, self.shard, self.index, self.path, self.reason = (
            store,
            shard,
            index,
            path,
            reason,
        )

    def __reduce__(self) -> tuple[type, tuple[str, str, int, str, str]]:
        # Raised in a decode process, it comes back pickled: rebuilt from its parts, not
        # from its one-line message (the default), which __init__ would refuse.
        return type(self), (self.store, self.shard, self.index, self.path, self.reason)


class PackInterrupted(PackerError):
    """The pack was stopped (Ctrl-C, SIGTERM) before it finished; nothing was committed."""


class ResumeError(PackerError):
    """``--resume`` was asked for, but there is no unfinished pack of these inputs to resume."""
