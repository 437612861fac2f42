"""Augmentation in the reader (packer.augment): torchvision's crop-box distribution, pixels
against a Pillow reference, exact reproducibility (runs, workers, prefetch, batch size,
resume), evaluation transforms, and refusals of bad parameters."""

from __future__ import annotations

import io
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import packer
from packer import PackOptions, open_reader
from packer.augment import (
    Augment,
    CenterCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    Resize,
    record_rng,
)
from packer.errors import UsageError
from packer.imaging import cropping

TRAIN = [RandomResizedCrop(64), RandomHorizontalFlip()]


def _photo(height: int, width: int, seed: int) -> Image.Image:
    """Smooth, photo-like content (gradients and soft blobs): resampling errors stay small
    where noise would turn every half-pixel shift into a large difference."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        a, b, c = rng.uniform(-1, 1, 3)
        value = 128 + 60 * np.sin(a * x / 37 + b * y / 29 + c * 6)
        for _ in range(3):
            cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(8, 60)
            value += 50 * np.exp(-((x - cx) ** 2 + (y - cy) ** 2) / (2 * r * r))
        channels.append(value)
    return Image.fromarray(np.clip(np.stack(channels, -1), 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def photo_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 photo-like JPEGs (and 4 PNGs) of many sizes and shapes, some smaller than the crop,
    one with EXIF orientation 6, packed into one LMDB store of 3 shards."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(1)
    for i in range(28):
        height, width = (int(v) for v in rng.integers(40, 700, 2))
        im = _photo(height, width, i)
        folder = root / "src" / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        if i % 7 == 3:
            im.save(folder / f"{i}.png")
        elif i == 5:
            exif = Image.Exif()
            exif[0x0112] = 6
            im.save(folder / f"{i}.jpg", quality=92, exif=exif)
        else:
            im.save(folder / f"{i}.jpg", quality=92)
    store = root / "photos.lmdb"
    packer.pack(root / "src", store, PackOptions(shards=3, seed=2))
    return store


def _by_path(store: Path, epoch: int = 0, **options: object) -> dict[str, np.ndarray]:
    """Every image of one epoch, by its original path."""
    found: dict[str, np.ndarray] = {}
    with open_reader(store, with_paths=True, **options) as reader:  # type: ignore[arg-type]
        for images, _, paths in reader.epoch(epoch):
            found.update(zip(paths, images))
    return found


def _upright(data: bytes) -> Image.Image:
    """Pillow's full decode, upright, in RGB."""
    return ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")


def _pillow_reference(im: Image.Image, box: tuple[int, int, int, int], size: tuple[int, int]):
    top, left, h, w = box
    crop = im.crop((left, top, left + w, top + h))
    return np.asarray(crop.resize(size[::-1], Image.Resampling.BILINEAR))


# -- the crop-box distribution ---------------------------------------------------------------


