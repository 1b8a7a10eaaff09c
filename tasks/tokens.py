"""Token folders: nanoGPT's layout of `train.bin` and `val.bin` (raw little-endian uint16 or
uint32 token ids, memory-mapped, never read whole) plus a `meta.json`.

meta.json must give `vocab_size` and `dtype`; `fp4 data prepare` also writes the token counts
(checked against the file sizes), the tokenizer and the source's provenance. A nanoGPT folder
needs only `{"vocab_size": 50257, "dtype": "uint16"}` beside its .bin files.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .base import TaskError

META_FILE = "meta.json"
SPLIT_FILES = {"train": "train.bin", "val": "val.bin"}
DTYPES: dict[str, np.dtype] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
META_MAX_BYTES = 1024 * 1024  # a metadata file, not a data file
SCAN_CHUNK = 1 << 24  # tokens checked at once when a split is scanned


class DataError(TaskError):
    """A token folder, a corpus or a tokenizer that cannot be used; the message is one line."""


def token_dtype(vocab_size: int) -> str:
    """The narrowest dtype that holds ids 0..vocab_size - 1."""
    if vocab_size <= 1 << 16:
        return "uint16"
    if vocab_size <= 1 << 32:
        return "uint32"
    raise DataError(f"a vocabulary of {vocab_size:,} tokens is larger than uint32 ids can hold")


def is_token_folder(path: Path) -> bool:
    """A folder that holds a meta.json or a split file: it is read as tokens, not as text."""
    names = (META_FILE, *SPLIT_FILES.values())
    return path.is_dir() and any((path / name).exists() for name in names)


@dataclass(frozen=True)
class TokenMeta:
    vocab_size: int
    dtype: str
    fields: dict[str, Any]  # the whole file

    @property
    def bytes_per_token(self) -> int | None:
        """1 for byte tokens (their loss in bits is bits per byte), else None."""
        return 1 if self.fields.get("tokenizer", {}).get("kind") == "bytes" else None


def read_meta(folder: Path) -> TokenMeta:
    """meta.json of a token folder, checked: a JSON object with a vocabulary its dtype holds."""
    path = folder / META_FILE
    if not path.is_file():
        what = "no" if not path.exists() else "no regular"
        raise DataError(
            f"token folder {folder} has {what} {META_FILE}; write one beside train.bin, e.g. "
            '{"vocab_size": 50257, "dtype": "uint16"}'
        )
    if path.stat().st_size > META_MAX_BYTES:
        raise DataError(f"{path} is over {META_MAX_BYTES // 1024} KiB: not a metadata file")
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DataError(f"{path} is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise DataError(f"{path} must hold a JSON object (got {type(fields).__name__})")
    return _checked_meta(path, fields)


def _checked_meta(path: Path, fields: dict[str, Any]) -> TokenMeta:
    dtype, vocab = fields.get("dtype"), fields.get("vocab_size")
    if dtype not in DTYPES:
        raise DataError(f"{path}: dtype must be one of {', '.join(DTYPES)} (got {dtype!r})")
    if not isinstance(vocab, int) or not _positive_int(vocab):
        raise DataError(f"{path}: vocab_size must be a positive integer (got {vocab!r})")
    most = 1 << (8 * DTYPES[dtype].itemsize)
    if vocab > most:
        raise DataError(
            f"{path}: vocab_size {vocab:,} is larger than {dtype} ids can hold ({most:,})"
        )
    for split in SPLIT_FILES:
        count = fields.get(f"{split}_tokens")
        if count is not None and not (_positive_int(count) or count == 0):
            raise DataError(f"{path}: {split}_tokens must be a count (got {count!r})")
    return TokenMeta(vocab, str(dtype), fields)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def open_split(folder: Path, meta: TokenMeta, split: str) -> np.ndarray:
    """The split's tokens as a read-only memory map (N,), checked against the metadata."""
    path = folder / SPLIT_FILES[split]
    if not path.exists():
        raise DataError(f"token folder {folder} has no {path.name}")
    if not path.is_file():
        raise DataError(f"{path} is not a regular file")
    dtype = DTYPES[meta.dtype]
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise DataError(
            f"{path} has {size:,} bytes, not a whole number of {meta.dtype} tokens "
            "(a truncated or foreign file)"
        )
    count = size // dtype.itemsize
    expected = meta.fields.get(f"{split}_tokens")
    if expected is not None and expected != count:
        raise DataError(
            f"{folder / META_FILE} says {expected:,} {split} tokens but {path.name} holds "
            f"{count:,}; the folder is not one preparation's output"
        )
    if count == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r", shape=(count,))


def check_ids(tokens: np.ndarray, vocab_size: int, where: str) -> None:
    """A DataError if any id of `tokens` is outside the vocabulary (read in chunks)."""
    for start in range(0, len(tokens), SCAN_CHUNK):
        largest = int(tokens[start : start + SCAN_CHUNK].max())
        if largest >= vocab_size:
            raise DataError(
                f"{where} holds token id {largest:,}, outside the vocabulary of {vocab_size:,} "
                "that meta.json states"
            )


@dataclass(frozen=True)
class TokenData:
    """A token folder opened for training: memory-mapped splits, windows gathered on demand."""

    folder: Path
    meta: TokenMeta
    train_tokens: np.ndarray  # (N,) memory map
    val_tokens: np.ndarray  # (M,) memory map, M >= block_size + 1

    @property
    def vocab_size(self) -> int:
        return self.meta.vocab_size

    def windows(self, split: str, starts: torch.Tensor, length: int) -> torch.Tensor:
        """(W, length) int64 CPU windows of the split at `starts` (W,); a DataError for an id
        outside the vocabulary (the train split is checked window by window, never whole)."""
        tokens = self.train_tokens if split == "train" else self.val_tokens
        offsets = np.arange(length)  # (L,)
        gathered = tokens[starts.numpy()[:, None] + offsets]  # (W, L) uint16 or uint32
        if gathered.size and int(gathered.max()) >= self.vocab_size:
            check_ids(gathered.reshape(-1), self.vocab_size, str(self.folder / SPLIT_FILES[split]))
        return torch.from_numpy(gathered.astype(np.int64))

    def describe(self) -> dict[str, Any]:
        fields = self.meta.fields
        return {
            "dataset": "tokens",
            "data": str(self.folder),
            "tokenizer": fields.get("tokenizer", {}).get("kind", "unknown"),
            "vocab_size": self.vocab_size,
            "dtype": self.meta.dtype,
            "train_tokens": len(self.train_tokens),
            "val_tokens": len(self.val_tokens),
            **({"source": fields["source"]} if isinstance(fields.get("source"), dict) else {}),
        }


def load_tokens(folder: Path, block_size: int) -> TokenData:
    """A token folder with enough tokens for a window of block_size + 1 in each split."""
    meta = read_meta(folder)
    train, val = (open_split(folder, meta, split) for split in SPLIT_FILES)
    window = block_size + 1
    for split, tokens in (("train", train), ("val", val)):
        if len(tokens) < window:
            raise DataError(
                f"{folder / SPLIT_FILES[split]} holds {len(tokens):,} tokens; block size "
                f"{block_size} needs at least {window} (one window)"
            )
    check_ids(val, meta.vocab_size, str(folder / SPLIT_FILES["val"]))
    return TokenData(folder, meta, train, val)


def padded_vocab(vocab_size: int, multiple: int = 64) -> int:
    """The model's vocabulary: the data's, rounded up so the head's GEMM has an even shape
    (GPT-2's 50,257 becomes 50,304, as in nanoGPT); ids above the data's are never targets."""
    return math.ceil(vocab_size / multiple) * multiple
