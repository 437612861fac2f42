"""Pack options: one validated object shared by the CLI, the planner and the worker pool."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from packer.arguments import check_seed, check_workers, default_workers
from packer.errors import UsageError
from packer.imaging.decode import DEFAULT_MAX_PIXELS, MODES
from packer.imaging.resizing import FITS

__all__ = ["PackOptions"]

ENCODINGS = ("jpeg", "png", "webp")
CHECKS = ("full", "header")
ON_ERROR = ("skip", "fail")
COMPRESSIONS = ("gzip", "lzf")


@dataclass
class PackOptions:
    """Every choice a pack makes. Validated on construction; recorded in the manifest."""

    backend: str = "lmdb"
    labels: str = "folders"  # "folders", "none" or the path of a CSV/TSV file
    path_column: str | None = None
    label_columns: list[str] | None = None
    seed: int | None = None  # None: a fresh random seed, recorded in the manifest
    shuffle: bool = True
    raw: bool = False  # store decoded uint8 pixels
    encode: str | None = None  # re-encode as jpeg / png / webp
    quality: int = 90
    max_side: int | None = None
    size: tuple[int, int] | None = None  # (height, width)
    fit: str = "crop"
    mode: str = "RGB"
    shard_size: int = 10**9
    shards: int | None = None  # a fixed number of shards instead of shard_size
    compression: str | None = None  # HDF5 only
    workers: int = 0  # 0: all cores
    check: str = "full"
    on_error: str = "skip"
    max_pixels: int = DEFAULT_MAX_PIXELS
    overwrite: bool = False
    resume: bool = False  # require an unfinished pack of the same inputs to resume
    append: bool = False  # add the images to the existing store as new shards
    dask: str | None = None  # write the shards on a Dask cluster: "tcp://host:8786", "local:N"

    def __post_init__(self) -> None:
        def choose(name: str, value: Any, allowed: tuple[str, ...]) -> None:
            if value not in allowed:
                raise UsageError(
                    f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}, not {value!r}"
                )

        choose("backend", self.backend, ("lmdb", "hdf5"))
        choose("mode", self.mode, MODES)
        choose("fit", self.fit, FITS)
        choose("check", self.check, CHECKS)
        choose("on_error", self.on_error, ON_ERROR)
        check_seed(self.seed)
        if self.encode is not None:
            choose("encode", self.encode, ENCODINGS)
        if self.compression is not None:
            choose("compression", self.compression, COMPRESSIONS)
            if self.backend != "hdf5":
                raise UsageError("--compression applies to HDF5 stores only")
        if self.raw and self.encode:
            raise UsageError("--raw stores decoded pixels; it cannot be combined with --encode")
        if self.max_side is not None and self.size is not None:
            raise UsageError("give --max-side or --size, not both")
        for name in ("quality", "max_side", "shards", "max_pixels", "shard_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be at least 1, not {value}")
        if not 1 <= self.quality <= 100:
            raise UsageError(f"--quality must be between 1 and 100, not {self.quality}")
        if self.workers < 0:
            raise UsageError(f"--workers must be 0 (all cores) or more, not {self.workers}")
        check_workers(self.workers)
        if self.size is not None and self.size[0] * self.size[1] > self.max_pixels:
            height, width = self.size
            raise UsageError(
                f"--size {height}x{width} is {height * width:,} pixels, "
                f"over the limit of {self.max_pixels:,} (--max-pixels)"
            )
        if self.mode == "keep" and self.encode == "jpeg":
            raise UsageError(
                "JPEG cannot keep alpha channels; use --mode RGB or L, or --encode png"
            )

    @property
    def payload(self) -> str:
        """'raw' pixels, 'encoded' (re-encoded by the pack) or 'original' source bytes."""
        if self.raw:
            return "raw"
        if self.encode or self.max_side or self.size:
            return "encoded"
        return "original"

    @property
    def encoding(self) -> str | None:
        """The encoding of re-encoded payloads: the one asked for, else JPEG for a resize."""
        if self.payload != "encoded":
            return None
        return self.encode or ("png" if self.mode == "keep" else "jpeg")

    @property
    def probes_only(self) -> bool:
        """The pool only parses headers: source bytes stored as they are, checked by header."""
        return self.payload == "original" and self.check == "header"

    @property
    def num_workers(self) -> int:
        """Worker processes a pack starts: ``workers``, or every core this process may use."""
        return self.workers or default_workers()

    def fixed_shape(self) -> list[int] | None:
        """[h, w, c] every record has, when the options alone decide it (raw, --size, RGB/L)."""
        if self.raw and self.size is not None and self.mode != "keep":
            return [self.size[0], self.size[1], 3 if self.mode == "RGB" else 1]
        return None

    def to_json(self) -> dict[str, Any]:
        """The options as JSON-ready values, as the manifest records them."""
        data = asdict(self)
        data["size"] = list(self.size) if self.size else None
        data["labels"] = str(self.labels)
        return data