def _torchvision_params(height: int, width: int, scale, ratio, draws: int, seed: int) -> np.ndarray:
    """torchvision's ``RandomResizedCrop.get_params`` over ``draws`` draws, with torch's own
    generator: the real one where torchvision is installed, else its algorithm written out
    here (torchvision does not import beside this project's torch in the test venv)."""
    import torch

    torch.manual_seed(seed)
    try:
        from torchvision.transforms import RandomResizedCrop as Reference

        image = torch.zeros(1, height, width)
        return np.array([Reference.get_params(image, scale, ratio) for _ in range(draws)])
    except ImportError:
        pass
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    out = []
    for _ in range(draws):
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
            aspect = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
            w = int(round(math.sqrt(target_area * aspect)))
            h = int(round(math.sqrt(target_area / aspect)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                out.append((i, j, h, w))
                break
        else:
            in_ratio = float(width) / float(height)
            if in_ratio < min(ratio):
                w, h = width, int(round(width / min(ratio)))
            elif in_ratio > max(ratio):
                h, w = height, int(round(height * max(ratio)))
            else:
                w, h = width, height
            out.append(((height - h) // 2, (width - w) // 2, h, w))
    return np.array(out)


def _ks(a: np.ndarray, b: np.ndarray) -> float:
    """The two-sample Kolmogorov-Smirnov statistic: the largest gap between the two
    empirical distribution functions."""
    values = np.sort(np.concatenate([a, b]))
    cdf_a = np.searchsorted(np.sort(a), values, side="right") / len(a)
    cdf_b = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(cdf_a - cdf_b).max())


@pytest.mark.parametrize(
    "height, width, scale, ratio",
    [
        (375, 500, (0.08, 1.0), (3 / 4, 4 / 3)),  # an ImageNet photo, the defaults
        (600, 90, (0.08, 1.0), (3 / 4, 4 / 3)),  # tall and thin: many draws miss
        (200, 200, (0.5, 1.0), (0.5, 2.0)),
        (40, 900, (0.9, 1.0), (1.0, 1.0)),  # nearly always the fallback centre crop
    ],
)
def test_crop_boxes_follow_torchvision_distribution(height, width, scale, ratio) -> None:
    draws = 4000
    crop = RandomResizedCrop(64, scale=scale, ratio=ratio)
    ours = np.array([crop.get_params(height, width, record_rng(0, 0, i)) for i in range(draws)])
    theirs = _torchvision_params(height, width, scale, ratio, draws, seed=0)
    # The 0.1% critical value of the KS statistic for two samples of n: 1.95 * sqrt(2 / n).
    critical = 1.95 * math.sqrt(2 / draws)

    def features(boxes: np.ndarray) -> dict[str, np.ndarray]:
        top, left, h, w = boxes.T.astype(float)
        return {
            "area": h * w / (height * width),
            "aspect": w / h,
            # position within the room the crop leaves (0.5 where it leaves none)
            "top": np.where(h < height, top / np.maximum(height - h, 1), 0.5),
            "left": np.where(w < width, left / np.maximum(width - w, 1), 0.5),
        }

    mine, reference = features(ours), features(theirs)
    for name in mine:
        assert _ks(mine[name], reference[name]) < critical, name
    assert (ours[:, 2] <= height).all() and (ours[:, 3] <= width).all()
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()
    # the fallback: the same share of exact centre crops
    centre = (ours[:, 0] == (height - ours[:, 2]) // 2) & (ours[:, 1] == (width - ours[:, 3]) // 2)
    centre_ref = (theirs[:, 0] == (height - theirs[:, 2]) // 2) & (
        theirs[:, 1] == (width - theirs[:, 3]) // 2
    )
    assert abs(centre.mean() - centre_ref.mean()) < 0.03


def test_the_fallback_is_the_centre_at_the_nearest_ratio() -> None:
    crop = RandomResizedCrop(8, scale=(0.99, 1.0), ratio=(1.0, 1.0))
    assert crop.get_params(50, 1000, record_rng(3, 0, 0)) == (0, 475, 50, 50)
    assert crop.get_params(1000, 50, record_rng(3, 0, 0)) == (475, 0, 50, 50)


# -- pixels ----------------------------------------------------------------------------------


def _pillow_at_scale(data: bytes, placed: cropping.Placement, size: tuple[int, int]) -> np.ndarray:
    """Pillow's decode at the reduced scale packer picks for ``placed`` (its JPEG draft),
    then its bilinear resize of the same box, edges between pixels and all (``box=``)."""
    im = Image.open(io.BytesIO(data))
    full_w, full_h = im.size
    im.draft("RGB", cropping.least_decoded(placed, full_h, full_w))
    im = im.convert("RGB")
    fy, fx = im.height / full_h, im.width / full_w
    rows, cols = placed.rows, placed.cols
    box = (
        cols.start * fx,
        rows.start * fy,
        (cols.start + cols.length) * fx,
        (rows.start + rows.length) * fy,
    )
    return np.asarray(im.resize(size[::-1], Image.Resampling.BILINEAR, box=box))


def test_random_crops_match_pillow_on_the_same_box(photo_store: Path) -> None:
    """Each output is the box torchvision would crop (drawn from the record's own generator),
    resized. Tolerances, per image: against Pillow's resize of the same box from the same
    decoded image (a JPEG at packer's reduced DCT scale), mean absolute difference under 2
    levels and 99% within 8 (OpenCV's resampling against Pillow's antialiased bilinear);
    against Pillow's full decode, mean under 4.5 and 99% within 14 (what a 1/8-scale decode
    loses on a small crop)."""
    steps = [RandomResizedCrop((48, 64)), RandomHorizontalFlip()]
    got = _by_path(photo_store, epoch=3, batch_size=5, augment=steps, seed=11)
    plan = Augment(steps)
    reduced = flipped = 0
    with packer.open_store(photo_store) as store:
        index_of = {record.path: i for i, record in store.indexed_records()}
        assert len(got) == len(index_of)
        for path, image in got.items():
            data = bytes(store.record(index_of[path]).data)
            im = _upright(data)
            rng = record_rng(11, 3, index_of[path])
            box = steps[0].get_params(im.height, im.width, rng)
            flip = rng.random() < 0.5
            placed = plan.place(im.height, im.width, record_rng(11, 3, index_of[path]))
            assert placed.flip == flip
            assert image.shape == (48, 64, 3) and image.dtype == np.uint8
            if flip:
                image = image[:, ::-1]
                flipped += 1
            full = np.abs(image.astype(int) - _pillow_reference(im, box, (48, 64)).astype(int))
            assert full.mean() < 4.5 and np.percentile(full, 99) <= 14, path
            if path.endswith(".jpg") and path != "b/5.jpg":  # (5: EXIF-turned, drafted unturned)
                same = np.abs(image.astype(int) - _pillow_at_scale(data, placed, (48, 64)))
                assert same.mean() < 2.0 and np.percentile(same, 99) <= 8, path
                reduced += cropping.least_decoded(placed, im.height, im.width) != (
                    im.width,
                    im.height,
                )
        assert 0 < flipped < len(got)
        assert reduced >= 5  # the reduced-scale decode was exercised


def test_flip_mirrors_the_same_crop(photo_store: Path) -> None:
    kept = _by_path(
        photo_store, batch_size=7, augment=[RandomResizedCrop(32), RandomHorizontalFlip(0)]
    )
    turned = _by_path(
        photo_store, batch_size=7, augment=[RandomResizedCrop(32), RandomHorizontalFlip(1)]
    )
    for path, image in kept.items():
        assert np.array_equal(turned[path], image[:, ::-1])


def test_evaluation_transforms_match_pillow(photo_store: Path) -> None:
    """Resize(72) + CenterCrop(64), as torchvision does it on Pillow: the shorter side to 72,
    then the centre 64 x 64; same tolerance as the random crops."""
    got = _by_path(photo_store, batch_size=6, augment=[Resize(72), CenterCrop(64)])
    with packer.open_store(photo_store) as store:
        for record in store.records():
            im = _upright(bytes(record.data))
            short, long = sorted((im.width, im.height))
            longer = int(72 * long / short)
            size = (72, longer) if im.width <= im.height else (longer, 72)
            resized = im.resize(size, Image.Resampling.BILINEAR)
            left = int(round((resized.width - 64) / 2.0))
            top = int(round((resized.height - 64) / 2.0))
            reference = np.asarray(resized.crop((left, top, left + 64, top + 64)))
            diff = np.abs(got[record.path].astype(int) - reference.astype(int))
            assert diff.mean() < 2.5, (record.path, diff.mean())
            assert np.percentile(diff, 99) <= 12, (record.path, np.percentile(diff, 99))


def test_a_centre_crop_larger_than_the_image_pads_with_black(tmp_path: Path) -> None:
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    pixels = np.asarray(_photo(30, 50, 0))
    Image.fromarray(pixels).save(src / "small.png")
    store = tmp_path / "s.lmdb"
    packer.pack(tmp_path / "src", store, PackOptions(seed=0))
    (image,) = _by_path(store, batch_size=1, augment=[CenterCrop((40, 44))]).values()
    # torchvision: pad (44-50 < 0: none across; (40-30)//2 = 5 above, 5 below), then crop the
    # centre 44 of 50 columns from column round(6 / 2) = 3
    expected = np.zeros((40, 44, 3), np.uint8)
    expected[5:35] = pixels[:, 3:47]
    assert np.array_equal(image, expected)


def test_an_image_smaller_than_the_crop_is_enlarged(photo_store: Path) -> None:
    got = _by_path(photo_store, batch_size=4, augment=[RandomResizedCrop(256)], seed=1)
    assert {image.shape for image in got.values()} == {(256, 256, 3)}


def test_raw_stores_augment_too(tmp_path: Path, photo_store: Path) -> None:
    raw = tmp_path / "raw.lmdb"
    src = photo_store.parent / "src"
    packer.pack(src, raw, PackOptions(raw=True, size=(60, 80), fit="stretch", seed=2))
    steps = [RandomResizedCrop(40), RandomHorizontalFlip()]
    first = _by_path(raw, batch_size=5, augment=steps, seed=4)
    again = _by_path(raw, batch_size=3, augment=steps, seed=4, workers=2)
    assert {im.shape for im in first.values()} == {(40, 40, 3)}
    assert all(np.array_equal(first[p], again[p]) for p in first)
    with packer.open_store(raw) as store:
        for i, record in store.indexed_records():
            stored = np.frombuffer(bytes(record.data), np.uint8).reshape(record.shape)
            rng = record_rng(4, 0, i)
            top, left, h, w = steps[0].get_params(60, 80, rng)
            reference = _pillow_reference(Image.fromarray(stored), (top, left, h, w), (40, 40))
            if rng.random() < 0.5:
                reference = reference[:, ::-1]
            assert np.abs(first[record.path].astype(int) - reference.astype(int)).mean() < 2.5


# -- reproducibility -------------------------------------------------------------------------


def _batches(store: Path, **options: object) -> list[tuple[np.ndarray, np.ndarray]]:
    with open_reader(store, augment=TRAIN, seed=7, chunk_size=4, **options) as reader:  # type: ignore[arg-type]
        return [(images.copy(), labels.copy()) for images, labels in reader.epoch(2)]


def _same(a: list[tuple[np.ndarray, np.ndarray]], b: list[tuple[np.ndarray, np.ndarray]]) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x[0], y[0]) and np.array_equal(x[1], y[1]) for x, y in zip(a, b)
    )


def test_batches_are_bit_identical_across_runs_workers_and_prefetch(photo_store: Path) -> None:
    base = _batches(photo_store, batch_size=6, workers=1, prefetch=1)
    assert _same(base, _batches(photo_store, batch_size=6, workers=1, prefetch=1))
    assert _same(base, _batches(photo_store, batch_size=6, workers=4, prefetch=1))
    assert _same(base, _batches(photo_store, batch_size=6, workers=4, prefetch=8))
    # another batch size: the same image for each record, only grouped otherwise
    other = _batches(photo_store, batch_size=5, workers=3, prefetch=2)
    assert np.array_equal(
        np.concatenate([b[0] for b in base]), np.concatenate([b[0] for b in other])
    )
    # another epoch, or another seed: other crops of each image
    crops = {
        (seed, epoch): _by_path(photo_store, epoch, batch_size=6, augment=TRAIN, seed=seed)
        for seed, epoch in ((7, 2), (7, 3), (8, 2))
    }
    for other in ((7, 3), (8, 2)):
        differ = [not np.array_equal(crops[7, 2][p], crops[other][p]) for p in crops[7, 2]]
        assert sum(differ) >= len(differ) - 2


@pytest.mark.parametrize("workers, prefetch", [(1, 1), (4, 3)])
def test_a_resumed_reader_gives_the_batches_of_the_uninterrupted_run(
    photo_store: Path, workers: int, prefetch: int
) -> None:
    options = dict(batch_size=4, augment=TRAIN, seed=9, chunk_size=4, buffer_chunks=2)
    with open_reader(photo_store, **options, workers=1, prefetch=1) as reader:  # type: ignore[arg-type]
        full = [images.copy() for images, _ in reader.epoch(1)]
    with open_reader(photo_store, **options, workers=workers, prefetch=prefetch) as reader:  # type: ignore[arg-type]
        it = reader.epoch(1)
        first = [next(it)[0].copy() for _ in range(3)]
        state = reader.state_dict()
    with open_reader(photo_store, **options, workers=workers, prefetch=prefetch) as resumed:  # type: ignore[arg-type]
        resumed.load_state_dict(state)
        rest = [images.copy() for images, _ in resumed]
    assert len(first + rest) == len(full)
    assert all(np.array_equal(a, b) for a, b in zip(first + rest, full))


def test_torch_dataloader_workers_give_the_readers_pixels(photo_store: Path) -> None:
    torch = pytest.importorskip("torch")
    from packer.torch_adapter import TorchDataset

    options = dict(augment=TRAIN, seed=3, chunk_size=4)
    expected = _by_path(photo_store, epoch=1, batch_size=4, **options)
    dataset = TorchDataset(photo_store, batch_size=4, output="torch", with_paths=True, **options)
    dataset.set_epoch(1)
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    seen = {}
    for images, _, paths in loader:
        assert images.dtype == torch.uint8 and images.shape[1:] == (64, 64, 3)
        seen.update(zip(paths, images.numpy()))
    assert seen.keys() == expected.keys()
    assert all(np.array_equal(seen[p], expected[p]) for p in seen)


# -- refusals --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "steps, message",
    [
        (lambda: [RandomResizedCrop(224, scale=(0.9, 0.1))], "scale must be"),
        (lambda: [RandomResizedCrop(224, scale=(0.0, 1.0))], "scale must be"),
        (lambda: [RandomResizedCrop(224, ratio=(4 / 3, 3 / 4))], "ratio must be"),
        (lambda: [RandomResizedCrop(224, ratio=(-1, 2))], "ratio must be"),
        (lambda: [RandomResizedCrop(224, scale="big")], "scale must be"),
        (lambda: [RandomResizedCrop(0)], "size must be"),
        (lambda: [RandomResizedCrop((224, 224, 3))], "size must be"),
        (lambda: [RandomResizedCrop(224, interpolation="nearest")], "interpolation"),
        (lambda: [RandomHorizontalFlip(1.5)], "probability"),
        (lambda: [Resize(-3)], "size must be"),
        (lambda: [CenterCrop("x")], "size must be"),
        (lambda: [lambda im: im], "not one of packer.augment's steps"),
        (lambda: RandomResizedCrop(224), "must be a list"),
    ],
)
def test_bad_parameters_are_refused_at_open_reader_in_one_line(
    photo_store: Path, steps, message: str
) -> None:
    with pytest.raises(UsageError, match=message) as caught:
        open_reader(photo_store, batch_size=4, augment=steps())
    assert "\n" not in str(caught.value)


def test_augment_with_size_or_without_decoding_is_refused(photo_store: Path) -> None:
    with pytest.raises(UsageError, match="size or augment"):
        open_reader(photo_store, batch_size=4, augment=TRAIN, size=(8, 8))
    with pytest.raises(UsageError, match="decode=True"):
        open_reader(photo_store, batch_size=4, augment=TRAIN, decode=False)


def test_the_stores_of_a_mixture_draw_their_own_crops(tmp_path: Path, photo_store: Path) -> None:
    """Two copies of one store, mixed: the same record of each gets its own crop, while the
    first store draws as it does read alone."""
    twin = tmp_path / "twin.lmdb"
    shutil.copytree(photo_store, twin)
    crops: dict[tuple[int, str], np.ndarray] = {}
    with open_reader(
        [photo_store, twin], weights=None, batch_size=6, augment=TRAIN, seed=7, with_paths=True
    ) as reader:
        for images, _, sources, paths in reader.epoch(0):
            for image, source, path in zip(images, sources, paths):
                crops[int(source), path] = image
    alone = _by_path(photo_store, 0, batch_size=6, augment=TRAIN, seed=7)
    paths = sorted(alone)
    assert all(np.array_equal(crops[0, p], alone[p]) for p in paths)
    differ = [not np.array_equal(crops[0, p], crops[1, p]) for p in paths]
    assert sum(differ) >= len(differ) - 2
