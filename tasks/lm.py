"""What the language-model tasks (gpt, llama) share: their data, batches, loss and evaluation.

`--data`: nothing (the Python standard library's sources as bytes, tasks/text.py), a text file
or folder (bytes), `python-sources` (the installed Python sources as bytes, tasks/corpus.py), or
a token folder (train.bin, val.bin, meta.json: tasks/tokens.py; `fp4 data prepare` makes one).
The model's vocabulary is the data's (256 for bytes), rounded up to a multiple of 64.

A batch is `batch_size` random windows of block_size + 1 tokens of the train split; val_loss is
the mean cross-entropy over fixed, evenly spaced windows of the validation split. Byte data adds
val_bpb (bits per byte); other tokens add val_ppl (perplexity).
"""

from __future__ import annotations

import dataclasses
import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Batch, TaskDefaults, step_generator
from .common import data_path, evaluation, model_description, pick_size, with_model_fields
from .corpus import PYTHON_SOURCES
from .text import TextData, load_text
from .tokens import is_token_folder, load_tokens, padded_vocab

EVAL_BATCH = 16
MAX_EXP = 700.0  # math.exp overflows past ~709: a larger loss has an infinite perplexity


@dataclass(frozen=True)
class LMSize:
    model: Any  # the model's frozen config: it has vocab_size and block_size
    val_windows: int


class TokenSource(Protocol):
    vocab_size: int
    bytes_per_token: int | None  # 1 for bytes: the loss in bits is bits per byte

    def length(self, split: str) -> int: ...

    def windows(self, split: str, starts: torch.Tensor, length: int) -> torch.Tensor: ...

    def describe(self) -> dict[str, Any]: ...


class ByteText:
    """Text as byte tokens (vocabulary 256), held in memory: the training split on the device
    the batches go to, so a batch is gathered there."""

    def __init__(self, text: TextData, device: torch.device) -> None:
        self.vocab_size = 256
        self.bytes_per_token: int | None = 1
        train = text.train_bytes.to(device)  # (N,) uint8
        self.splits = {"train": train, "val": text.val_bytes}  # val (M,) uint8 stays on the host
        self.text = text

    def length(self, split: str) -> int:
        return len(self.splits[split])

    def windows(self, split: str, starts: torch.Tensor, length: int) -> torch.Tensor:
        """(W, length) int64 windows of the split at `starts` (W,)."""
        tokens = self.splits[split]
        offsets = torch.arange(length, device=tokens.device)  # (L,)
        return tokens[starts.to(tokens.device)[:, None] + offsets].long()

    def describe(self) -> dict[str, Any]:
        return self.text.describe()


class MappedTokens:
    """A token folder (tasks/tokens.py) as a TokenSource."""

    def __init__(self, folder: Path, block_size: int) -> None:
        self.tokens = load_tokens(folder, block_size)
        self.vocab_size = self.tokens.vocab_size
        self.bytes_per_token = self.tokens.meta.bytes_per_token

    def length(self, split: str) -> int:
        return len(self.tokens.train_tokens if split == "train" else self.tokens.val_tokens)

    def windows(self, split: str, starts: torch.Tensor, length: int) -> torch.Tensor:
        return self.tokens.windows(split, starts, length)

    def describe(self) -> dict[str, Any]:
        return self.tokens.describe()


def load_lm_data(data: str | Path | None, block_size: int, device: torch.device) -> TokenSource:
    """The token source `--data` names, with at least one window per split."""
    if data is not None and str(data) == PYTHON_SOURCES:
        return ByteText(load_text(PYTHON_SOURCES, block_size), device)
    path = data_path(data)
    if path is not None and is_token_folder(path):
        return MappedTokens(path, block_size)
    return ByteText(load_text(data, block_size), device)


class LanguageModelTask(ABC):
    """Next-token prediction; a subclass names the task and says how its model is built."""

    name: str
    primary_metric = "val_loss"
    sizes: Mapping[str, LMSize]
    size_defaults: Mapping[str, TaskDefaults]
    model_fields: tuple[str, ...]

    def __init__(
        self, size: str, data: str | Path | None, device: torch.device,
        model: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        self.size = size
        sized = pick_size(self.name, self.sizes, size)
        config = with_model_fields(self.name, sized.model, model, self.model_fields)
        self.check_model(config)
        self.block_size = config.block_size
        self.data = load_lm_data(data, self.block_size, device)
        config = dataclasses.replace(config, vocab_size=padded_vocab(self.data.vocab_size))
        self.config = LMSize(config, sized.val_windows)
        self.defaults = self.size_defaults[size]
        self.device = device
        # an epoch: the training tokens cut into windows of block_size next-token targets
        self.train_examples: int | None = (self.data.length("train") - 1) // self.block_size
        self.val_windows = self._val_windows()  # (W, T + 1) int64

    @abstractmethod
    def make_model(self, config: Any) -> nn.Module:
        """The model of the size's config (the data's vocabulary filled in)."""

    @abstractmethod
    def check_model(self, config: Any) -> None:
        """A TaskError for a shape the model cannot take."""

    def _val_windows(self) -> torch.Tensor:
        """config.val_windows windows of T + 1 tokens, evenly spaced over the validation split."""
        last_start = self.data.length("val") - (self.block_size + 1)
        starts = torch.linspace(0, last_start, self.config.val_windows).round().long()  # (W,)
        return self.data.windows("val", starts, self.block_size + 1).to(self.device)

    def build_model(self) -> nn.Module:
        return self.make_model(self.config.model).to(self.device)

    def batch(self, step: int, batch_size: int, seed: int) -> Batch:
        generator = step_generator(seed, step)
        last_start = self.data.length("train") - (self.block_size + 1)
        starts = torch.randint(0, last_start + 1, (batch_size,), generator=generator)  # (B,)
        windows = self.data.windows("train", starts, self.block_size + 1).to(self.device)
        return Batch({"inputs": windows[:, :-1], "targets": windows[:, 1:]})  # (B, T) each

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return next_token_loss(model, batch["inputs"], batch["targets"])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        loss_sum = 0.0
        with evaluation(model, self.device):
            for windows in self.val_windows.split(EVAL_BATCH):
                loss = next_token_loss(model, windows[:, :-1], windows[:, 1:])
                loss_sum += loss.item() * len(windows)
        val_loss = loss_sum / len(self.val_windows)
        if self.data.bytes_per_token == 1:
            return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2)}  # bits per byte
        perplexity = math.exp(val_loss) if val_loss < MAX_EXP else math.inf
        return {"val_loss": val_loss, "val_ppl": perplexity}

    def describe(self) -> dict[str, Any]:
        config = self.config.model
        return {
            **model_description(self.name, self.size, config, lambda: self.make_model(config)),
            "val_windows": self.config.val_windows,
            **self.data.describe(),
        }


def next_token_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
