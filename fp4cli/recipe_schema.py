"""The Recipe object and its validation: a recipe mapping -> frozen config dataclasses.

A recipe mapping (a YAML file's content, less its `base:`; see fp4cli.recipes):

    description: one line
    citation: where the method comes from (paper, code)   # shown by `fp4 recipes list`
    skip: [head, lm_head, last:2]   # modules kept in high precision (fnmatch patterns;
                                    # last:N, the model's last N blocks)
    linear:
      forward:     {x: mxfp4-ceil, w: mxfp4-ceil, hadamard: null}
      grad_input:  {dy: {preset: mxfp4-ceil, rounding: sr}, w: null}
      grad_weight: {dy: mxfp4, x: mxfp4, hadamard: 64}  # or {size: 64, random: false}
      double_quant: true
      dge: null                     # or {k: 5, cap: 3.0}; {} means the defaults
      outliers: null                # or {quantile: 0.99, compensate: false, method: nearest}
      qema: null                    # or {beta: 0.998, warmup: 10}
      gemm: dequantized             # or exact | fast: the GEMMs on mxfp4_matmul (LinearConfig)
      out_control: null             # or {ratio: 0.1, multiple: 128, record_start: 501,
                                    #     record_steps: 50, format: OPERAND} (FP8 channels)
      trust: null                   # or {rule: clip | error, bound: 0.0} (QuEST's estimator)
    optimizer:
      qramp: null                   # or {alpha: 16, beta: 5, max_period: null, interval: 500}
      osci_reset: null              # or {start_step: 15000, period: 200, track_steps: 50,
                                    #     threshold: 8}

An operand is null (high precision), a QuantSpec preset name, or a mapping of QuantSpec fields
with an optional `preset:` that the other fields override. A missing key means null / false.

Skipping: a module is kept in high precision when a pattern matches its full dotted name
(`time_embedding.linear_1`) or its last component (`head`), or, for `last:N`, when it lies in one
of the model's last N blocks (`fp4cli.linear.skip`). Without `skip:` the DEFAULT_SKIP patterns
apply; `skip: []` quantizes every linear layer.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.operands import GEMM_OPERANDS
from fp4cli.linear.skip import is_skip_pattern, matches_skip
from fp4cli.quant.spec import QuantSpec, SpecError
from fp4cli.techniques import (
    DGEConfig,
    HadamardConfig,
    OutControlConfig,
    OutlierConfig,
    QEMAConfig,
    TrustConfig,
)

# The first and last layers, where FP4 costs most and saves least (TetraJet and NVFP4 keep them
# in high precision): timm ViT `head` and `patch_embed.proj`, a GPT's `lm_head`, diffusers UNet
# `time_embedding.linear_1/2`, `class_embedding`, `add_embedding`; `pos_embed` and nn.Embedding
# tables are no linear layers anyway.
DEFAULT_SKIP = ("head", "lm_head", "*embed*")
FILE_KEYS = ("base", "description", "citation", "skip", "linear", "optimizer")
DICT_KEYS = ("name", "description", "citation", "skip", "linear", "optimizer", "source")
LINEAR_KEYS = (
    *GEMM_OPERANDS, "double_quant", "dge", "outliers", "qema", "gemm", "bias_gradient",
    "out_control", "trust",
)  # fmt: skip
TECHNIQUES = {"dge": DGEConfig, "outliers": OutlierConfig, "qema": QEMAConfig}
# LinearConfig field names -> recipe keys, to re-path LinearConfig's SpecError messages.
_RECIPE_KEYS = {
    f"{g}_{o}": f"{g}.{o}" for g, ops in GEMM_OPERANDS.items() for o in (*ops, "hadamard")
}


MAX_PROBLEM = 300


def excerpt(value: Any) -> str:
    """A short repr of a value for an error message (long strings and containers cut)."""
    import reprlib

    short = reprlib.Repr()
    short.maxstring, short.maxother, short.maxlevel = 60, 60, 3
    short.maxlist = short.maxtuple = short.maxdict = short.maxset = 6
    return short.repr(value)


class RecipeError(ValueError):
    """A recipe that cannot be loaded: a one-line message naming the file and the dotted key."""

    def __init__(self, source: str, key: str, problem: str) -> None:
        problem = " ".join(problem.split())
        if len(problem) > MAX_PROBLEM:  # an excerpt, never a whole file or value
            problem = problem[: MAX_PROBLEM - 3] + "..."
        self.source, self.key, self.problem = source, key, problem
        super().__init__(f"{source}: {key}: {self.problem}" if key else f"{source}: {self.problem}")


@dataclass(frozen=True)
class QRampConfig:
    """Q-Ramping (TetraJet): each weight updates every min(floor(R / alpha) * beta + 1,
    max_period) steps, R its oscillation ratio over `calibration_steps` differences measured in
    calibration_steps + 1 steps of plain AdamW (fp4cli.train.qramp).

    max_period (N_max): null means the task's steps per epoch, as TetraJet's code (about 1,251
    for DeiT on ImageNet); a task that draws fresh samples every step has no epoch and uses
    `interval`. Calibration repeats every `interval` steps (TetraJet: at every epoch's start;
    our small tasks have epochs of a few dozen steps, where a 31-step calibration each epoch
    would cost more than the training, so the interval is its own option)."""

    alpha: float = 16.0
    beta: int = 5
    calibration_steps: int = 30
    max_period: int | None = None
    interval: int = 500

    def __post_init__(self) -> None:
        a = self.alpha
        if isinstance(a, bool) or not isinstance(a, (int, float)) or a <= 0:
            raise SpecError(f"alpha: must be a positive number (got {a!r})")
        for name in ("beta", "calibration_steps", "max_period", "interval"):
            value = getattr(self, name)
            if name == "max_period" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                expected = "null or a positive integer" if name == "max_period" else ""
                raise SpecError(
                    f"{name}: must be {expected or 'a positive integer'} (got {value!r})"
                )


@dataclass(frozen=True)
class OsciResetConfig:
    """TetraJet-v2's OsciReset (fp4cli.techniques.osci_reset): from `start_step` on, in each
    window of `period` steps, `track_steps` steps of per-weight movement sums, then the weights
    whose quantized value moved `threshold` times as far as they did are set to it. Defaults:
    the released OLMo2 configs' (`TJv2-mix_fp8-osci_reset.yaml`: from step 15,000 of 25,500,
    every 200 steps, 50 tracked, threshold 8)."""

    start_step: int = 15000
    period: int = 200
    track_steps: int = 50
    threshold: float = 8.0

    def __post_init__(self) -> None:
        for name, least in (("start_step", 0), ("period", 3), ("track_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise SpecError(f"{name}: must be an integer of at least {least} (got {value!r})")
        if self.track_steps + 1 >= self.period:
            raise SpecError(
                f"track_steps: must be below period - 1 (got {self.track_steps} with period "
                f"{self.period}): the reset takes the step after the tracked ones"
            )
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise SpecError(f"threshold: must be a positive number (got {t!r})")


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    skip: tuple[str, ...]
    linear: LinearConfig
    qramp: QRampConfig | None
    source: str
    citation: str = ""  # the method's paper and code, for people (no effect on training)
    osci_reset: OsciResetConfig | None = None

    def skips(self, module_name: str) -> bool:
        """Whether the module with this dotted name stays in high precision."""
        return matches_skip(module_name, self.skip)

    def to_dict(self) -> dict[str, Any]:
        """Fully resolved and JSON-able: presets expanded, no base; from_dict reads it back."""
        lin = self.linear
        linear: dict[str, Any] = {
            gemm: {op: _asdict(lin.spec(f"{gemm}_{op}")) for op in ops}
            | {"hadamard": _asdict(lin.hadamard(gemm))}
            for gemm, ops in GEMM_OPERANDS.items()
        }
        linear["double_quant"] = lin.double_quant
        linear |= {name: _asdict(getattr(lin, name)) for name in TECHNIQUES}
        if lin.gemm != "dequantized":  # left out by default: older resolved recipes keep their form
            linear["gemm"] = lin.gemm
        if lin.bias_gradient != "dy":  # likewise
            linear["bias_gradient"] = lin.bias_gradient
        if lin.out_control is not None:  # likewise
            out_control = _asdict(lin.out_control)
            assert out_control is not None
            linear["out_control"] = out_control | {"format": _asdict(lin.out_control.format)}
        if lin.trust is not None:  # likewise
            linear["trust"] = _asdict(lin.trust)
        return {
            "name": self.name,
            "description": self.description,
            "citation": self.citation,
            "skip": list(self.skip),
            "linear": linear,
            "optimizer": {"qramp": _asdict(self.qramp)}
            | ({"osci_reset": _asdict(self.osci_reset)} if self.osci_reset else {}),
            "source": self.source,
        }

    def to_yaml(self) -> str:
        """The resolved recipe as a loadable recipe file (an operand on one line)."""
        tree = self.to_dict()
        header = f"# {tree.pop('name')}: resolved from {tree.pop('source')}\n"
        return header + yaml.dump(tree, Dumper=_CompactDumper, sort_keys=False, width=120)

    @classmethod
    def from_dict(cls, d: Any, source: str = "<dict>") -> Recipe:
        """A Recipe from to_dict()'s output (or any recipe mapping without `base`). `source`
        names the origin in error messages, and is the Recipe's source when `d` has none."""
        return build_recipe(d, source, keys=DICT_KEYS, name="unnamed", source=source)


