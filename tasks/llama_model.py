"""A Llama-style decoder: token embedding, pre-norm blocks of causal self-attention with rotary
position embeddings and a SwiGLU MLP, RMSNorm, no biases, an untied output head.

Module names follow Hugging Face's LlamaForCausalLM, so quantize_model's skip patterns read as
they do on a Llama checkpoint: the attention projections `q_proj`, `k_proj`, `v_proj`, `o_proj`
and the MLP's `gate_proj`, `up_proj`, `down_proj` are quantized; `lm_head` and `embed_tokens`
(matched by `*embed*`) stay in high precision by default.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

INIT_STD = 0.02  # Hugging Face Llama's initializer_range


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    block_size: int  # the longest sequence (rotary embeddings have no table: only a check)
    n_layer: int
    n_embd: int
    n_head: int
    n_mlp: int  # the SwiGLU MLP's hidden width
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def check_shape(config: LlamaConfig) -> str | None:
    """Why the shape cannot be built, or None: heads split the width into even head sizes
    (rotary embeddings turn pairs of channels)."""
    if config.n_embd % config.n_head:
        return f"model.n_embd {config.n_embd} is not a multiple of model.n_head {config.n_head}"
    if config.head_dim % 2:
        return (
            f"model.n_embd / model.n_head = {config.head_dim} is odd; rotary embeddings need pairs"
        )
    return None


def rotary_angles(
    time: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (T, D/2) float32 of position t times frequency theta^(-2i/D)."""
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim
    inv_freq = theta**-exponents  # (D/2,)
    positions = torch.arange(time, device=device, dtype=torch.float32)  # (T,)
    angles = torch.outer(positions, inv_freq)  # (T, D/2)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, H, T, D) with channel i turned against channel i + D/2 by the angle of its position
    (the half-split pairing of Hugging Face's Llama); computed in float32."""
    first, second = x.float().chunk(2, dim=-1)  # (B, H, T, D/2) each
    turned = torch.cat((first * cos - second * sin, second * cos + first * sin), dim=-1)
    return turned.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        width = config.n_embd
        self.q_proj = nn.Linear(width, width, bias=False)
        self.k_proj = nn.Linear(width, width, bias=False)
        self.v_proj = nn.Linear(width, width, bias=False)
        self.o_proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, time, channels = x.shape  # (B, T, C)
        head_shape = (batch, time, self.n_head, channels // self.n_head)
        q, k, v = (proj(x).view(head_shape).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))  # fmt: skip
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)  # (B, H, T, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, D)
        return self.o_proj(y.transpose(1, 2).reshape(batch, time, channels))  # (B, T, C)


class SwiGLU(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.n_mlp, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.n_mlp, bias=False)
        self.down_proj = nn.Linear(config.n_mlp, config.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, C)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # hidden (B, T, F)


class LlamaBlock(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.mlp = SwiGLU(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)  # (B, T, C)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        problem = check_shape(config)
        if problem is not None:
            raise ValueError(problem)
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.layers = nn.ModuleList(LlamaBlock(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.n_embd, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)  # untied
        self.apply(_init_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) int64 -> (B, T, V)
        time = tokens.shape[1]
        if time > self.config.block_size:
            raise ValueError(f"sequence of {time} tokens > block size {self.config.block_size}")
        cos, sin = rotary_angles(
            time, self.config.head_dim, self.config.rope_theta, tokens.device
        )  # (T, D/2) each
        x = self.embed_tokens(tokens)  # (B, T, C)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))  # (B, T, V)


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
