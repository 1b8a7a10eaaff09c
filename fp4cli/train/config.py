"""TrainConfig and its resolution: CLI flag > --set > recipe > task defaults.

`--set key=value` reaches any field: a TrainConfig field by its name (`lr=3e-4`, `steps=200`),
an architecture field of the task's model as `model.FIELD` (`model.n_layer=24`, checked by the
task when it builds the model), anything else is a recipe key (`linear.forward.x.rounding=sr`).
The fully resolved config (training fields, the recipe's resolved mapping, the task's
description) is what the run store and every checkpoint keep.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from fp4cli.recipe_loader import parse_value
from fp4cli.recipe_schema import did_you_mean


class ConfigError(ValueError):
    """A bad training option: a one-line message naming the key."""


SEED_MAX = 2**63 - 1  # seeds are int64 (the layers' seed buffers, torch's generators)
STEPS_MAX = 10**9  # more steps than any run trains; a larger count is a typing slip
INT_FIELDS = (
    "steps", "batch_size", "log_every", "eval_every", "stats_every", "checkpoint_every",
    "warmup_steps", "seed",
)  # fmt: skip


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _whole_float_as_int(value: Any) -> Any:
    """A float with no fraction (1e3) as that integer; any other value as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _is_finite_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


@dataclass(frozen=True)
class TrainConfig:
    task: str = "regression"
    recipe: str = "mxfp4"
    size: str = "default"
    steps: int | None = None  # None: the task's default
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    grad_clip: float | None = None
    seed: int = 0
    device: str = "auto"
    backend: str = "auto"  # quantizer implementation: auto, torch or triton (the same bits)
    compile: bool = False  # torch.compile the model
    # replay each training step from a CUDA graph (fp4cli.train.step); None: wherever the run
    # allows it (`fp4cli.train.loop.step_mode`)
    cuda_graph: bool | None = None
    recompute: bool = False  # recompute saved quantized-layer outputs (fp4cli.linear.recompute)
    parallel: str = "none"  # none, ddp or fsdp (under torchrun; fp4cli.train.distributed)
    # fsdp: all-gather quantized weights as FP4 codes and scales where the recipe allows it
    # (fp4cli.train.packed_gather); `--set parallel.fp4_gather=false` gathers them in BF16
    fp4_gather: bool = True
    data: str | None = None
    eval_every: int | None = None
    stats_every: int = 0  # 0: no quantization statistics (cheap)
    checkpoint_every: int = 0  # 0: only at the end
    checkpoints: bool = True  # false: none at all (a sweep's many small runs)
    log_every: int = 10
    tags: tuple[str, ...] = field(default_factory=tuple)
    sweep: str | None = None
    name: str | None = None  # a label for the run (a sweep names each run by its point)
    log_to: tuple[str, ...] = field(default_factory=tuple)  # trackers: tensorboard, wandb
    # architecture fields over the size's (model.n_layer=24): (field, value) pairs, sorted
    model: tuple[tuple[str, Any], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        for name in INT_FIELDS:  # 1e3 (YAML's float) is the integer 1000
            object.__setattr__(self, name, _whole_float_as_int(getattr(self, name)))
        for name in ("steps", "batch_size", "log_every"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value <= 0):
                raise ConfigError(f"{name}: must be a positive integer (got {value!r})")
        if self.steps is not None and self.steps > STEPS_MAX:
            raise ConfigError(f"steps: must be at most 10^9 (got {self.steps})")
        for name in ("eval_every", "stats_every", "checkpoint_every", "warmup_steps"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 0):
                raise ConfigError(f"{name}: must be a non-negative integer (got {value!r})")
        if not _is_int(self.seed) or not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"seed: must be an integer from 0 to 2^63 - 1 (got {self.seed!r})")
        for name in ("lr", "weight_decay", "grad_clip", "min_lr_ratio"):
            value = getattr(self, name)
            if value is not None and not _is_finite_number(value):
                raise ConfigError(f"{name}: must be a finite number (got {value!r})")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"lr: must be a positive number (got {self.lr!r})")
        if not isinstance(self.size, str) or not self.size:
            raise ConfigError(f"size: must be a size name of the task (got {self.size!r})")
        if self.parallel not in ("none", "ddp", "fsdp"):
            raise ConfigError(f"parallel: must be ddp or fsdp (got {self.parallel!r})")
        if self.backend not in ("auto", "torch", "triton"):
            raise ConfigError(f"backend: must be auto, torch or triton (got {self.backend!r})")
        for name in ("checkpoints", "compile", "cuda_graph", "recompute", "fp4_gather"):
            value = getattr(self, name)
            if not isinstance(value, bool) and not (name == "cuda_graph" and value is None):
                raise ConfigError(f"{name}: must be true or false (got {value!r})")
        if self.recompute and self.compile:
            from fp4cli.linear.recompute import NOT_COMPILED

            raise ConfigError(f"recompute: not with compile ({NOT_COMPILED})")
        if self.device != "auto" and not str(self.device).startswith(("cpu", "cuda")):
            raise ConfigError(f"device: must be auto, cpu or cuda[:N] (got {self.device!r})")
        object.__setattr__(self, "log_to", parse_log_to(self.log_to))
        object.__setattr__(self, "model", model_fields(self.model))

    def with_task_defaults(self, defaults: Any) -> TrainConfig:
        """Fill every unset field from the task's TaskDefaults."""
        filled = {
            name: getattr(defaults, name)
            for name in (
                "steps",
                "batch_size",
                "lr",
                "weight_decay",
                "warmup_steps",
                "eval_every",
                "grad_clip",
            )
            if getattr(self, name) is None
        }
        return dataclasses.replace(self, **filled)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["tags"] = list(self.tags)
        d["log_to"] = list(self.log_to)
        d["model"] = {name: list(v) if isinstance(v, tuple) else v for name, v in self.model}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in d.items() if k in known}
        values["tags"] = tuple(values.get("tags", ()))
        values["log_to"] = tuple(values.get("log_to", ()))
        return cls(**values)