class _CompactDumper(yaml.SafeDumper):
    """Lists and mappings of scalars (skip, an operand, a technique) on one line."""


def _represent_dict(dumper: yaml.SafeDumper, d: dict[str, Any]) -> yaml.Node:
    flow = not any(isinstance(v, dict) for v in d.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", d, flow_style=flow)


def _represent_list(dumper: yaml.SafeDumper, items: list[Any]) -> yaml.Node:
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=True)


_CompactDumper.add_representer(dict, _represent_dict)
_CompactDumper.add_representer(list, _represent_list)


def build_recipe(raw: Any, label: str, *, keys: Sequence[str], name: str, source: str) -> Recipe:
    """Validate a recipe mapping whose top-level keys are among `keys`; errors name `label`."""
    top = _mapping(raw, label, "", keys)
    skip = top.get("skip", list(DEFAULT_SKIP))
    if not isinstance(skip, list) or not all(is_skip_pattern(p) for p in skip):
        expected = "must be a list of module-name patterns (or last:N, N > 0)"
        raise RecipeError(label, "skip", f"{expected} (got {excerpt(skip)})")
    optimizer = _mapping(top.get("optimizer") or {}, label, "optimizer", ("qramp", "osci_reset"))
    return Recipe(
        name=_string(top.get("name", name), label, "name"),
        description=_string(top.get("description", ""), label, "description"),
        citation=_string(top.get("citation", ""), label, "citation"),
        skip=tuple(skip),
        linear=_linear(top.get("linear") or {}, label),
        qramp=_config(optimizer.get("qramp"), QRampConfig, label, "optimizer.qramp"),
        source=_string(top.get("source", source), label, "source"),
        osci_reset=_config(
            optimizer.get("osci_reset"), OsciResetConfig, label, "optimizer.osci_reset"
        ),
    )


