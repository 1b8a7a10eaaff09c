"""Every shipped recipe converts a small MLP that then trains with a finite, falling loss."""

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.recipes import list_recipes


def _teacher_batches(steps, batch=64, width=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(width, width, generator=generator) / width**0.5
    for _ in range(steps):
        x = torch.randn(batch, width, generator=generator)
        yield x, torch.tanh(x @ teacher)


@pytest.mark.parametrize("name", list_recipes())
def test_recipe_trains_a_two_layer_mlp(name):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
    fp4cli.quantize_model(model, name, seed=0)
    recipe = fp4cli.load_recipe(name)
    expect_quantized = not recipe.linear.is_high_precision
    assert bool(fp4cli.quantized_layers(model)) == expect_quantized
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fp4cli.attach_qema(model, optimizer)
    losses = []
    for x, y in _teacher_batches(40):
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])