def model_fields(raw: Any) -> tuple[tuple[str, Any], ...]:
    """Model field overrides as sorted (name, value) pairs, lists made tuples (a frozen config
    stays hashable), from a mapping or pairs; the task checks names and values."""
    pairs = raw.items() if isinstance(raw, dict) else raw
    try:
        items = [(name, value) for name, value in pairs]
    except (TypeError, ValueError):
        raise ConfigError(f"model: must map architecture fields to values (got {raw!r})") from None
    for name, _ in items:
        if not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"model: {name!r} is not a field name")
    return tuple(sorted((name, tuple(v) if isinstance(v, list) else v) for name, v in items))


def for_recipe(config: TrainConfig, recipe: Any) -> TrainConfig:
    """The training fields a recipe decides. Q-Ramping trains without gradient clipping, as
    TetraJet's code does (its training loop refuses a clipping norm with Q-Ramping): the task's
    default clipping is switched off, and a clipping norm asked for is an error."""
    if recipe.qramp is None:
        return config
    if config.grad_clip:
        raise ConfigError(
            f"grad_clip: Q-Ramping trains without gradient clipping, as TetraJet's code "
            f"(got {config.grad_clip!r}); leave grad_clip unset or set it to 0"
        )
    return dataclasses.replace(config, grad_clip=0.0)


SET_ALIASES = {"parallel.fp4_gather": "fp4_gather"}  # --set's name: the TrainConfig field


def split_overrides(overrides: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(TrainConfig field values, recipe overrides) from `--set key=value` strings."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    train_values: dict[str, Any] = {}
    recipe_overrides: list[str] = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value")
        key = SET_ALIASES.get(key, key)
        if key.startswith("model."):
            name = key.removeprefix("model.")
            try:
                model = train_values.setdefault("model", {})
                model[name] = parse_value(raw) if raw.strip() else None
            except yaml.YAMLError:
                raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from None
        elif key in fields:
            try:
                train_values[key] = parse_value(raw) if raw.strip() else None
            except yaml.YAMLError:
                raise ConfigError(f"--set {key}: cannot parse value {raw!r}") from None
        elif "." in key or key in ("skip", "description", "linear", "optimizer"):
            recipe_overrides.append(item)
        else:
            hint = did_you_mean(key, sorted(fields))
            raise ConfigError(f"--set {key}: no such training option or recipe key{hint}")
    return train_values, recipe_overrides


def resolve_config(
    flags: dict[str, Any], overrides: Sequence[str]
) -> tuple[TrainConfig, list[str]]:
    """TrainConfig from CLI flags (None = unset) over --set values; plus the recipe overrides."""
    set_values, recipe_overrides = split_overrides(overrides)
    values = {**set_values, **{k: v for k, v in flags.items() if v is not None}}
    if "tags" in values:
        values["tags"] = tuple(values["tags"])
    try:
        return TrainConfig(**values), recipe_overrides
    except TypeError as error:
        raise ConfigError(str(error)) from None


TRACKERS = ("tensorboard", "wandb")


def parse_log_to(value: Any) -> tuple[str, ...]:
    """Tracker names from 'tensorboard,wandb', a list of names, or nothing; one-line
    ConfigError for an unknown or repeated one."""
    if value is None or value == "" or value == ():
        return ()
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ConfigError(f"log_to: must be tracker names, e.g. tensorboard,wandb (got {value!r})")
    names = tuple(item.strip() for item in items if item.strip())
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"log_to: unknown tracker {name!r}; known: {', '.join(TRACKERS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"log_to: names a tracker twice ({', '.join(names)})")
    return names