def _linear(raw: Any, label: str) -> LinearConfig:
    lin = _mapping(raw, label, "linear", LINEAR_KEYS)
    fields: dict[str, Any] = {}
    for gemm, operands in GEMM_OPERANDS.items():
        key = f"linear.{gemm}"
        ops = _mapping(lin.get(gemm) or {}, label, key, (*operands, "hadamard"))
        for op in operands:
            fields[f"{gemm}_{op}"] = _operand(ops.get(op), label, f"{key}.{op}")
        hadamard = ops.get("hadamard")
        if isinstance(hadamard, int) and not isinstance(hadamard, bool):
            hadamard = {"size": hadamard}
        expected = "null, a size or {size: N, random: true | false, signs: [1 or -1, ...]}"
        fields[f"{gemm}_hadamard"] = _config(
            hadamard, HadamardConfig, label, f"{key}.hadamard", expected
        )
    fields["double_quant"] = lin.get("double_quant", False)
    if not isinstance(fields["double_quant"], bool):
        raise RecipeError(label, "linear.double_quant", "must be true or false")
    for name, cls in TECHNIQUES.items():
        fields[name] = _config(lin.get(name), cls, label, f"linear.{name}")
    fields["gemm"] = lin.get("gemm", "dequantized")
    fields["bias_gradient"] = lin.get("bias_gradient", "dy")
    fields["out_control"] = _out_control(lin.get("out_control"), label)
    fields["trust"] = _config(lin.get("trust"), TrustConfig, label, "linear.trust")
    try:
        return LinearConfig(**fields)
    except SpecError as error:
        raise _wrap(error, label, "linear", _RECIPE_KEYS) from None


