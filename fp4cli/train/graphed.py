"""`TrainStep`: your own training loop's step, replayed from a CUDA graph on a GPU.

A quantized model's eager step waits on the host: each quantized layer issues tens of launches.
`fp4 train` therefore replays its steps from one CUDA graph (`fp4cli.train.step.StepRunner`).
`TrainStep` hands the same runner to a loop of your own: forward under BF16 autocast, backward,
gradient clipping and the optimizer's step, Q-EMA's update included, captured once and replayed.
The replayed steps compute what eager steps compute, bit for bit: the quantized layers draw
their seeds on the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from fp4cli.train.step import (
    StepRunner,
    batch_tensors,
    device_learning_rates,
    set_learning_rate,
)


class TrainStep:
    """One training step of `model`: `loss = step(batch)`.

    `loss_fn(model, batch)` returns the loss; a batch is a tensor, or a tuple, list or dict of
    tensors. On a CUDA device the forward runs under BF16 autocast and, with `cuda_graph` (the
    default there), the steps after three warm-up steps replay one CUDA graph. A batch of
    another shape than the captured one (a ragged last batch) runs eagerly on the same
    parameters and optimizer state. The optimizer must be built with `capturable=True`; its
    learning rates become device tensors: change them with `set_lr`. `grad_clip`: the largest
    gradient norm (None: no clipping). `grad_norm` holds the last step's norm before clipping.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        grad_clip: float | None = None,
        cuda_graph: bool | None = None,
    ) -> None:
        device = _device_of(model)
        if cuda_graph is None:
            cuda_graph = device.type == "cuda"
        if cuda_graph:
            _check_capturable(device, optimizer)
            device_learning_rates(optimizer, device)
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip: must be positive or None (got {grad_clip})")
        self.optimizer = optimizer
        self.grad_norm: torch.Tensor | None = None
        self._runner = StepRunner(model, optimizer, loss_fn, grad_clip, device, cuda_graph)
        self._shapes: list[torch.Size] | None = None

    @property
    def graphed(self) -> bool:
        """Whether the steps replay a captured CUDA graph (after the warm-up steps)."""
        return self._runner.graph is not None

    def __call__(self, batch: Any) -> torch.Tensor:
        """Train one step on `batch`; the loss (a 0-d tensor on the device)."""
        shapes = [t.shape for t in batch_tensors(batch)]
        eager = self._shapes is not None and shapes != self._shapes
        if self._runner.cuda_graph and self._shapes is None:
            self._shapes = shapes
        loss, self.grad_norm = self._runner(batch, eager=eager)
        return loss

    def set_lr(self, lr: float) -> None:
        """Set every parameter group's learning rate (in place on the device when graphed)."""
        set_learning_rate(self.optimizer, lr)


def _device_of(model: torch.nn.Module) -> torch.device:
    for param in model.parameters():
        return param.device
    raise ValueError("TrainStep: the model has no parameters")


def _check_capturable(device: torch.device, optimizer: torch.optim.Optimizer) -> None:
    if device.type != "cuda":
        raise ValueError(f"cuda_graph: needs a model on a CUDA device (it is on {device})")
    if not all(group.get("capturable", False) for group in optimizer.param_groups):
        raise ValueError(
            "cuda_graph: build the optimizer with capturable=True, e.g. "
            "torch.optim.AdamW(params, lr=..., fused=True, capturable=True)"
        )
