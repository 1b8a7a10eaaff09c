"""`fp4 data prepare`: a corpus (tasks/corpus.py) tokenized (tasks/tokenizer.py) into a token
folder (tasks/tokens.py): train.bin, val.bin, meta.json, and the tokenizer.json if any.

The last `val_fraction` of the tokens (at least one) are the validation split. Output is atomic:
tokens go to a hidden `.partial` file in OUT; once whole, the split files are renamed into
place and meta.json is written last (itself through a temporary name). Until then OUT holds no
meta.json, so a preparation killed at any point leaves nothing that loads; a failure removes its
partial files. An existing token folder in OUT is replaced only with `force`.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from .corpus import Corpus, Document, open_corpus
from .tokenizer import ByteTokenizer, HFTokenizer, load_tokenizer_file, parse_tokenizer, train_bpe
from .tokens import DTYPES, META_FILE, SPLIT_FILES, DataError, token_dtype

VAL_FRACTION = 0.05
BATCH_DOCUMENTS = 512  # documents encoded at once
BATCH_BYTES = 4 * 1024 * 1024  # or fewer, once their text reaches this size
COPY_CHUNK = 64 * 1024 * 1024
TOKENIZER_FILE = "tokenizer.json"
PARTIAL = ".partial"

Tokenizer = ByteTokenizer | HFTokenizer


class Progress(Protocol):
    """Where a preparation reports: one phase at a time, counted in source bytes."""

    def phase(self, description: str, total: int) -> None: ...

    def advance(self, amount: int) -> None: ...


class _Silent:
    def phase(self, description: str, total: int) -> None:
        pass

    def advance(self, amount: int) -> None:
        pass


def prepare_tokens(
    source: str | Path, out: Path, tokenizer: str, val_fraction: float = VAL_FRACTION,
    force: bool = False, progress: Progress | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Tokenize `source` into the token folder `out`; returns its metadata."""
    progress = progress or _Silent()
    if not 0 < val_fraction < 1:
        raise DataError(f"--val-fraction must lie between 0 and 1 (got {val_fraction})")
    choice = parse_tokenizer(tokenizer)
    corpus = open_corpus(source)
    encoder: Tokenizer = ByteTokenizer()
    if choice.kind == "file":
        assert choice.path is not None
        encoder = load_tokenizer_file(choice.path)
    created = not out.exists()
    _claim_output(out, force)
    try:
        if choice.kind == "bpe":
            assert choice.vocab_size is not None
            encoder = train_bpe(_texts(corpus, progress, "train BPE"), choice.vocab_size)
        return _write_folder(corpus, encoder, out, val_fraction, progress)
    except BaseException:
        if created and not any(out.iterdir()):
            out.rmdir()  # a folder this run made and left empty goes too
        raise


def _claim_output(out: Path, force: bool) -> None:
    """OUT made (or checked free); with force, its meta.json removed first, so that the old
    folder stops loading before any of its files is replaced."""
    if out.exists() and not out.is_dir():
        raise DataError(f"OUT {out} is a file; give a folder")
    existing = [name for name in (META_FILE, *SPLIT_FILES.values()) if (out / name).exists()]
    if existing and not force:
        raise DataError(f"{out} already holds {', '.join(existing)}; --force replaces them")
    out.mkdir(parents=True, exist_ok=True)
    (out / META_FILE).unlink(missing_ok=True)


def _texts(corpus: Corpus, progress: Progress, description: str) -> Iterator[str | bytes]:
    progress.phase(description, corpus.total_bytes)
    for document, read in corpus.documents():
        progress.advance(read)
        if document:
            yield document


