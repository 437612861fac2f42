"""decode_on_gpu: a store's JPEGs decoded by torchvision (nvJPEG on a GPU), each batch as the
reader would give it decoded. Runs on the CPU where torchvision is installed (its decoder, the
same thread ahead of the loop), on the GPU where there is one; skipped without torchvision."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from helpers import encoded
from PIL import Image

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision", reason="decode_on_gpu needs torchvision; not installed here")

from packer import PackOptions, open_reader, pack  # noqa: E402
from packer.errors import CorruptRecordError, UsageError  # noqa: E402
from packer.gpu_decode import decode_on_gpu  # noqa: E402
from packer.imaging.decode import decode_resized  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
SIZE = (24, 40)


def _smooth(width: int, height: int, seed: int) -> Image.Image:
    """A photo-like picture: smooth colour fields, so two resamplers agree to a level or two."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, (3, 4, 3), np.uint8)
    return Image.fromarray(coarse).resize((width, height), Image.Resampling.BICUBIC)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JPEGs of several shapes, one of them turned on its side by EXIF, and a PNG."""
    root = tmp_path_factory.mktemp("photos")
    for i, (w, h) in enumerate([(64, 48), (50, 70), (80, 40), (33, 33)] * 3):
        (root / f"c{i % 2}").mkdir(exist_ok=True)
        image = _smooth(w, h, i)
        if i == 5:
            exif = Image.Exif()
            exif[0x0112] = 6  # rotated: shown a quarter turn clockwise
            data = encoded(image, "JPEG", quality=95, exif=exif)
        else:
            data = encoded(image, "PNG" if i == 7 else "JPEG", quality=95)
        (root / f"c{i % 2}" / f"{i:02d}.{'png' if i == 7 else 'jpg'}").write_bytes(data)
    out = tmp_path_factory.mktemp("store") / "s.lmdb"
    pack(root, out, PackOptions(seed=0, workers=1))
    return out


def _cpu_batches(store: Path, fit: str) -> list[tuple[np.ndarray, np.ndarray, list[str]]]:
    options = {"batch_size": 5, "seed": 3, "with_paths": True, "size": SIZE, "fit": fit}
    with open_reader(store, **options) as reader:
        return list(reader.epoch(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fit", ["crop", "stretch"])
def test_batches_are_the_readers_own_decoded(store: Path, device: str, fit: str) -> None:
    """Same records in the same order, upright, at the reader's size and fit: pixels within
    a couple of levels of the reader's (another JPEG decoder and resampler)."""
    expected = _cpu_batches(store, fit)
    with open_reader(store, batch_size=5, seed=3, with_paths=True, decode=False) as reader:
        got = list(decode_on_gpu(reader.epoch(1), SIZE, fit=fit, device=device))
    assert len(got) == len(expected) == 3
    for (images, labels, paths), (want, want_labels, want_paths) in zip(got, expected):
        assert paths == want_paths
        assert images.device.type == device and images.dtype == torch.uint8
        assert images.shape == (len(paths), *SIZE, 3) and images.is_contiguous()
        np.testing.assert_array_equal(labels.cpu().numpy(), want_labels)
        difference = np.abs(images.cpu().numpy().astype(int) - want.astype(int))
        assert difference.mean() < 2.5, paths


def test_an_image_nvjpeg_refuses_is_decoded_on_the_cpu_and_a_broken_one_named() -> None:
    """A CMYK JPEG (nvJPEG declines it on the GPU; the CPU decodes it), then a JPEG cut short:
    the one-line error names its path."""
    good = encoded(_smooth(40, 30, 1), "JPEG")
    cmyk = encoded(_smooth(40, 30, 2).convert("CMYK"), "JPEG")
    batch = ([good, cmyk], np.array([0, 1]), ["a.jpg", "cmyk.jpg"])
    [(images, labels, paths)] = list(decode_on_gpu([batch], SIZE, device="cpu"))
    assert images.shape == (2, *SIZE, 3) and paths == ["a.jpg", "cmyk.jpg"]
    broken = ([good, good[: len(good) // 3]], np.array([0, 1]), ["a.jpg", "broken.jpg"])
    with pytest.raises(
        CorruptRecordError, match=r"record 1 in batch 1 \(broken.jpg\): does not decode"
    ):
        list(decode_on_gpu([batch, broken], SIZE, device="cpu"))


def test_decoded_batches_and_impossible_options_are_refused_in_one_line(store: Path) -> None:
    decoded = open_reader(store, batch_size=4, size=(8, 8))  # decoded: one array a batch
    with decoded, pytest.raises(UsageError, match="open it with decode=False"):
        list(decode_on_gpu(decoded.epoch(0), SIZE, device="cpu"))
    for size, fit, ahead in [((0, 4), "crop", 1), (SIZE, "pad", 1), (SIZE, "crop", 0)]:
        with pytest.raises(UsageError, match="decode_on_gpu: "):  # at the call, not later
            decode_on_gpu([], size, fit=fit, ahead=ahead, device="cpu")


@pytest.mark.parametrize("device", DEVICES)
def test_a_loop_that_stops_early_leaves_no_thread_and_stops_the_epoch(
    store: Path, device: str
) -> None:
    with open_reader(store, batch_size=2, decode=False) as reader:
        epoch = reader.epoch(0)
        for images, _ in decode_on_gpu(epoch, SIZE, device=device, ahead=1):
            assert images.shape[0] == 2
            break
        names = [t.name for t in threading.enumerate()]
        assert "packer-gpu-decode" not in names
        assert list(reader.epoch(0))  # the reader reads on, from the start of an epoch


def test_an_error_in_the_records_reaches_the_loop_not_a_thread() -> None:
    """Bytes that are no image at all: the loop gets the one-line error; nothing hangs."""
    batches = [([b"not an image"], np.array([0]), ["x.bin"])]
    with pytest.raises(CorruptRecordError, match=r"\(x.bin\): does not decode"):
        list(decode_on_gpu(batches, SIZE, device="cpu"))
    assert "packer-gpu-decode" not in [t.name for t in threading.enumerate()]


@pytest.mark.parametrize("device", DEVICES)
def test_every_exif_orientation_stands_upright_as_the_reader_stands_it(device: str) -> None:
    """nvJPEG ignores EXIF (torchvision's GPU decoder: this failed on an H200), so
    decode_on_gpu turns each image itself: all eight orientations, against the reader's."""
    picture = _smooth(48, 32, 4)
    payloads = []
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        payloads.append(encoded(picture, "JPEG", quality=95, exif=exif))
    batch = (payloads, np.zeros(8, np.int64), [f"o{o}.jpg" for o in range(1, 9)])
    [(images, _, _)] = list(decode_on_gpu([batch], SIZE, fit="stretch", device=device))
    for orientation, (image, payload) in enumerate(zip(images.cpu().numpy(), payloads), 1):
        want = decode_resized(payload, "RGB", size=SIZE, fit="stretch")
        assert np.abs(image.astype(int) - want.astype(int)).mean() < 2.5, orientation
