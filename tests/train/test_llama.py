"""The llama task: its named shapes and their parameter counts (on the meta device), rotary
embeddings, FP4 conversion of exactly the attention and MLP projections, model fields."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.tasks import llama
from fp4cli.tasks.base import TaskError, create_task
from fp4cli.tasks.common import count_params
from fp4cli.tasks.llama_model import Llama, LlamaConfig, apply_rotary, rotary_angles

GALORE_VOCAB = 32000
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def llama_params(vocab: int, n_layer: int, width: int, mlp: int) -> int:
    """By hand: embedding and untied head, per layer four C x C attention projections, three
    C x F MLP projections and two RMSNorm weights, then the final norm."""
    return 2 * vocab * width + n_layer * (4 * width**2 + 3 * width * mlp + 2 * width) + width


@pytest.mark.parametrize(
    ("size", "shape", "millions"),
    [
        ("60m", (8, 512, 8, 1376), 58.1),
        ("130m", (12, 768, 12, 2048), 134.1),
        ("350m", (24, 1024, 16, 2752), 369.1),
        ("1b", (24, 2048, 32, 5472), 1340.7),
    ],
)
def test_named_sizes_have_galores_shapes_and_counts(size, shape, millions):
    config = llama.SIZES[size].model
    assert (config.n_layer, config.n_embd, config.n_head, config.n_mlp) == shape
    assert config.head_dim == 64 and config.block_size == 256
    with_galore_vocab = dataclasses.replace(config, vocab_size=GALORE_VOCAB)
    params = count_params(lambda: Llama(with_galore_vocab))
    assert params == llama_params(GALORE_VOCAB, shape[0], shape[1], shape[3])
    assert round(params / 1e6, 1) == millions
    assert count_params(lambda: Llama(config)) == llama_params(256, shape[0], shape[1], shape[3])


@pytest.mark.parametrize("size", ["60m", "130m", "350m", "1b"])
def test_every_gemm_of_a_named_size_splits_into_32_value_blocks(size):
    with torch.device("meta"):
        model = Llama(llama.SIZES[size].model)
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 7 * llama.SIZES[size].model.n_layer + 1
    assert all(m.in_features % 32 == 0 and m.out_features % 32 == 0 for m in linears)
    assert all(m.bias is None for m in linears)
    assert model.lm_head.weight is not model.embed_tokens.weight  # untied


def test_rotary_scores_depend_only_on_the_offset():
    """q R(m) . k R(n) is a function of m - n: a pair shifted together scores the same."""
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    cos, sin = rotary_angles(12, 8, 10000.0, torch.device("cpu"))  # (T, D/2)

    def score(m: int, n: int) -> float:
        q_m = apply_rotary(q, cos[m : m + 1], sin[m : m + 1])
        k_n = apply_rotary(k, cos[n : n + 1], sin[n : n + 1])
        return float((q_m * k_n).sum())

    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 3), abs=1e-3)
    assert apply_rotary(q, cos[:1], sin[:1]).equal(q)  # position 0 turns nothing


def test_the_model_is_causal():
    torch.manual_seed(0)
    model = Llama(llama.SIZES["debug"].model)
    tokens = torch.randint(0, 256, (1, 16))
    changed = tokens.clone()
    changed[0, 10] = (tokens[0, 10] + 1) % 256
    logits, logits_changed = model(tokens), model(changed)  # (1, T, V) each
    assert torch.equal(logits[0, :10], logits_changed[0, :10])
    assert not torch.equal(logits[0, 10:], logits_changed[0, 10:])


def test_fp4_quantizes_attention_and_mlp_only_and_trains_on_cpu():
    task = create_task("llama", "debug")
    torch.manual_seed(0)
    model = task.build_model()
    fp4cli.quantize_model(model, "mxfp4", seed=0, backend="torch")
    quantized = fp4cli.quantized_layers(model)
    attention = {f"layers.{i}.self_attn.{name}" for i in range(2) for name in PROJECTIONS[:4]}
    mlp = {f"layers.{i}.mlp.{name}" for i in range(2) for name in PROJECTIONS[4:]}
    assert set(quantized) == attention | mlp
    assert type(model.lm_head) is nn.Linear and type(model.embed_tokens) is nn.Embedding
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = task.batch(0, 8, seed=0)
    losses = []
    for _ in range(6):
        loss = task.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
        losses.append(loss.item())
    assert math.isfinite(losses[0]) and losses[-1] < losses[0]


def test_model_fields_and_impossible_shapes():
    task = create_task("llama", "debug", model={"n_layer": 3, "n_mlp": 96, "rope_theta": 500.0})
    model = task.build_model()
    assert len(model.layers) == 3 and model.layers[0].mlp.up_proj.weight.shape == (96, 32)
    assert task.describe()["model"]["rope_theta"] == 500.0
    cases = [
        ({"n_embd": 30, "n_head": 4}, "model.n_embd 30 is not a multiple of model.n_head 4"),
        ({"n_embd": 30, "n_head": 2}, "model.n_embd / model.n_head = 15 is odd"),
        ({"n_layers": 3}, "no model field 'n_layers' (did you mean 'n_layer'?)"),
        ({"vocab_size": 512}, "no model field 'vocab_size'"),
    ]
    for fields, message in cases:
        with pytest.raises(TaskError, match=re.escape(message)):
            create_task("llama", "debug", model=fields)


def test_sizes_and_defaults_match():
    assert set(llama.SIZES) == set(llama.DEFAULTS) >= {"debug", "default", "60m", "1b"}
    assert llama.SIZES["default"] == llama.SIZES["60m"]
    assert isinstance(llama.SIZES["debug"].model, LlamaConfig)