def _batches(corpus: Corpus, progress: Progress) -> Iterator[list[Document]]:
    """Documents in batches of BATCH_DOCUMENTS or BATCH_BYTES, whichever comes first."""
    progress.phase("tokenize", corpus.total_bytes)
    batch: list[Document] = []
    size = 0
    for document, read in corpus.documents():
        batch.append((document, read))
        size += len(document)
        if len(batch) >= BATCH_DOCUMENTS or size >= BATCH_BYTES:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _write_folder(
    corpus: Corpus, encoder: Tokenizer, out: Path, val_fraction: float, progress: Progress
) -> dict[str, Any]:
    dtype = token_dtype(encoder.vocab_size)
    partial = out / f".tokens{PARTIAL}"
    val_partial = out / f".{SPLIT_FILES['val']}{PARTIAL}"
    try:
        total, documents = _write_tokens(corpus, encoder, partial, DTYPES[dtype], progress)
        n_val = max(1, round(total * val_fraction))
        if total - n_val < 1:
            raise DataError(f"{_name(corpus)} gives {total} tokens: too few for two splits")
        _split_tail(partial, val_partial, (total - n_val) * DTYPES[dtype].itemsize)
        os.replace(partial, out / SPLIT_FILES["train"])
        os.replace(val_partial, out / SPLIT_FILES["val"])
        tokenizer = encoder.describe()
        text = encoder.to_json()
        if text is not None:
            _write_atomic(out / TOKENIZER_FILE, text)
            tokenizer["file"] = TOKENIZER_FILE
        meta = _meta(corpus, encoder, tokenizer, dtype, total - n_val, n_val, val_fraction)
        meta["source"]["documents"] = documents
        _write_atomic(out / META_FILE, json.dumps(meta, indent=2) + "\n")
        return meta
    finally:
        partial.unlink(missing_ok=True)
        val_partial.unlink(missing_ok=True)


def _name(corpus: Corpus) -> str:
    return str(corpus.provenance.get("path", corpus.kind))


def _write_tokens(
    corpus: Corpus, encoder: Tokenizer, path: Path, dtype: np.dtype, progress: Progress
) -> tuple[int, int]:
    """Every document's tokens (and the end-of-text token after each, if the tokenizer has one)
    appended to `path`; (tokens, non-empty documents)."""
    total = documents = 0
    with path.open("wb") as handle:
        for batch in _batches(corpus, progress):
            texts = [document for document, _ in batch if document]
            if texts:
                ids = _batch_ids(encoder, texts)  # (n,) int64
                handle.write(ids.astype(dtype).tobytes())
                total += len(ids)
                documents += len(texts)
            progress.advance(sum(read for _, read in batch))
        handle.flush()
        os.fsync(handle.fileno())
    if total == 0:
        raise DataError(f"{_name(corpus)} holds no text")
    return total, documents


def _batch_ids(encoder: Tokenizer, texts: list[str | bytes]) -> np.ndarray:
    """The documents' ids, each followed by the end-of-text token if there is one, checked
    to lie in the vocabulary."""
    parts = encoder.encode(texts)
    if encoder.eot is not None:
        end = np.array([encoder.eot], dtype=np.int64)
        parts = [piece for ids in parts for piece in (ids, end)]
    ids = np.concatenate(parts).astype(np.int64)  # (n,)
    if len(ids) and int(ids.max()) >= encoder.vocab_size:
        raise DataError(
            f"the tokenizer gave id {int(ids.max())}, outside its vocabulary of "
            f"{encoder.vocab_size}"
        )
    return ids


def _split_tail(path: Path, tail_path: Path, cut: int) -> None:
    """The bytes of `path` from offset `cut` moved into `tail_path` (path truncated to cut)."""
    with path.open("rb") as source, tail_path.open("wb") as tail:
        source.seek(cut)
        while chunk := source.read(COPY_CHUNK):
            tail.write(chunk)
        tail.flush()
        os.fsync(tail.fileno())
    os.truncate(path, cut)


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}{PARTIAL}")
    try:
        with partial.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _meta(
    corpus: Corpus, encoder: Tokenizer, tokenizer: dict[str, Any], dtype: str,
    train_tokens: int, val_tokens: int, val_fraction: float,
) -> dict[str, Any]:  # fmt: skip
    from fp4cli import __version__

    return {
        "format": "fp4cli-tokens-1",
        "vocab_size": encoder.vocab_size,
        "dtype": dtype,
        "byte_order": "little",
        "train_tokens": train_tokens,
        "val_tokens": val_tokens,
        "val_fraction": val_fraction,
        "eot_token": encoder.eot,
        "tokenizer": tokenizer,
        "source": dict(corpus.provenance),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "created_with": f"fp4cli {__version__}",
    }
