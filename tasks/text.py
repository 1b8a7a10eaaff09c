"""Text data of the gpt task, as bytes (the tokens of a byte-level model, vocabulary 256).

`--data` is a text file, or a folder whose *.txt, *.md and *.py files (recursively, hidden
folders skipped, sorted by relative path) are concatenated. With no data: the Python standard
library's own .py sources (the first 8 MiB), the same bytes on every machine with the same
Python. `python-sources`: the larger corpus of tasks/corpus.py (the standard library and
site-packages, up to 200 MiB). The last 5% of the bytes (at least one window) are held out for
validation.
"""

from __future__ import annotations

import dataclasses
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .base import TaskError
from .common import data_path, special_kind
from .corpus import PYTHON_SOURCES, TEXT_SUFFIXES, python_sources, text_files

STDLIB_CAP_BYTES = 8 * 1024 * 1024
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class TextData:
    name: str  # "text-file", "text-folder", "python3.X-stdlib" or "python-sources"
    source: str  # the data path, or the standard library's folder
    files: int
    train_bytes: torch.Tensor  # (N,) uint8
    val_bytes: torch.Tensor  # (M,) uint8, M >= block_size + 1
    provenance: dict[str, Any] | None = None  # python-sources: what was read

    def describe(self) -> dict[str, Any]:
        described = {
            "dataset": self.name,
            "data": self.source,
            "files": self.files,
            "train_bytes": len(self.train_bytes),
            "val_bytes": len(self.val_bytes),
        }
        return described | ({"source": self.provenance} if self.provenance else {})


_CACHE: dict[tuple[str | None, int], TextData] = {}


def load_text(data: str | Path | None, block_size: int) -> TextData:
    """The corpus at `data` (None: the stdlib sources), split; cached per (path, block size)."""
    if str(data) == PYTHON_SOURCES:
        if (PYTHON_SOURCES, block_size) not in _CACHE:
            _CACHE[PYTHON_SOURCES, block_size] = _python_sources(block_size)
        return _CACHE[PYTHON_SOURCES, block_size]
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
        files = text_files(root, (".py",), skip={"site-packages", "dist-packages"})
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
    files = text_files(path, TEXT_SUFFIXES, skip=set())
    if not files:
        raise TaskError(f"text folder {path} has no {', '.join(TEXT_SUFFIXES)} files")
    return "text-folder", str(path), files, b"".join(_read(file) for file in files)


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as error:
        raise TaskError(f"cannot read text file {file}: {error.strerror}") from None


def _python_sources(block_size: int) -> TextData:
    """The python-sources corpus as bytes, read into one buffer (no copy of the whole)."""
    corpus = python_sources()
    buffer = bytearray(corpus.total_bytes)
    view, offset = memoryview(buffer), 0
    for file, size in zip(corpus.files, corpus.sizes, strict=True):
        try:
            with file.open("rb") as handle:
                read = handle.readinto(view[offset : offset + size])
        except OSError as error:
            raise TaskError(f"cannot read text file {file}: {error.strerror}") from None
        if read != size:
            raise TaskError(f"{file} changed while it was read; try again")
        offset += size
    source = f"{corpus.provenance['stdlib']}; {corpus.provenance['purelib']}"
    data = _split(PYTHON_SOURCES, source, corpus.files, buffer, block_size)
    return dataclasses.replace(data, provenance=corpus.provenance)


def _split(
    name: str, source: str, files: list[Path], corpus: bytes | bytearray, block_size: int
) -> TextData:
    window = block_size + 1  # inputs and their next-byte targets
    if len(corpus) < 2 * window:
        raise TaskError(
            f"text corpus {source} has {len(corpus)} bytes; block size {block_size} needs at "
            f"least {2 * window} (a train and a validation window)"
        )
    n_val = max(int(len(corpus) * VAL_FRACTION), window)
    writable = corpus if isinstance(corpus, bytearray) else bytearray(corpus)
    tokens = torch.frombuffer(writable, dtype=torch.uint8)  # (N,)
    return TextData(name, source, len(files), tokens[:-n_val], tokens[-n_val:])
