"""Image data of the vit and diffusion tasks: a CIFAR-10 pickle folder, an ImageFolder tree, or
scikit-learn's 8x8 digits (the default: it ships with scikit-learn, so nothing downloads).

Every source becomes an ImageData held in memory: uint8 images (N, 3, S, S) at the task's image
size S, int64 labels, a train and a held-out split. Loaded once per (path, size).
"""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import groupby
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from .base import TaskError
from .common import data_path

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff"}
CIFAR_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_FILES = (*CIFAR_TRAIN_FILES, "test_batch")
CIFAR_CLASSES = 10
RESIZE_CHUNK = 4096  # images resized at once (bounds the float copy)

Split = tuple[torch.Tensor, torch.Tensor]  # images (N, 3, S, S) uint8, labels (N,) int64
Files = list[tuple[Path, int]]  # (image path, class index)


@dataclass(frozen=True)
class ImageData:
    name: str  # "cifar10", "imagefolder" or "digits"
    source: str  # the data path, or "sklearn.datasets.load_digits"
    train_images: torch.Tensor  # (N, 3, S, S) uint8
    train_labels: torch.Tensor  # (N,) int64
    val_images: torch.Tensor  # (M, 3, S, S) uint8
    val_labels: torch.Tensor  # (M,) int64
    num_classes: int
    flips_keep_label: bool  # a mirrored digit is no digit, a mirrored cat is a cat
    channel_mean: torch.Tensor  # (3,) float32, of the train split in 0..255
    channel_std: torch.Tensor  # (3,) float32

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "data": self.source,
            "train_images": len(self.train_labels),
            "val_images": len(self.val_labels),
            "num_classes": self.num_classes,
            "image_size": self.train_images.shape[-1],
        }


_CACHE: dict[tuple[str | None, int], ImageData] = {}


def load_images(data: str | Path | None, image_size: int) -> ImageData:
    """The image data set at `data` (None: digits) at image_size x image_size, cached."""
    path = data_path(data)
    key = (None if path is None else str(path), image_size)
    if key not in _CACHE:
        _CACHE[key] = _load(path, image_size)
    return _CACHE[key]


def _load(path: Path | None, image_size: int) -> ImageData:
    if path is None:
        digits = _digits(image_size)
        return _finish("digits", "sklearn.datasets.load_digits", *digits, flips=False)
    if not path.is_dir():
        raise TaskError(f"image data {path} is not a folder (a CIFAR-10 folder or ImageFolder)")
    if any((path / name).exists() for name in (*CIFAR_FILES, "batches.meta")):
        return _finish("cifar10", str(path), *_cifar(path, image_size), flips=True)
    return _finish("imagefolder", str(path), *_image_folder(path, image_size), flips=True)


def _finish(name: str, source: str, train: Split, val: Split, flips: bool) -> ImageData:
    if len(train[1]) == 0 or len(val[1]) == 0:
        raise TaskError(f"image data {source} needs images in both the train and the val split")
    mean, std = _channel_stats(train[0])
    num_classes = int(max(train[1].max(), val[1].max())) + 1
    return ImageData(name, source, *train, *val, num_classes, flips, mean, std)


