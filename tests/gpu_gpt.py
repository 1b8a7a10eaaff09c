"""A tiny GPT on the GPU for the executor tests of tests/gpu/: the model, its loss, fixed
batches, and one forward and backward under bf16 autocast."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fp4cli


def tiny_gpt(recipe: str, backend: str):
    from fp4cli.tasks.gpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 128, 2, 256, 4)).cuda()
    fp4cli.quantize_model(model, recipe, seed=0, backend=backend)
    return model


def gpt_loss(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).float().reshape(-1, 256), targets.reshape(-1))


def gpt_batches(count: int, batch: int = 8, length: int = 128):
    generator = torch.Generator(device="cuda").manual_seed(7)
    return [
        tuple(torch.randint(0, 256, (batch, length), generator=generator, device="cuda")
              for _ in range(2))
        for _ in range(count)
    ]  # fmt: skip


def autocast_gradients(recipe: str, backend: str, executor: str) -> list[torch.Tensor]:
    """[last loss, every parameter's gradient] after two batches under bf16 autocast, with
    every quantized layer checked to run on `executor`."""
    model = tiny_gpt(recipe, backend)
    layers = fp4cli.quantized_layers(model).values()
    assert all(layer.executor()[0] == executor for layer in layers)
    for batch in gpt_batches(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = gpt_loss(model, batch)
        loss.backward()
    return [loss.detach(), *(p.grad for p in model.parameters())]
