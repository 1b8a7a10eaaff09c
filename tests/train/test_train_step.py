"""`fp4cli.TrainStep`, the step of a user's own loop: on the CPU its steps are a plain loop's
(forward, backward, clipping, the optimizer's step), bit for bit; bad arguments are one-line
errors. Its CUDA graph is checked on a GPU (tests/gpu/test_gpu_train_step.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fp4cli


def small_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))
    fp4cli.quantize_model(model, "tetrajet-qema", seed=0)
    return model


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs), targets)


def batches(count: int, rows: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [
        (torch.randn(rows, 64, generator=generator), torch.randn(rows, 32, generator=generator))
        for _ in range(count)
    ]


def test_a_train_step_is_a_plain_loops_step_bit_for_bit() -> None:
    plain = small_model()
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    fp4cli.attach_qema(plain, optimizer)
    plain_losses = []
    for batch in batches(4):
        optimizer.zero_grad()
        loss = loss_of(plain, batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.1)
        optimizer.step()
        plain_losses.append(loss.detach())

    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fp4cli.attach_qema(model, optimizer)
    step = fp4cli.TrainStep(model, optimizer, loss_of, grad_clip=0.1)
    losses = [step(batch) for batch in batches(4)]
    assert not step.graphed and step.grad_norm is not None
    assert step.grad_norm > 0.1  # the clipping acted
    assert torch.equal(torch.stack(losses), torch.stack(plain_losses))
    for mine, theirs in zip(model.state_dict().values(), plain.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs)  # parameters, Q-EMA's average, seeds' counters


def test_set_lr_reaches_every_group() -> None:
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    step = fp4cli.TrainStep(model, optimizer, loss_of)
    step.set_lr(3e-4)
    assert [group["lr"] for group in optimizer.param_groups] == [3e-4]
    step(batches(1)[0])
    step(batches(2, rows=5)[1])  # another batch shape: fine without a graph


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cuda_graph": True}, "cuda_graph: needs a model on a CUDA device (it is on cpu)"),
        ({"grad_clip": 0.0}, "grad_clip: must be positive or None (got 0.0)"),
    ],
)
def test_bad_arguments_are_one_line_errors(options, message) -> None:
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    with pytest.raises(ValueError) as raised:
        fp4cli.TrainStep(model, optimizer, loss_of, **options)
    assert str(raised.value) == message


def test_a_model_without_parameters_is_refused() -> None:
    with pytest.raises(ValueError, match="the model has no parameters"):
        fp4cli.TrainStep(nn.GELU(), torch.optim.SGD([torch.zeros(1, requires_grad=True)]), loss_of)
