"""Look at a store without reading its records: the manifest, and whether the shard files
it names are there with the sizes it says. (Reading every record is ``--verify``'s job.)"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.manifest import Manifest, read_manifest

__all__ = ["StoreSummary", "describe_store"]


@dataclass
class StoreSummary:
    path: Path
    manifest: Manifest
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "ok": self.ok,
            "problems": self.problems,
            "manifest": self.manifest.to_json(),
        }


def describe_store(path: Path | str) -> StoreSummary:
    """Read the manifest and stat every shard file it lists."""
    path = Path(path)
    manifest = read_manifest(path)
    problems = []
    for shard in manifest.shards:
        file = path / shard.file
        if not file.is_file():
            problems.append(f"{shard.file}: missing")
        elif file.stat().st_size != shard.bytes:
            problems.append(
                f"{shard.file}: {file.stat().st_size} bytes on disk, manifest says {shard.bytes}"
            )
    return StoreSummary(path, manifest, problems)
