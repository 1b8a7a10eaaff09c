"""`fp4cli.TrainStep` on a GPU: its CUDA-graph steps are the eager steps bit for bit (losses and
parameters, Q-EMA included), a batch of another shape runs eagerly between replays, and an
optimizer that cannot be captured is a one-line error."""

from __future__ import annotations

import pytest
import torch

import fp4cli
from tests.gpu_gpt import gpt_batches, gpt_loss, tiny_gpt, train_steps

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("recipe", ["mxfp4", "tetrajet-qema"])
def test_train_step_replays_the_eager_steps(recipe):
    eager_losses, eager_params, _ = train_steps(recipe, cuda_graph=False)
    model = tiny_gpt(recipe, "auto")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    fp4cli.attach_qema(model, optimizer)
    step = fp4cli.TrainStep(model, optimizer, gpt_loss, grad_clip=1.0)
    losses = [step(batch) for batch in gpt_batches(8)]
    assert step.graphed
    assert torch.equal(torch.stack(losses), eager_losses)
    for mine, eager in zip(model.parameters(), eager_params, strict=True):
        assert torch.equal(mine, eager)
    inputs, targets = gpt_batches(1, batch=3)[0]
    assert torch.isfinite(step((inputs, targets)))  # another shape: eager, on the same state
    assert torch.isfinite(step(gpt_batches(1)[0]))  # and the graph again


def test_an_optimizer_that_cannot_be_captured_is_refused():
    model = tiny_gpt("mxfp4", "auto")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="build the optimizer with capturable=True"):
        fp4cli.TrainStep(model, optimizer, gpt_loss)
