"""Training augmentation and evaluation transforms that the reader runs as it decodes, under
the names and defaults of torchvision's: ``RandomResizedCrop``, ``RandomHorizontalFlip``,
``Resize``, ``CenterCrop``.

    open_reader(path, batch_size=256, seed=0,
                augment=[RandomResizedCrop(224), RandomHorizontalFlip()])   # training
    open_reader(path, batch_size=256, augment=[Resize(256), CenterCrop(224)])  # evaluation

The steps of a list collapse into one Placement (``packer.imaging.cropping``): which region
of the source lands where in the output. A JPEG is then decoded only at the scale that
region needs and resampled once. Every random draw comes from a counter-based generator
keyed by (seed, epoch, record index in the store), never from thread timing, so the same store, seed
and epoch give the same pixels with any ``workers``, ``prefetch``, batch size or resume point.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from packer.errors import UsageError
from packer.imaging import cropping

__all__ = [
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "Resize",
    "CenterCrop",
    "Augment",
    "RecordDraws",
    "record_rng",
]

_INTERPOLATIONS = ("bilinear",)


def _pair(size: Any, what: str) -> tuple[int, int]:
    """torchvision's ``size``: an int (square) or (height, width), checked."""
    if isinstance(size, (list, tuple)) and len(size) == 1:
        size = size[0]
    if isinstance(size, int) and not isinstance(size, bool):
        pair: tuple[Any, ...] = (size, size)
    elif isinstance(size, (list, tuple)) and len(size) == 2:
        pair = tuple(size)
    else:
        raise UsageError(f"{what}: size must be an int or (height, width), not {size!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in pair):
        raise UsageError(f"{what}: size must be positive whole pixels, not {size!r}")
    return pair[0], pair[1]


def _range(value: Any, what: str, name: str) -> tuple[float, float]:
    """A (min, max) of positive finite numbers, min <= max."""
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: {name} must be (min, max), not {value!r}") from None
    if not (math.isfinite(low) and math.isfinite(high) and 0 < low <= high):
        raise UsageError(
            f"{what}: {name} must be (min, max) with 0 < min <= max, not {tuple(value)!r}"
        )
    return low, high


def _interpolation(value: Any, antialias: Any, what: str) -> None:
    name = getattr(value, "value", value)  # torchvision's InterpolationMode.BILINEAR too
    if name not in _INTERPOLATIONS:
        raise UsageError(
            f"{what}: interpolation must be 'bilinear' (the one packer runs), not {value!r}"
        )
    if antialias is not True:
        raise UsageError(f"{what}: antialias must be True (packer always averages when it shrinks)")


@dataclass(frozen=True)
class RandomResizedCrop:
    """A crop of random area (``scale``, a fraction of the image) and aspect (``ratio``,
    width / height, drawn log-uniformly), resized to ``size``; after ten draws that do not
    fit, the centre crop nearest to ``ratio``. As torchvision's ``RandomResizedCrop``."""

    size: int | tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    interpolation: Any = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        what = "RandomResizedCrop"
        object.__setattr__(self, "size", _pair(self.size, what))
        object.__setattr__(self, "scale", _range(self.scale, what, "scale"))
        object.__setattr__(self, "ratio", _range(self.ratio, what, "ratio"))
        _interpolation(self.interpolation, self.antialias, what)
        object.__setattr__(self, "interpolation", "bilinear")

    def get_params(
        self, height: int, width: int, rng: RecordDraws | np.random.Generator
    ) -> tuple[int, int, int, int]:
        """The crop (top, left, height, width) for an image of ``height`` x ``width``, as
        torchvision's ``RandomResizedCrop.get_params`` draws it, from ``rng``."""
        area = height * width
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * rng.uniform(self.scale[0], self.scale[1])
            aspect = math.exp(rng.uniform(log_low, log_high))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                left = int(rng.integers(0, width - w + 1))
                return top, left, h, w
        shape = width / height  # ten misses: the centre, at the nearest allowed aspect
        if shape < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif shape > self.ratio[1]:
            h, w = height, round(height * self.ratio[1])
        else:
            h, w = height, width
        return (height - h) // 2, (width - w) // 2, h, w


@dataclass(frozen=True)
class RandomHorizontalFlip:
    """Mirror left to right with probability ``p``. As torchvision's."""

    p: float = 0.5

    def __post_init__(self) -> None:
        p = self.p
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
            raise UsageError(f"RandomHorizontalFlip: p must be a probability in [0, 1], not {p!r}")


@dataclass(frozen=True)
class Resize:
    """An int: the shorter side to ``size``, the longer in proportion (rounded down, as
    torchvision does); (height, width): exactly that. As torchvision's ``Resize``."""

    size: int | tuple[int, int]
    interpolation: Any = "bilinear"
    antialias: bool = True

    def __post_init__(self) -> None:
        size = self.size
        if isinstance(size, (list, tuple)) and len(size) == 1:
            size = size[0]
        if isinstance(size, int) and not isinstance(size, bool):
            _pair(size, "Resize")
        else:
            size = _pair(size, "Resize")
        object.__setattr__(self, "size", size)
        _interpolation(self.interpolation, self.antialias, "Resize")
        object.__setattr__(self, "interpolation", "bilinear")

    def output_size(self, height: float, width: float) -> tuple[float, float]:
        """The (height, width) an image of ``height`` x ``width`` is resized to."""
        if not isinstance(self.size, int):
            return float(self.size[0]), float(self.size[1])
        short, long = sorted((height, width))
        longer = float(int(self.size * long / short))
        return (float(self.size), longer) if height <= width else (longer, float(self.size))


@dataclass(frozen=True)
class CenterCrop:
    """The centre ``size`` of the image, padded with black where the image is smaller. As
    torchvision's ``CenterCrop``."""

    size: int | tuple[int, int]

    def __post_init__(self) -> None:
        object.__setattr__(self, "size", _pair(self.size, "CenterCrop"))


STEPS = (RandomResizedCrop, RandomHorizontalFlip, Resize, CenterCrop)


_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio: splitmix64's step


def _mix(value: int) -> int:
    """splitmix64's finaliser: a bijection of 64-bit ints whose every output bit depends on
    every input bit."""
    value = (value ^ (value >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    value = (value ^ (value >> 27)) * 0x94D049BB133111EB & _MASK
    return value ^ (value >> 31)


class RecordDraws:
    """The random numbers of one record in one epoch: a counter-based generator (splitmix64
    over a key made from seed, epoch and record), so the k-th draw is a pure function of
    (seed, epoch, record, k) in any thread and any order. Has the methods of
    ``numpy.random.Generator`` that the steps use. Made in about 1 us, where a NumPy
    generator took 27 us (SeedSequence hashing): per record, under the GIL."""

    __slots__ = ("_key", "_count")

    def __init__(self, seed: int, epoch: int, index: int) -> None:
        key = _mix((seed & _MASK) ^ 0x243F6A8885A308D3)
        key = _mix(key ^ (epoch & _MASK))
        self._key = _mix(key ^ (index & _MASK))
        self._count = 0

    def random(self) -> float:
        """A float in [0, 1), 53 random bits."""
        self._count += 1
        return (_mix((self._key + self._count * _GOLDEN) & _MASK) >> 11) * (1.0 / (1 << 53))

    def uniform(self, low: float, high: float) -> float:
        return low + (high - low) * self.random()

    def integers(self, low: int, high: int) -> int:
        """An int in [low, high)."""
        return low + min(int(self.random() * (high - low)), high - low - 1)


def source_seed(seed: int, source: int) -> int:
    """The seed the draws of a mixture's ``source``-th store are keyed by, so that record i of
    one store and record i of another get different crops. The first store keeps ``seed``
    itself: a store read alone draws as it does first in a mixture."""
    return seed if source == 0 else _mix((seed ^ source * _GOLDEN) & _MASK)


def record_rng(seed: int, epoch: int, index: int) -> RecordDraws:
    """The draws of one record in one epoch: a pure function of the three."""
    return RecordDraws(seed, epoch, index)


class Augment:
    """A checked list of steps, applied in order as one Placement per record."""

    def __init__(self, steps: Sequence[Any]) -> None:
        if isinstance(steps, STEPS) or not isinstance(steps, (list, tuple)):
            raise UsageError(
                f"augment must be a list of steps from packer.augment, not {type(steps).__name__}"
            )
        for step in steps:
            if not isinstance(step, STEPS):
                names = ", ".join(s.__name__ for s in STEPS)
                raise UsageError(
                    f"augment: {step!r} is not one of packer.augment's steps ({names}); "
                    "run other transforms with transform="
                )
        self.steps = tuple(steps)
        self.random = any(isinstance(s, (RandomResizedCrop, RandomHorizontalFlip)) for s in steps)

    def place(
        self, height: int, width: int, rng: RecordDraws | np.random.Generator | None
    ) -> cropping.Placement:
        """Where the steps put an upright ``height`` x ``width`` image, drawing from ``rng``."""
        placed = cropping.whole(height, width)
        for step in self.steps:
            rows, cols = placed.rows, placed.cols
            if isinstance(step, RandomResizedCrop):
                assert rng is not None
                top, left, h, w = step.get_params(round(rows.canvas), round(cols.canvas), rng)
                out_h, out_w = step.size  # type: ignore[misc]
                placed = cropping.Placement(
                    rows.cropped(top, h).resized(out_h),
                    cols.cropped(left, w).resized(out_w),
                    placed.flip,
                )
            elif isinstance(step, RandomHorizontalFlip):
                assert rng is not None
                if rng.random() < step.p:
                    placed = placed.mirrored()
            elif isinstance(step, Resize):
                to_h, to_w = step.output_size(rows.canvas, cols.canvas)
                placed = cropping.Placement(rows.resized(to_h), cols.resized(to_w), placed.flip)
            else:
                crop_h, crop_w = step.size
                placed = cropping.Placement(
                    rows.cropped(_centre(rows.canvas, crop_h), crop_h),
                    cols.cropped(_centre(cols.canvas, crop_w), crop_w),
                    placed.flip,
                )
        return placed


def _centre(length: float, crop: int) -> float:
    """Where torchvision's centre crop of ``crop`` starts on an axis of ``length`` pixels:
    rounded to the nearest pixel, or, where it pads, the padding's left share."""
    whole = round(length)
    if crop > whole:
        return -float((crop - whole) // 2)
    return float(int(round((whole - crop) / 2.0)))
