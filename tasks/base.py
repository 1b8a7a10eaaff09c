"""What a task is: a model, deterministic batches, a loss and an evaluation, plus its defaults.

Batches are a pure function of (seed, step): the trainer asks for the batch of step k and gets
the same tensors whether the run started at step 0 or resumed at step k. Every task registers
itself by name with `register_task` and offers at least the sizes "debug" (seconds on a CPU,
for tests) and "default" (worth running on one GPU).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn


class TaskError(ValueError):
    """A bad task name, size or data path; the message is one line."""


@dataclass(frozen=True)
class TaskDefaults:
    """Training defaults of a task at one size (the trainer's config starts from these)."""

    steps: int
    batch_size: int
    lr: float
    weight_decay: float = 0.05
    warmup_steps: int = 0
    eval_every: int = 0  # 0: only at the end
    grad_clip: float = 1.0


@dataclass
class Batch:
    """Tensors of one step, already on the task's device."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


class Task(Protocol):
    name: str
    size: str
    defaults: TaskDefaults
    primary_metric: str  # the evaluation metric reports compare (e.g. "val_loss", "top1")
    # the training set's size in examples (images, windows of the text), or None for a task
    # that draws fresh samples every step (it has no epochs)
    train_examples: int | None

    def build_model(self) -> nn.Module: ...

    def batch(self, step: int, batch_size: int, seed: int) -> Batch: ...

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor: ...

    def evaluate(self, model: nn.Module) -> dict[str, float]: ...

    def describe(self) -> dict[str, Any]: ...


TaskFactory = Callable[..., Task]
_REGISTRY: dict[str, TaskFactory] = {}


def register_task(name: str) -> Callable[[TaskFactory], TaskFactory]:
    def add(factory: TaskFactory) -> TaskFactory:
        _REGISTRY[name] = factory
        return factory

    return add


def task_names() -> list[str]:
    _import_builtin_tasks()
    return sorted(_REGISTRY)


def create_task(
    name: str,
    size: str = "default",
    data: str | Path | None = None,
    device: str | torch.device = "cpu",
    model: Mapping[str, Any] | None = None,
) -> Task:
    """Build a registered task; `model` overrides architecture fields of the size
    (`--set model.FIELD=VALUE`). Raises TaskError for an unknown name/size/field, an impossible
    shape or a bad data path."""
    _import_builtin_tasks()
    if name not in _REGISTRY:
        raise TaskError(f"unknown task {name!r}; known: {', '.join(sorted(_REGISTRY))}")
    factory = _REGISTRY[name]
    if not model:
        return factory(size=size, data=data, device=torch.device(device))
    if "model" not in inspect.signature(factory).parameters:
        raise TaskError(f"task {name!r} takes no model fields (got {', '.join(model)})")
    return factory(size=size, data=data, device=torch.device(device), model=dict(model))


def task_defaults(name: str, size: str) -> TaskDefaults | None:
    """A built-in task's training defaults at `size` without building it (no data is read);
    None for a task that does not list them (its module's DEFAULTS)."""
    return _listed_defaults(name).get(size)


def task_sizes(name: str) -> list[str]:
    """The sizes `task_defaults` knows for a task (none for an unknown one)."""
    return list(_listed_defaults(name))


def _listed_defaults(name: str) -> dict[str, TaskDefaults]:
    import importlib

    _import_builtin_tasks()
    if name not in _REGISTRY:
        return {}
    module = importlib.import_module(_REGISTRY[name].__module__)
    return getattr(module, "DEFAULTS", {})


def steps_per_epoch(task: Task, batch_size: int) -> int | None:
    """Whole batches in one pass over the task's training set (a partial last batch dropped,
    as DeiT's loader does; at least 1), or None for a task without epochs."""
    if task.train_examples is None:
        return None
    return max(1, task.train_examples // batch_size)


def step_generator(seed: int, step: int, stream: int = 0) -> torch.Generator:
    """A CPU generator determined by (seed, step, stream): the source of a step's randomness."""
    mixed = (seed * 1_000_003 + step * 7_919 + stream * 104_729) & 0x7FFFFFFFFFFFFFFF
    return torch.Generator().manual_seed(mixed)


def _import_builtin_tasks() -> None:
    import importlib

    for module in ("regression", "vit", "diffusion", "gpt", "llama"):
        importlib.import_module(f"fp4cli.tasks.{module}")
