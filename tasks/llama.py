"""llama: next-token prediction with a Llama-style decoder (tasks/llama_model.py): RMSNorm,
SwiGLU, rotary position embeddings, no biases, an untied head.

Data, batches, loss and evaluation are the gpt task's (tasks/lm.py). The named sizes are the
LLaMA shapes of the low-precision and memory-efficient training literature: GaLore's
(Zhao et al. 2024, github.com/jiaweizzhao/GaLore configs/llama_*.json, the shapes ReLoRA used
before it), with their 256-token training sequences. The papers' counts (60M, 130M, 350M, 1B)
assume their 32,000-token vocabulary; over bytes (vocabulary 256) the embedding and the head
are 125 times smaller (the 60M shape has 25.6M parameters). Every GEMM dimension of the named
sizes is a multiple of 32 (an MXFP4 block).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from .base import TaskDefaults, TaskError, register_task
from .llama_model import Llama, LlamaConfig, check_shape
from .lm import LanguageModelTask, LMSize

VOCAB_SIZE = 256  # bytes; a token folder's vocabulary replaces it
BLOCK_SIZE = 256  # GaLore's and ReLoRA's sequence length


def _shape(n_layer: int, n_embd: int, n_head: int, n_mlp: int) -> LMSize:
    return LMSize(LlamaConfig(VOCAB_SIZE, BLOCK_SIZE, n_layer, n_embd, n_head, n_mlp), 64)


SIZES = {
    "debug": LMSize(LlamaConfig(VOCAB_SIZE, 32, n_layer=2, n_embd=32, n_head=2, n_mlp=64), 8),
    # GaLore llama_60m: 8 layers, 512 wide, 8 heads, MLP 1,376 (58.1M with 32,000 tokens)
    "60m": _shape(8, 512, 8, 1376),
    # GaLore llama_130m: 12 layers, 768 wide, 12 heads, MLP 2,048 (134.1M with 32,000 tokens)
    "130m": _shape(12, 768, 12, 2048),
    # GaLore llama_350m: 24 layers, 1,024 wide, 16 heads, MLP 2,736 there, rounded up here to
    # 2,752 (86 x 32) so the MLP GEMMs split into 32-value blocks (368.9M with 32,000 tokens)
    "350m": _shape(24, 1024, 16, 2752),
    # GaLore llama_1b: 24 layers, 2,048 wide, 32 heads, MLP 5,461 there (2/3 of 4 x 2,048),
    # rounded up here to 5,472 (171 x 32) (1.34B with 32,000 tokens)
    "1b": _shape(24, 2048, 32, 5472),
}
SIZES["default"] = SIZES["60m"]  # the smallest named shape
# --set model.FIELD=VALUE
MODEL_FIELDS = ("block_size", "n_layer", "n_embd", "n_head", "n_mlp", "rope_theta")


def _defaults(batch_size: int, lr: float) -> TaskDefaults:
    """2,000 steps with GaLore's 10% warm-up, weight decay 0.1 as the gpt task, batches sized
    for one GPU (the papers train 10K to 100K steps of 512 sequences)."""
    return TaskDefaults(
        steps=2000, batch_size=batch_size, lr=lr, weight_decay=0.1, warmup_steps=200,
        eval_every=250,
    )  # fmt: skip


DEFAULTS = {
    "debug": TaskDefaults(steps=20, batch_size=8, lr=1e-3),
    "default": _defaults(64, 1e-3),
    "60m": _defaults(64, 1e-3),
    "130m": _defaults(32, 1e-3),
    "350m": _defaults(16, 5e-4),
    "1b": _defaults(8, 3e-4),
}


class LlamaTask(LanguageModelTask):
    name = "llama"
    sizes = SIZES
    size_defaults = DEFAULTS
    model_fields = MODEL_FIELDS

    def make_model(self, config: LlamaConfig) -> nn.Module:
        return Llama(config)

    def check_model(self, config: LlamaConfig) -> None:
        problem = check_shape(config)
        if problem is not None:
            raise TaskError(f"task 'llama': {problem}")


@register_task("llama")
def create_llama(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> LlamaTask:
    return LlamaTask(size, data, device or torch.device("cpu"), model)
