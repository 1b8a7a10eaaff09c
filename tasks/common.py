"""Helpers every task shares: size lookup, evaluation mode, parameter counts, data paths."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn as nn

from .base import TaskError

SizeConfig = TypeVar("SizeConfig")


def pick_size(task: str, sizes: Mapping[str, SizeConfig], size: str) -> SizeConfig:
    """The config of `size`, or a TaskError that lists the sizes the task has."""
    if size not in sizes:
        raise TaskError(f"task {task!r} has no size {size!r}; sizes: {', '.join(sizes)}")
    return sizes[size]


def data_path(data: str | Path | None) -> Path | None:
    """The resolved `--data` path (None: the task's built-in data); a missing path is an error."""
    if data is None:
        return None
    try:
        path = Path(data).expanduser().resolve()
    except (OSError, RuntimeError) as error:  # a symlink loop, on any Python version
        raise TaskError(f"data path {data} cannot be resolved: {error}") from None
    if not path.exists():
        raise TaskError(f"data path {path} does not exist")
    return path


@contextmanager
def evaluation(model: nn.Module, device: torch.device) -> Iterator[None]:
    """model.eval() under no_grad (and bf16 autocast on CUDA); the model's mode comes back after."""
    was_training = model.training
    model.eval()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    )
    try:
        with torch.no_grad(), autocast:
            yield
    finally:
        model.train(was_training)


def model_description(
    task: str, size: str, model_config: Any, make_model: Callable[[], nn.Module]
) -> dict[str, Any]:
    """The part of a task's describe() every task shares."""
    return {
        "task": task,
        "size": size,
        "params": count_params(make_model),
        "model": asdict(model_config),
    }


def count_params(make_model: Callable[[], nn.Module]) -> int:
    """Parameters of the model `make_model` builds, built on the meta device (no memory, no RNG)."""
    with torch.device("meta"):
        model = make_model()
    return sum(p.numel() for p in model.parameters())
