"""Text data of the gpt task, as bytes (the tokens of a byte-level model, vocabulary 256).

`--data` is a text file, or a folder whose *.txt, *.md and *.py files (recursively, hidden
folders skipped, sorted by relative path) are concatenated. With no data: the Python standard
library's own .py sources, the same bytes on every machine with the same Python. The last 5% of
the bytes (at least one window) are held out for validation.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base import TaskError
from .common import data_path, special_kind

TEXT_SUFFIXES = (".txt", ".md", ".py")
STDLIB_CAP_BYTES = 8 * 1024 * 1024
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class TextData:
    name: str  # "text-file", "text-folder" or "python3.X-stdlib"
    source: str  # the data path, or the standard library's folder
    files: int
    train_bytes: torch.Tensor  # (N,) uint8
    val_bytes: torch.Tensor  # (M,) uint8, M >= block_size + 1

    def describe(self) -> dict[str, Any]:
        return {
            "dataset": self.name,
            "data": self.source,
            "files": self.files,
            "train_bytes": len(self.train_bytes),
            "val_bytes": len(self.val_bytes),
        }


_CACHE: dict[tuple[str | None, int], TextData] = {}


def load_text(data: str | Path | None, block_size: int) -> TextData:
    """The corpus at `data` (None: the stdlib sources), split; cached per (path, block size)."""
    path = data_path(data)
    key = (None if path is None else str(path), block_size)
    if key not in _CACHE:
        _CACHE[key] = _split(*_read_corpus(path), block_size)
    return _CACHE[key]


def _read_corpus(path: Path | None) -> tuple[str, str, list[Path], bytes]:
    """(name, source, files, their bytes concatenated)."""
    if path is None:
        root = Path(sysconfig.get_paths()["stdlib"])
        name = f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
        files = _text_files(root, (".py",), skip={"site-packages", "dist-packages"})
        chunks, total = [], 0
        for file in files:  # whole files in path order until the cap
            if total >= STDLIB_CAP_BYTES:
                break
            chunks.append(_read(file))
            total += len(chunks[-1])
        corpus = b"".join(chunks)[:STDLIB_CAP_BYTES]
        return name, str(root), files[: len(chunks)], corpus
    if path.is_file():
        return "text-file", str(path), [path], _read(path)
    if not path.is_dir():
        raise TaskError(f"text data {path} is not a file or folder of text: {special_kind(path)}")
    files = _text_files(path, TEXT_SUFFIXES, skip=set())
    if not files:
        raise TaskError(f"text folder {path} has no {', '.join(TEXT_SUFFIXES)} files")
    return "text-folder", str(path), files, b"".join(_read(file) for file in files)


def _text_files(root: Path, suffixes: tuple[str, ...], skip: set[str]) -> list[Path]:
    """Files under root with one of `suffixes`, sorted by relative path; no hidden or `skip`
    folders (a .git or .venv inside a corpus folder is no corpus)."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".") and d not in skip]
        found += [Path(folder, name) for name in names if name.endswith(suffixes)]
    return sorted(found, key=lambda file: file.relative_to(root).as_posix())


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as error:
        raise TaskError(f"cannot read text file {file}: {error.strerror}") from None


def _split(name: str, source: str, files: list[Path], corpus: bytes, block_size: int) -> TextData:
    window = block_size + 1  # inputs and their next-byte targets
    if len(corpus) < 2 * window:
        raise TaskError(
            f"text corpus {source} has {len(corpus)} bytes; block size {block_size} needs at "
            f"least {2 * window} (a train and a validation window)"
        )
    n_val = max(int(len(corpus) * VAL_FRACTION), window)
    tokens = torch.frombuffer(bytearray(corpus), dtype=torch.uint8)  # (N,)
    return TextData(name, source, len(files), tokens[:-n_val], tokens[-n_val:])
