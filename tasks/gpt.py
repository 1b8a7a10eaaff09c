"""gpt: byte-level next-token prediction with a small GPT decoder (tasks/gpt_model.py).

Data: see tasks/text.py (a text file or folder; by default the Python standard library's
sources). A batch is `batch_size` random windows of block_size + 1 bytes of the train split;
val_loss is the mean cross-entropy over fixed, evenly spaced windows of the validation split.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Batch, TaskDefaults, register_task, step_generator
from .common import check_multiple, evaluation, model_description, pick_size, with_model_fields
from .gpt_model import GPT, GPTConfig
from .text import load_text

VOCAB_SIZE = 256  # bytes
EVAL_BATCH = 16


@dataclass(frozen=True)
class GPTSize:
    model: GPTConfig
    val_windows: int


SIZES = {
    "debug": GPTSize(GPTConfig(VOCAB_SIZE, block_size=32, n_layer=2, n_embd=32, n_head=2), 8),
    "default": GPTSize(GPTConfig(VOCAB_SIZE, block_size=256, n_layer=6, n_embd=384, n_head=6), 64),
    # GPT-2 small's shape (12 layers, 768 wide, 12 heads, 1,024 positions) over bytes
    "gpt2-small": GPTSize(
        GPTConfig(VOCAB_SIZE, block_size=1024, n_layer=12, n_embd=768, n_head=12), 64
    ),
    # Tseng et al.'s smallest GPT (345M with GPT-2's vocabulary; GPT-2 medium's shape): 24 layers,
    # 1,024 wide, 16 heads, 1,024 positions, over bytes (about 303M parameters)
    "gpt-345m": GPTSize(
        GPTConfig(VOCAB_SIZE, block_size=1024, n_layer=24, n_embd=1024, n_head=16), 64
    ),
    # Llama-shaped widths for speed measurements (`fp4 bench step --size`): a few layers at the
    # width and MLP width of Llama 1B (2,048 and 5,632, TinyLlama-1.1B's) and Llama 7B (4,096
    # and 11,008), 1,024 positions; GELU MLPs with biases, not SwiGLU
    "wide-2048": GPTSize(
        GPTConfig(VOCAB_SIZE, block_size=1024, n_layer=6, n_embd=2048, n_head=16, n_mlp=5632),
        64,
    ),
    "wide-4096": GPTSize(
        GPTConfig(VOCAB_SIZE, block_size=1024, n_layer=4, n_embd=4096, n_head=32, n_mlp=11008),
        64,
    ),
}
# --set model.FIELD=VALUE
MODEL_FIELDS = ("block_size", "n_layer", "n_embd", "n_head", "n_mlp")
DEFAULTS = {
    "debug": TaskDefaults(steps=20, batch_size=8, lr=1e-3),
    "default": TaskDefaults(
        steps=2000, batch_size=64, lr=1e-3, weight_decay=0.1, warmup_steps=100, eval_every=250
    ),
    "gpt2-small": TaskDefaults(
        steps=2000, batch_size=8, lr=6e-4, weight_decay=0.1, warmup_steps=100, eval_every=250
    ),
    "gpt-345m": TaskDefaults(
        steps=2000, batch_size=8, lr=3e-4, weight_decay=0.1, warmup_steps=100, eval_every=250
    ),
    "wide-2048": TaskDefaults(
        steps=2000, batch_size=8, lr=3e-4, weight_decay=0.1, warmup_steps=100, eval_every=250
    ),
    "wide-4096": TaskDefaults(
        steps=2000, batch_size=8, lr=1.5e-4, weight_decay=0.1, warmup_steps=100, eval_every=250
    ),
}


class GPTTask:
    name = "gpt"
    primary_metric = "val_loss"

    def __init__(
        self,
        size: str,
        data: str | Path | None,
        device: torch.device,
        model: dict[str, Any] | None = None,
    ) -> None:
        self.size = size
        self.config = _sized(pick_size(self.name, SIZES, size), model)
        self.defaults = DEFAULTS[size]
        self.device = device
        self.block_size = self.config.model.block_size
        self.data = load_text(data, self.block_size)
        self.train_bytes = self.data.train_bytes.to(device)  # (N,) uint8
        # an epoch: the training bytes cut into windows of block_size next-byte targets
        self.train_examples: int | None = (len(self.train_bytes) - 1) // self.block_size
        self.val_windows = self._val_windows()  # (W, T + 1) int64

    def _val_windows(self) -> torch.Tensor:
        """config.val_windows windows of T + 1 bytes, evenly spaced over the validation split."""
        last_start = len(self.data.val_bytes) - (self.block_size + 1)
        starts = torch.linspace(0, last_start, self.config.val_windows).round().long()  # (W,)
        return _windows(self.data.val_bytes, starts, self.block_size).to(self.device)

    def build_model(self) -> nn.Module:
        return GPT(self.config.model).to(self.device)

    def batch(self, step: int, batch_size: int, seed: int) -> Batch:
        generator = step_generator(seed, step)
        last_start = len(self.train_bytes) - (self.block_size + 1)
        starts = torch.randint(0, last_start + 1, (batch_size,), generator=generator)  # (B,)
        windows = _windows(self.train_bytes, starts.to(self.device), self.block_size)
        return Batch({"inputs": windows[:, :-1], "targets": windows[:, 1:]})  # (B, T) each

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return _next_byte_loss(model, batch["inputs"], batch["targets"])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        loss_sum = 0.0
        with evaluation(model, self.device):
            for windows in self.val_windows.split(EVAL_BATCH):
                loss = _next_byte_loss(model, windows[:, :-1], windows[:, 1:])
                loss_sum += loss.item() * len(windows)
        val_loss = loss_sum / len(self.val_windows)
        return {"val_loss": val_loss, "val_bpb": val_loss / math.log(2)}  # bits per byte

    def describe(self) -> dict[str, Any]:
        return {
            **model_description(
                self.name, self.size, self.config.model, lambda: GPT(self.config.model)
            ),
            "val_windows": self.config.val_windows,
            **self.data.describe(),
        }


def _sized(size: GPTSize, model: dict[str, Any] | None) -> GPTSize:
    """The size with its architecture fields overridden, checked: heads split the width."""
    config = with_model_fields("gpt", size.model, model, MODEL_FIELDS)
    check_multiple("gpt", "n_embd", config.n_embd, "n_head", config.n_head)
    return GPTSize(config, size.val_windows)


def _windows(tokens: torch.Tensor, starts: torch.Tensor, block_size: int) -> torch.Tensor:
    """(W, T + 1) int64 windows of the uint8 byte tensor `tokens` at `starts` (W,)."""
    offsets = torch.arange(block_size + 1, device=starts.device)  # (T + 1,)
    return tokens[starts[:, None] + offsets].long()


def _next_byte_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model(inputs)  # (B, T, V)
    return F.cross_entropy(logits.float().reshape(-1, VOCAB_SIZE), targets.reshape(-1))


@register_task("gpt")
def create_gpt(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> GPTTask:
    return GPTTask(size, data, device or torch.device("cpu"), model)
