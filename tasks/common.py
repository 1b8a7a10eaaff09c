"""Helpers every task shares: size lookup, evaluation mode, parameter counts, data paths."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
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


def with_model_fields(
    task: str, config: SizeConfig, overrides: Mapping[str, Any] | None, fields: Sequence[str]
) -> SizeConfig:
    """`config` (a size's frozen dataclass) with the architecture `fields` that `overrides`
    sets (`--set model.FIELD=VALUE`); an unknown field or a value of the wrong kind is a
    TaskError. Each task checks the resulting shape itself."""
    if not overrides:
        return config
    values = {}
    for name, value in overrides.items():
        if name not in fields:
            from fp4cli.recipe_schema import did_you_mean

            hint = did_you_mean(name, list(fields))
            raise TaskError(
                f"task {task!r} has no model field {name!r}{hint}; fields: {', '.join(fields)}"
            )
        values[name] = _field_value(task, name, getattr(config, name), value)
    return dataclasses.replace(config, **values)  # type: ignore[type-var]


def _field_value(task: str, name: str, current: Any, value: Any) -> Any:
    """`value` checked against the kind of the field's `current` value."""
    where = f"task {task!r}: model.{name}"
    if isinstance(current, tuple):
        items = list(value) if isinstance(value, list | tuple) else None
        if not items or not all(_positive_int(item) for item in items):
            raise TaskError(f"{where}: must be a list of positive integers (got {value!r})")
        return tuple(items)
    if isinstance(current, float):
        number = _positive_int(value) or (isinstance(value, float) and math.isfinite(value))
        if not number or value <= 0:
            raise TaskError(f"{where}: must be a positive number (got {value!r})")
        return float(value)
    if not _positive_int(value):
        raise TaskError(f"{where}: must be a positive integer (got {value!r})")
    return value


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def check_multiple(task: str, value_name: str, value: int, of_name: str, of: int) -> None:
    """A TaskError unless model.`value_name` is a multiple of model.`of_name`."""
    if value % of:
        raise TaskError(
            f"task {task!r}: model.{value_name} {value} is not a multiple of model.{of_name} {of}"
        )


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


def special_kind(path: Path) -> str:
    """What a path that is neither a regular file nor a folder is: 'a character device', ..."""
    import stat

    mode = path.stat().st_mode
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"))  # fmt: skip
    return next((name for test, name in kinds if test(mode)), "not a regular file")


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