def _channel_stats(images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel mean and std of uint8 images (N, 3, S, S), exactly, from value histograms."""
    values = torch.arange(256, dtype=torch.float64)
    means, stds = [], []
    for channel in range(images.shape[1]):
        counts = torch.bincount(images[:, channel].flatten(), minlength=256).double()  # (256,)
        mean = (counts * values).sum() / counts.sum()
        var = (counts * (values - mean) ** 2).sum() / counts.sum()
        means.append(mean)
        stds.append(var.sqrt().clamp_min(1.0))  # a constant channel must not divide by zero
    return torch.stack(means).float(), torch.stack(stds).float()


def _resize(images: torch.Tensor, image_size: int) -> torch.Tensor:
    """Bilinear resize of (N, 3, H, W) images (uint8 or float 0..255) to uint8 (N, 3, S, S)."""
    if images.shape[-1] == image_size and images.dtype == torch.uint8:
        return images
    chunks = []
    for chunk in images.split(RESIZE_CHUNK):
        scaled = F.interpolate(
            chunk.float(),
            size=(image_size, image_size),
            mode="bilinear",
            align_corners=False,
            antialias=image_size < chunk.shape[-1],
        )
        chunks.append(scaled.round().clamp(0, 255).to(torch.uint8))
    return torch.cat(chunks)


def _digits(image_size: int) -> tuple[Split, Split]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = torch.from_numpy(digits.images).float() * (255.0 / 16.0)  # (1797, 8, 8), 0..16 in
    images = _resize(pixels[:, None].expand(-1, 3, -1, -1), image_size)  # (1797, 3, S, S)
    labels = torch.from_numpy(digits.target).long()
    n_train = len(labels) - len(labels) // 5  # the last 20% are held out
    return (images[:n_train], labels[:n_train]), (images[n_train:], labels[n_train:])


def _cifar(folder: Path, image_size: int) -> tuple[Split, Split]:
    missing = [name for name in CIFAR_FILES if not (folder / name).is_file()]
    if missing:
        raise TaskError(f"CIFAR-10 folder {folder} lacks {', '.join(missing)}")
    parts = [_cifar_file(folder / name) for name in CIFAR_TRAIN_FILES]
    train_images = _resize(torch.cat([images for images, _ in parts]), image_size)
    train_labels = torch.cat([labels for _, labels in parts])
    val_images, val_labels = _cifar_file(folder / "test_batch")
    return (train_images, train_labels), (_resize(val_images, image_size), val_labels)


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles what a CIFAR-10 python batch holds (dicts, lists, bytes, numbers and numpy
    arrays) and refuses every other global, so a crafted file cannot run code."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused {module}.{name[:40]}")
        return super().find_class(module, name)


def _cifar_file(path: Path) -> Split:
    """One CIFAR-10 python batch: a pickled dict with b"data" (N, 3072) uint8 and b"labels"."""
    try:
        with path.open("rb") as file:
            batch = _CifarUnpickler(file, encoding="bytes").load()
        pixels = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
        labels = np.asarray(batch[b"labels"], dtype=np.int64).reshape(-1)
    except Exception as error:  # unpickling fails in many ways; each is a bad file
        why = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise TaskError(f"cannot read CIFAR-10 batch {path}: {why}") from None
    _check_labels(path, len(pixels), labels)
    return torch.from_numpy(pixels.copy()), torch.from_numpy(labels)


def _check_labels(path: Path, images: int, labels: np.ndarray) -> None:
    """One label per image, each a CIFAR-10 class (0-9); else the first bad one, in one line."""
    if images != len(labels):
        raise TaskError(f"CIFAR-10 batch {path}: {images} images but {len(labels)} labels")
    bad = np.flatnonzero((labels < 0) | (labels >= CIFAR_CLASSES))
    if bad.size:
        first = int(bad[0])
        more = f" (and {bad.size - 1} more)" if bad.size > 1 else ""
        raise TaskError(
            f"CIFAR-10 batch {path}: label {labels[first]} at position {first} is outside "
            f"0-{CIFAR_CLASSES - 1}{more}"
        )


def _image_folder(root: Path, image_size: int) -> tuple[Split, Split]:
    """Class subfolders of images, under root or root/train; root/val (if there) is the held-out
    split, else the last 10% of each class's sorted files are held out."""
    train_root = root / "train" if (root / "train").is_dir() else root
    classes = _class_names(train_root)
    files = _class_files(train_root, classes)
    if train_root != root and (root / "val").is_dir():
        val_files = _class_files(root / "val", _class_names(root / "val"), classes)
        return _read_split(files, image_size), _read_split(val_files, image_size)
    train_files, val_files = _hold_out(files)
    return _read_split(train_files, image_size), _read_split(val_files, image_size)


def _class_names(folder: Path) -> list[str]:
    if not any(folder.iterdir()):
        raise TaskError(f"data folder {folder} is empty")
    names = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not names:
        raise TaskError(f"data folder {folder} has no class subfolders (nor CIFAR-10 batches)")
    return names


def _class_files(folder: Path, names: list[str], classes: list[str] | None = None) -> Files:
    """(image path, label) of every image under folder/<name>; labels index `classes`."""
    classes = names if classes is None else classes
    files: Files = []
    for name in names:
        if name not in classes:
            raise TaskError(f"class folder {folder / name} is not among the train classes")
        paths = sorted(
            p
            for p in (folder / name).rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith(".")
        )
        if not paths:
            raise TaskError(f"class folder {folder / name} has no images")
        files += [(path, classes.index(name)) for path in paths]
    return files


def _hold_out(files: Files) -> tuple[Files, Files]:
    """Per class, the last 10% of its (sorted) files, at least one of two or more, to val."""
    train: Files = []
    val: Files = []
    for _, group in groupby(files, key=lambda item: item[1]):  # files come grouped by class
        of_class = list(group)
        n_val = max(1, len(of_class) // 10) if len(of_class) > 1 else 0
        train += of_class[: len(of_class) - n_val]
        val += of_class[len(of_class) - n_val :]
    return train, val


def _read_split(files: Files, image_size: int) -> Split:
    labels = torch.tensor([label for _, label in files], dtype=torch.int64)
    if not files:
        return torch.zeros(0, 3, image_size, image_size, dtype=torch.uint8), labels
    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        arrays = list(pool.map(lambda item: _read_image(item[0], image_size), files))
    images = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()  # (N, 3, S, S)
    return images, labels


def _read_image(path: Path, image_size: int) -> np.ndarray:
    """One image as RGB uint8 (S, S, 3), resized bilinearly."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except Exception as error:  # PIL raises OSError, ValueError, SyntaxError, DecompressionBomb
        raise TaskError(f"cannot load image {path}: {error!r}") from None


def normalize(images: torch.Tensor, data: ImageData) -> torch.Tensor:
    """uint8 (B, 3, S, S) -> float (B, 3, S, S) with the train split's channel mean 0, std 1."""
    mean = data.channel_mean.to(images.device)[:, None, None]
    std = data.channel_std.to(images.device)[:, None, None]
    return (images.float() - mean) / std


def augment(images: torch.Tensor, generator: torch.Generator, flips: bool) -> torch.Tensor:
    """Random crop of (B, 3, S, S) images zero-padded by S // 8, and (if `flips`) random mirror.

    The shifts and flips come from `generator` (CPU), so a batch stays a function of its step.
    """
    batch, _, size, _ = images.shape
    pad = size // 8
    shifts = torch.randint(0, 2 * pad + 1, (batch, 2), generator=generator).to(images.device)
    mirror = torch.rand(batch, generator=generator).to(images.device) < 0.5
    padded = F.pad(images, (pad, pad, pad, pad))  # (B, 3, S + 2p, S + 2p)
    offsets = torch.arange(size, device=images.device)
    rows = (shifts[:, 0:1] + offsets)[:, :, None]  # (B, S, 1)
    cols = (shifts[:, 1:2] + offsets)[:, None, :]  # (B, 1, S)
    sample = torch.arange(batch, device=images.device)[:, None, None]
    cropped = padded[sample, :, rows, cols].permute(0, 3, 1, 2)  # (B, S, S, 3) -> (B, 3, S, S)
    if flips:
        cropped = torch.where(mirror[:, None, None, None], cropped.flip(-1), cropped)
    return cropped.contiguous()
