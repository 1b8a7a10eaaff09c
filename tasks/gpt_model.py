"""A GPT decoder, nanoGPT-style: token + learned position embeddings, pre-norm blocks of causal
self-attention and a GELU MLP, a final LayerNorm and an lm_head tied to the token embedding.

Linear layers are named for quantize_model's skip patterns: `qkv`, `proj`, `fc1`, `fc2` are
quantized; `lm_head` (and the `*embed*` tables) stay in high precision by default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    block_size: int
    n_layer: int
    n_embd: int
    n_head: int
    n_mlp: int = 0  # the MLP's hidden width; 0: 4 * n_embd (GPT-2's)

    @property
    def mlp_width(self) -> int:
        return self.n_mlp or 4 * self.n_embd


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape  # (B, T, C)
        q, k, v = self.qkv(x).split(channels, dim=2)  # each (B, T, C)
        head_shape = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (t.view(head_shape).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.proj(y.transpose(1, 2).reshape(batch, time, channels))  # (B, T, C)


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.n_embd, config.mlp_width)
        self.fc2 = nn.Linear(config.mlp_width, config.n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        if config.n_embd % config.n_head:
            raise ValueError(f"n_embd {config.n_embd} is no multiple of n_head {config.n_head}")
        self.config = config
        self.tok_embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos_embed = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.tok_embed.weight  # tied: one (V, C) matrix
        self.apply(_init_weights)
        # GPT-2: scale the residual projections so the residual stream's variance stays put
        for name, parameter in self.named_parameters():
            if name.endswith(("proj.weight", "fc2.weight")):
                nn.init.normal_(parameter, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, V)
        time = tokens.shape[1]
        if time > self.config.block_size:
            raise ValueError(f"sequence of {time} tokens > block size {self.config.block_size}")
        positions = torch.arange(time, device=tokens.device)  # (T,)
        x = self.tok_embed(tokens) + self.pos_embed(positions)  # (B, T, C)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))  # (B, T, V)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
