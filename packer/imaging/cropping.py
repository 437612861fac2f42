"""Where a region of an image lands in the output, and drawing it there: the geometry that
crops, resizes, pads and flips collapse into, so that an image is decoded and resampled once.

A Placement says, per axis, which span of the upright source image (in its own pixels) is
scaled to which span of the output, on a canvas that may be larger (padding, black). A
JPEG then needs decoding only at the smallest reduced scale at which that span still has as
many pixels as it is scaled to (``least_decoded``); ``render`` crops the decoded pixels,
resizes once (``resizing``), pads and mirrors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from packer.imaging import resizing

__all__ = ["Axis", "Placement", "whole", "least_decoded", "render"]


@dataclass(frozen=True)
class Axis:
    """One axis of a Placement: source pixels [start, start + length) are scaled to output
    pixels [offset, offset + size), on a canvas of ``canvas`` pixels."""

    start: float
    length: float
    offset: float
    size: float
    canvas: float

    def resized(self, to: float) -> Axis:
        """The canvas scaled to ``to`` pixels, everything on it with it."""
        f = to / self.canvas
        return Axis(self.start, self.length, self.offset * f, self.size * f, to)

    def cropped(self, first: float, length: float) -> Axis:
        """The canvas cut to [first, first + length), which may reach past its edges (those
        parts become padding)."""
        shown_from = max(self.offset, first)
        shown_to = min(self.offset + self.size, first + length)
        if shown_to <= shown_from:  # nothing of the image is left: all padding
            return Axis(self.start, 0.0, 0.0, 0.0, length)
        per_pixel = self.length / self.size  # source pixels per canvas pixel
        return Axis(
            self.start + (shown_from - self.offset) * per_pixel,
            (shown_to - shown_from) * per_pixel,
            shown_from - first,
            shown_to - shown_from,
            length,
        )


@dataclass(frozen=True)
class Placement:
    rows: Axis
    cols: Axis
    flip: bool = False  # mirrored left to right

    @property
    def shape(self) -> tuple[int, int]:
        """The output's (height, width)."""
        return round(self.rows.canvas), round(self.cols.canvas)

    def mirrored(self) -> Placement:
        return replace(self, flip=not self.flip)


def whole(height: int, width: int) -> Placement:
    """The image as it is: every pixel in place."""
    return Placement(
        Axis(0.0, float(height), 0.0, float(height), float(height)),
        Axis(0.0, float(width), 0.0, float(width), float(width)),
    )


def least_decoded(placement: Placement, height: int, width: int) -> tuple[int, int]:
    """The smallest (width, height) that the whole ``height`` x ``width`` image may be
    decoded at so that the placed span is never scaled up from fewer pixels than full
    resolution would give it (or than it has, where the output enlarges it)."""
    need = []
    for axis, full in ((placement.cols, width), (placement.rows, height)):
        if axis.length <= 0 or axis.size <= 0:
            need.append(1)
            continue
        factor = min(1.0, axis.size / axis.length)  # output pixels per source pixel, at most 1
        need.append(max(1, min(full, math.ceil(full * factor - 1e-9))))
    return need[0], need[1]


def render(pixels: np.ndarray, placement: Placement, height: int, width: int) -> np.ndarray:
    """``placement`` drawn from ``pixels``, the upright ``height`` x ``width`` image decoded
    at full or reduced scale: a new contiguous height x width x channels uint8 array."""
    decoded_h, decoded_w, channels = pixels.shape
    rows, cols = placement.rows, placement.cols
    out_h, out_w = placement.shape
    inner_h, inner_w = round(rows.size), round(cols.size)
    if inner_h <= 0 or inner_w <= 0 or rows.length <= 0 or cols.length <= 0:
        return np.zeros((out_h, out_w, channels), np.uint8)
    fy, fx = decoded_h / height, decoded_w / width
    step_y, step_x = rows.length * fy / inner_h, cols.length * fx / inner_w
    if (fy, fx) != (1.0, 1.0) and max(step_y, step_x) <= 2 and channels in (1, 3):
        # Decoded at a reduced scale, the box's edges fall between decoded pixels: sampled at
        # their exact place (rounding them to whole pixels shifted the image by up to half a
        # decoded pixel, 4 source pixels at 1/8). At most a halving, bilinear needs no
        # average first (as in resizing._scaled).
        scaled = resizing.sample_box(
            pixels, (cols.start * fx, rows.start * fy), (step_x, step_y), (inner_w, inner_h)
        )
    else:
        top, bottom = _span(rows, fy, decoded_h)
        left, right = _span(cols, fx, decoded_w)
        scaled = resizing.scale_to(pixels[top:bottom, left:right], (inner_w, inner_h))
    if (inner_h, inner_w) != (out_h, out_w):
        canvas = np.zeros((out_h, out_w, channels), np.uint8)
        y, x = round(rows.offset), round(cols.offset)
        y, x = min(max(0, y), out_h - inner_h), min(max(0, x), out_w - inner_w)
        canvas[y : y + inner_h, x : x + inner_w] = scaled
        scaled = canvas
    if placement.flip:
        return resizing.mirrored(scaled)  # a new array
    if not scaled.flags.c_contiguous or np.may_share_memory(scaled, pixels):
        scaled = scaled.copy()  # the decoded pixels themselves: a fresh array
    return scaled


def _span(axis: Axis, factor: float, limit: int) -> tuple[int, int]:
    """The decoded pixels [first, last) of the axis' source span, at ``factor`` decoded
    pixels per source pixel: whole pixels, at least one, inside the image."""
    first = min(max(0, round(axis.start * factor)), limit - 1)
    last = min(limit, max(first + 1, round((axis.start + axis.length) * factor)))
    return first, last
