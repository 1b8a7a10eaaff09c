"""gpt: next-token prediction with a small GPT decoder (tasks/gpt_model.py).

Data, batches, loss and evaluation: tasks/lm.py (bytes of the Python standard library's sources
by default, a text file or folder, `python-sources`, or a token folder).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .base import TaskDefaults, register_task
from .common import check_multiple
from .gpt_model import GPT, GPTConfig
from .lm import LanguageModelTask, LMSize

VOCAB_SIZE = 256  # bytes; a token folder's vocabulary replaces it
GPTSize = LMSize

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


class GPTTask(LanguageModelTask):
    name = "gpt"
    sizes = SIZES
    size_defaults = DEFAULTS
    model_fields = MODEL_FIELDS

    def make_model(self, config: GPTConfig) -> nn.Module:
        return GPT(config)

    def check_model(self, config: GPTConfig) -> None:
        """Heads split the width."""
        check_multiple("gpt", "n_embd", config.n_embd, "n_head", config.n_head)


@register_task("gpt")
def create_gpt(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> GPTTask:
    return GPTTask(size, data, device or torch.device("cpu"), model)
