"""regression: a student MLP learns a fixed random teacher MLP from noisy samples.

Inputs x ~ N(0, I); targets teacher(x) + N(0, 0.1^2), the teacher's outputs scaled to mean 0 and
std 1, so the train loss cannot fall below 0.01. val_loss is the MSE against the noiseless
teacher on a fixed held-out set (its floor is 0): what FP4 costs shows up there directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Batch, TaskDefaults, TaskError, register_task, step_generator
from .common import evaluation, model_description, pick_size, with_model_fields

TEACHER_SEED = 1_234_567  # the teacher is the same for every run
VAL_SEED = 7_654_321
NOISE_STD = 0.1
TEACHER_GAIN = 1.5  # weight std gain / sqrt(fan_in): tanh stays in its curved part


@dataclass(frozen=True)
class RegressionSize:
    input_dim: int
    width: int
    depth: int  # hidden layers of the student
    output_dim: int
    teacher_width: int
    teacher_depth: int
    val_samples: int


SIZES = {
    "debug": RegressionSize(32, 64, 2, 4, 32, 2, 512),
    "default": RegressionSize(128, 512, 4, 8, 256, 2, 4096),
}
# --set model.FIELD=VALUE: the student's and the teacher's shapes (not the validation set's)
MODEL_FIELDS = ("input_dim", "width", "depth", "output_dim", "teacher_width", "teacher_depth")
DEFAULTS = {
    "debug": TaskDefaults(steps=50, batch_size=64, lr=1e-3, weight_decay=0.0),
    "default": TaskDefaults(steps=500, batch_size=256, lr=1e-3, weight_decay=0.0, eval_every=100),
}


class MLP(nn.Module):
    """`depth` hidden Linear + GELU layers of `width`, then a linear `head`."""

    def __init__(self, input_dim: int, width: int, depth: int, output_dim: int) -> None:
        super().__init__()
        dims = [input_dim] + [width] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in pairwise(dims))
        self.head = nn.Linear(width, output_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, input_dim) -> (B, output_dim)
        for layer in self.layers:
            x = F.gelu(layer(x))
        return self.head(x)


class Teacher:
    """A random tanh MLP drawn from TEACHER_SEED, its outputs standardized; plain tensors, so
    building it leaves torch's global random state alone."""

    def __init__(self, config: RegressionSize, device: torch.device) -> None:
        generator = torch.Generator().manual_seed(TEACHER_SEED)
        dims = [config.input_dim] + [config.teacher_width] * config.teacher_depth
        dims.append(config.output_dim)
        self.weights = [
            torch.randn(b, a, generator=generator) * (TEACHER_GAIN / a**0.5)  # (out, in)
            for a, b in pairwise(dims)
        ]
        probe = torch.randn(8192, config.input_dim, generator=generator)  # (8192, input_dim)
        raw = self._raw(probe)  # (8192, output_dim)
        self.mean, self.std = raw.mean(0), raw.std(0)
        self.weights = [w.to(device) for w in self.weights]
        self.mean, self.std = self.mean.to(device), self.std.to(device)

    def _raw(self, x: torch.Tensor) -> torch.Tensor:
        for weight in self.weights[:-1]:
            x = torch.tanh(x @ weight.T)
        return x @ self.weights[-1].T

    def __call__(self, x: torch.Tensor) -> torch.Tensor:  # (B, input_dim) -> (B, output_dim)
        return (self._raw(x) - self.mean) / self.std


class RegressionTask:
    name = "regression"
    primary_metric = "val_loss"

    def __init__(
        self, size: str, device: torch.device, model: dict[str, Any] | None = None
    ) -> None:
        self.size = size
        self.config = with_model_fields(
            self.name, pick_size(self.name, SIZES, size), model, MODEL_FIELDS
        )
        self.defaults = DEFAULTS[size]
        self.device = device
        self.train_examples: int | None = None  # fresh samples every step
        self.teacher = Teacher(self.config, device)
        generator = torch.Generator().manual_seed(VAL_SEED)
        val_inputs = torch.randn(
            self.config.val_samples, self.config.input_dim, generator=generator
        )
        self.val_inputs = val_inputs.to(device)  # (V, input_dim)
        self.val_targets = self.teacher(self.val_inputs)  # (V, output_dim), noiseless

    def _make_model(self) -> nn.Module:
        c = self.config
        return MLP(c.input_dim, c.width, c.depth, c.output_dim)

    def build_model(self) -> nn.Module:
        return self._make_model().to(self.device)

    def batch(self, step: int, batch_size: int, seed: int) -> Batch:
        generator = step_generator(seed, step)
        inputs = torch.randn(batch_size, self.config.input_dim, generator=generator)
        noise = torch.randn(batch_size, self.config.output_dim, generator=generator) * NOISE_STD
        inputs, noise = inputs.to(self.device), noise.to(self.device)
        return Batch({"inputs": inputs, "targets": self.teacher(inputs) + noise})

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        predictions = model(batch["inputs"])  # (B, output_dim)
        return F.mse_loss(predictions.float(), batch["targets"])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        with evaluation(model, self.device):
            predictions = model(self.val_inputs).float()  # (V, output_dim)
            val_loss = F.mse_loss(predictions, self.val_targets).item()
        return {"val_loss": val_loss}

    def describe(self) -> dict[str, Any]:
        return {
            **model_description(self.name, self.size, self.config, self._make_model),
            "dataset": "teacher-mlp",
            "noise_std": NOISE_STD,
            "val_samples": self.config.val_samples,
        }


@register_task("regression")
def create_regression(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> RegressionTask:
    if data is not None:
        raise TaskError(f"task 'regression' draws its own data; got --data {data}")
    return RegressionTask(size, device or torch.device("cpu"), model)