def _out_control(raw: Any, label: str) -> OutControlConfig | None:
    """OutControl's config: its `format` an operand (a preset name, a mapping or null); a
    missing format is the code's MXFP8."""
    if raw is None:
        return None
    key = "linear.out_control"
    names = tuple(f.name for f in dataclasses.fields(OutControlConfig))
    fields = _mapping(raw, label, key, names, f"null or a mapping of {', '.join(names)}")
    if "format" in fields:
        fields["format"] = _operand(fields["format"], label, f"{key}.format")
    try:
        return OutControlConfig(**_typed(OutControlConfig, fields, label, key))
    except SpecError as error:
        raise _wrap(error, label, key) from None


def _operand(raw: Any, label: str, key: str) -> QuantSpec | None:
    if raw is None:
        return None
    by_name = isinstance(raw, str)
    expected = "null, a preset name or a mapping of QuantSpec fields"
    allowed = ("preset", *QuantSpec.field_names())
    fields = _mapping({"preset": raw} if by_name else raw, label, key, allowed, expected)
    preset = fields.pop("preset", None)
    if preset is not None and preset not in QuantSpec.PRESETS:
        known = list(QuantSpec.PRESETS)
        problem = f"unknown preset {preset!r}{did_you_mean(str(preset), known)}"
        raise RecipeError(
            label, key if by_name else f"{key}.preset", f"{problem}; known: {', '.join(known)}"
        )
    values = QuantSpec.PRESETS[preset] if preset else {}
    try:
        return QuantSpec(**(values | _typed(QuantSpec, fields, label, key)))
    except SpecError as error:
        raise _wrap(error, label, key) from None


def _config(raw: Any, cls: Any, label: str, key: str, expected: str = "") -> Any:
    """A technique's frozen config from null or a mapping of its fields."""
    if raw is None:
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    expected = expected or f"null or a mapping of {', '.join(names)}"
    fields = _mapping(raw, label, key, names, expected)
    try:
        return cls(**_typed(cls, fields, label, key))
    except SpecError as error:
        raise _wrap(error, label, key) from None


_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "bool": ((bool,), "true or false"),
    "int": ((int,), "an integer"),
    "float": ((int, float), "a number"),
    "str": ((str,), "a string"),
}


def _typed(cls: Any, fields: dict[str, Any], label: str, key: str) -> dict[str, Any]:
    """Fields checked against the dataclass's simple annotations (an int becomes a float where a
    float is expected); unions such as QuantSpec.block are left to the dataclass's checks."""
    annotations = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    checked = dict(fields)
    for name, value in fields.items():
        if annotations[name] not in _TYPES:
            continue
        types, expected = _TYPES[annotations[name]]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise RecipeError(label, f"{key}.{name}", f"must be {expected} (got {excerpt(value)})")
        if annotations[name] == "float":
            checked[name] = float(checked[name])
    return checked


def _mapping(
    raw: Any, label: str, key: str, allowed: Sequence[str], expected: str = "a mapping"
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise RecipeError(label, key, f"must be {expected} (got {excerpt(raw)})")
    for name in raw:
        if name not in allowed:
            path = f"{key}.{name}" if key else str(name)
            hint = did_you_mean(str(name), allowed)
            raise RecipeError(label, path, f"unknown key{hint}; allowed: {', '.join(allowed)}")
    return dict(raw)


def _string(value: Any, label: str, key: str) -> str:
    if not isinstance(value, str):
        raise RecipeError(label, key, f"must be a string (got {excerpt(value)})")
    return value


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _wrap(
    error: SpecError, label: str, key: str, rename: dict[str, str] | None = None
) -> RecipeError:
    """A config dataclass's `field: problem` message, re-pathed under the recipe key."""
    field, sep, problem = str(error).partition(": ")
    if not sep or not re.fullmatch(r"[A-Za-z_][\w.]*", field):
        return RecipeError(label, key, str(error))
    head, dot, rest = field.partition(".")
    return RecipeError(label, f"{key}.{(rename or {}).get(head, head)}{dot}{rest}", problem)


def _asdict(config: Any) -> dict[str, Any] | None:
    """A config's fields; a field marked `omit_default` (an option added later) only when it is
    not at its default, so what was resolved before the option keeps its form (and a sweep
    point its id)."""
    if config is None:
        return None
    return {
        f.name: _plain(getattr(config, f.name))
        for f in dataclasses.fields(config)
        if not (f.metadata.get("omit_default") and getattr(config, f.name) == f.default)
    }


def _plain(value: Any) -> Any:
    """A field's value as YAML and JSON write it: a tuple (a sign vector) as a list."""
    return list(value) if isinstance(value, tuple) else value
