"""A decoded RGB image into a NumPy array: Pillow's ``tobytes`` against its Arrow export.

    python benchmarks/bench_array_export.py   # writes docs/benchmarks/components/array-export.md
    python benchmarks/bench_array_export.py --side 64 --repeat 5 --out /tmp/export.md

The reader turns each decoded image into an array with ``np.asarray(image)``, which calls
``Image.tobytes``: two copies with the GIL held. Pillow 13 also exports an image through the
Arrow C data interface, a zero-copy view of its own storage, but that storage keeps four
bytes per RGB pixel: an H x W x 3 array still needs the fourth byte of each pixel dropped,
done here with NumPy. Times are per image, best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import time
from collections.abc import Callable

import numpy as np
import reporting
from PIL import Image


class _ArrowArray(ctypes.Structure):
    """struct ArrowArray of the Arrow C data interface (its layout is fixed by the spec)."""


_ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(_ArrowArray))),
    ("dictionary", ctypes.POINTER(_ArrowArray)),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def via_tobytes(im: Image.Image) -> np.ndarray:
    return np.asarray(im)


def via_arrow(im: Image.Image) -> np.ndarray:
    """The image's RGBX storage seen through Arrow (a fixed-size list of 4 uint8 per pixel:
    the values are the child array's second buffer), copied into an H x W x 3 array."""
    _, capsule = im.__arrow_c_array__()
    array = ctypes.cast(_capsule_pointer(capsule, b"arrow_array"), ctypes.POINTER(_ArrowArray))
    values = array.contents.children[0].contents.buffers[1]
    width, height = im.size
    storage = (ctypes.c_uint8 * (width * height * 4)).from_address(values)
    view = np.frombuffer(storage, np.uint8).reshape(height, width, 4)
    return np.ascontiguousarray(view[:, :, :3])  # copied while the capsule is alive


def per_image_us(
    convert: Callable[[Image.Image], np.ndarray], im: Image.Image, repeat: int
) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        convert(im)
        best = min(best, time.perf_counter() - started)
    return best * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--side", type=int, default=400)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="print JSON; write no page")
    reporting.out_option(parser, "components/array-export.md")
    args = parser.parse_args(argv)
    noise = np.random.default_rng(0).integers(0, 256, (args.side // 8, args.side // 8, 3), np.uint8)
    encoded = io.BytesIO()
    Image.fromarray(noise).resize((args.side, args.side)).save(encoded, "JPEG", quality=90)
    im = Image.open(io.BytesIO(encoded.getvalue()))
    im.load()
    assert np.array_equal(via_arrow(im), via_tobytes(im))
    result = {
        "side": args.side,
        "tobytes_us": per_image_us(via_tobytes, im, args.repeat),
        "arrow_view_and_numpy_copy_us": per_image_us(via_arrow, im, args.repeat),
    }
    if args.json:
        print(json.dumps(result))
        return
    tobytes, arrow = result["tobytes_us"], result["arrow_view_and_numpy_copy_us"]
    text = reporting.header("Exporting a decoded image to NumPy", reporting.command(__file__, argv))
    text += (
        f"A decoded {args.side}x{args.side} RGB JPEG turned into an H x W x 3 array; microseconds "
        f"an image, best of {args.repeat}. Pillow's Arrow export is a zero-copy view of its "
        "storage, which keeps four bytes per RGB pixel, so NumPy copies it out without the "
        f"fourth. {reporting.load()}\n\n"
    )
    text += reporting.table(
        ["way", "µs an image"],
        [
            ["`np.asarray(image)` (`Image.tobytes`, what the reader does)", f"{tobytes:,.0f}"],
            ["Arrow view + NumPy copy dropping the fourth byte", f"{arrow:,.0f}"],
        ],
    )
    text += f"The Arrow way takes {arrow / tobytes:.1f}× the time of `tobytes`.\n"
    reporting.write(args.out, text)
    print(text)


if __name__ == "__main__":
    main()
