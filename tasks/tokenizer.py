"""Tokenizers of `fp4 data prepare`: bytes, a byte-level BPE trained on the source, or a
Hugging Face `tokenizer.json` (read as data by the `tokenizers` library: no code runs).

`--tokenizer bytes`: ids are the UTF-8 bytes (vocabulary 256), documents concatenated as they
are, as the gpt task reads text. `bpe:VOCAB`: a byte-level BPE (GPT-2's pre-tokenizer) trained
with `tokenizers` on the source at that vocabulary, with an end-of-text token. `PATH`: that
tokenizer. With an end-of-text token (`<|endoftext|>`, `</s>`, `<|end_of_text|>` or `<eos>`),
it follows every document; the tokenizer's own special tokens (a BOS) are not added.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .tokens import DataError, token_dtype

BPE_EOT = "<|endoftext|>"
EOT_NAMES = (BPE_EOT, "</s>", "<|end_of_text|>", "<eos>")
BYTE_SYMBOLS = 256
INSTALL_HINT = "the bpe and tokenizer.json tokenizers need the tokenizers package"


@dataclass(frozen=True)
class TokenizerChoice:
    """A parsed `--tokenizer`: kind "bytes", "bpe" (with vocab_size) or "file" (with path)."""

    kind: str
    vocab_size: int | None = None
    path: Path | None = None


def parse_tokenizer(text: str) -> TokenizerChoice:
    """`bytes`, `bpe:VOCAB` or a path to a tokenizer.json; a DataError for anything else."""
    if text == "bytes":
        return TokenizerChoice("bytes")
    if text.startswith("bpe:"):
        return TokenizerChoice("bpe", vocab_size=_bpe_vocab(text[4:]))
    path = Path(text).expanduser()
    if not path.exists():
        raise DataError(
            f"--tokenizer {text!r}: no such file; give bytes, bpe:VOCAB or a tokenizer.json"
        )
    if not path.is_file():
        raise DataError(f"--tokenizer {path} is not a regular file (a tokenizer.json)")
    return TokenizerChoice("file", path=path.resolve())


def _bpe_vocab(text: str) -> int:
    if not text.isdigit():
        raise DataError(f"--tokenizer bpe:{text}: the vocabulary must be a whole number")
    vocab = int(text)
    token_dtype(vocab)  # refuses a vocabulary larger than uint32 ids hold
    if vocab <= BYTE_SYMBOLS + 1:
        raise DataError(
            f"--tokenizer bpe:{vocab}: the vocabulary must exceed {BYTE_SYMBOLS + 1} "
            "(the 256 byte symbols and the end-of-text token)"
        )
    return vocab


class ByteTokenizer:
    """ids are bytes: text files as read, records as UTF-8."""

    kind = "bytes"
    vocab_size = BYTE_SYMBOLS
    eot: int | None = None

    def encode(self, documents: list[str | bytes]) -> list[np.ndarray]:
        return [np.frombuffer(_as_bytes(doc), dtype=np.uint8) for doc in documents]

    def to_json(self) -> str | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "bytes", "vocab_size": BYTE_SYMBOLS}


class HFTokenizer:
    """A `tokenizers.Tokenizer`; encodes batches of documents in parallel (in Rust)."""

    def __init__(self, tokenizer: Any, kind: str, described: dict[str, Any]) -> None:
        self.tokenizer = tokenizer
        self.kind = kind
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        token_dtype(self.vocab_size)
        found = [(name, tokenizer.token_to_id(name)) for name in EOT_NAMES]
        found = [(name, int(index)) for name, index in found if index is not None]
        self.eot_name: str | None = found[0][0] if found else None
        self.eot: int | None = found[0][1] if found else None
        self.described = described

    def encode(self, documents: list[str | bytes]) -> list[np.ndarray]:
        texts = [_as_text(doc) for doc in documents]
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(encoding.ids, dtype=np.int64) for encoding in encodings]

    def to_json(self) -> str | None:
        return str(self.tokenizer.to_str())

    def describe(self) -> dict[str, Any]:
        return {**self.described, "kind": self.kind, "vocab_size": self.vocab_size,
                "eot": self.eot_name}  # fmt: skip


def _as_bytes(document: str | bytes) -> bytes:
    return document if isinstance(document, bytes) else document.encode("utf-8")


def _as_text(document: str | bytes) -> str:
    """Text; a file's bytes that are not UTF-8 are read with U+FFFD in their place."""
    return document if isinstance(document, str) else document.decode("utf-8", "replace")


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError(f"{INSTALL_HINT} (pip install tokenizers)") from None
    return tokenizers


def load_tokenizer_file(path: Path) -> HFTokenizer:
    """A tokenizer.json, or a DataError saying it is not one."""
    tokenizers = _tokenizers()
    try:
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception for a malformed file
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"{path} is not a tokenizer.json: {first_line}") from None
    sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
    return HFTokenizer(tokenizer, "file", {"path": str(path), "sha256": sha256})


def train_bpe(texts: Iterable[str | bytes], vocab_size: int) -> HFTokenizer:
    """A byte-level BPE of `vocab_size` tokens (fewer if the text has fewer merges) learned
    from `texts`, with the end-of-text token."""
    tokenizers = _tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[BPE_EOT], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tokenizer.train_from_iterator((_as_text(text) for text in texts), trainer=trainer)
    return HFTokenizer(tokenizer, "bpe", {"requested_vocab_size": vocab_size})
