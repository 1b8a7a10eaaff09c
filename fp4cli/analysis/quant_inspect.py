"""Quantization error of a model's tensors under several quantizers, side by side.

Sources: a run's latest checkpoint, a task's freshly built model, or a torch file of tensors.
From a model or a checkpoint, the tensors are the 2-D floating `*.weight` entries of its state
dict: linear layers' weights and embedding tables (buffers such as `weight_ema`, 1-D norm weights
and 4-D convolutions are left out). From a file: every floating tensor with 2 or more dimensions.

A variant is a QuantSpec preset, optionally with the random Hadamard transform of size n fused in
(`fake_quantize(x, spec, hadamard=n, hadamard_seed=0)`). Every tensor is quantized along its last
axis (a weight's input dimension: the forward GEMM's reduction dimension), in float32, with
rounding seed 0 for stochastic rounding. With a Hadamard transform the error is measured in the
rotated domain, between R x and its quantization: R is orthogonal, so the error's norm, rel_mse
and SNR are those of the weight rotated back; clipped and flushed count rotated values. A tensor
whose last dimension is not a multiple of n (or a tile2d spec on a tensor that is not 2-D) has
no value for that variant.

Scale exponents: floor(log2 s) of each block's effective scale s, the factor its grid values are
multiplied by in the tensor's own units: the decoded block scale, divided by the tensor scale for
two-level specs (nvfp4, mxfp4-ue5m3), so that every variant shares one axis. Power-of-two scales
(e8m0) give their exact exponent. All-zero blocks (they get the format's smallest scale) and
blocks holding NaN or Inf are counted apart, not in the histogram.

A tensor holding NaN or Inf has no quantization error: its rel_mse and SNR are NaN, and so are
its clipped and flushed shares when no value of it is finite; `nonfinite` counts those values.

Outliers (fp4cli.analysis.outliers): kurtosis, max/median |x| per row and per column, and the
share of blocks whose scale one value sets, of each tensor as it is and after each Hadamard
transform asked for (same seed); the block share at every block size of the specs.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fp4cli.analysis.errors import AnalysisError
from fp4cli.analysis.outliers import OutlierStats, outlier_stats
from fp4cli.linear.skip import expand_skip, matches_skip
from fp4cli.linear.stats import operand_stats
from fp4cli.quant import QuantizedTensor, QuantSpec, quantize
from fp4cli.quant.scales import floor_log2
from fp4cli.quant.two_level import decode_factors, global_encode_scale
from fp4cli.techniques.hadamard import SIZES as HADAMARD_SIZES
from fp4cli.techniques.hadamard import rht

DEFAULT_SPECS = ("mxfp4", "mxfp4-ceil", "nvfp4", "mxfp4-ue5m3")
METRICS = ("rel_mse", "snr_db", "clipped", "flushed")
HADAMARD_SEED = 0
ROUNDING_SEED = 0
TINY = torch.finfo(torch.float32).tiny  # operand_stats' floor of rel_mse in the SNR


@dataclass(frozen=True)
class Variant:
    """One quantizer: a preset, with the random Hadamard transform of size `hadamard` or none."""

    preset: str
    spec: QuantSpec
    hadamard: int | None = None

    @property
    def label(self) -> str:
        return f"{self.preset}+rht{self.hadamard}" if self.hadamard else self.preset


@dataclass(frozen=True)
class NamedTensor:
    name: str
    tensor: torch.Tensor
    high_precision: bool = False  # a layer the run's recipe keeps in high precision


@dataclass
class Source:
    description: dict[str, Any]  # "kind" (run, task or file) and where the tensors come from
    tensors: list[NamedTensor]


@dataclass
class Measurement:
    """One tensor (or, in a summary, all tensors) under one variant."""

    rel_mse: float
    snr_db: float
    clipped: float
    flushed: float
    scale_exponents: dict[int, int]  # floor(log2 effective block scale) -> blocks
    zero_blocks: int
    nan_blocks: int
    tensor_scale: float | None = None
    nonfinite: int = 0  # NaN or Inf values of the input: its error is not defined


@dataclass
class Summary(Measurement):
    """Means over the tensors a variant applies to, weighted by element count (snr_db from the
    mean rel_mse); pooled histogram and block counts."""

    tensors: int = 0
    elements: int = 0


@dataclass
class TensorReport:
    name: str
    shape: tuple[int, ...]
    high_precision: bool
    measurements: dict[str, Measurement | None] = field(default_factory=dict)  # by variant label
    # by transform ("none", "rht16", ...); None where the transform does not apply
    outliers: dict[str, OutlierStats | None] = field(default_factory=dict)

    @property
    def numel(self) -> int:
        return int(torch.Size(self.shape).numel())


def make_variants(presets: Sequence[str], hadamard_sizes: Sequence[int] = ()) -> list[Variant]:
    """Every preset as given, then every preset with each Hadamard size (duplicates dropped)."""
    for size in hadamard_sizes:
        if size not in HADAMARD_SIZES:
            raise AnalysisError(f"--hadamard must be a power of two in 16..256 (got {size})")
    specs = [(name, _preset(name)) for name in dict.fromkeys(presets)]
    sizes = [None, *dict.fromkeys(hadamard_sizes)]
    return [Variant(name, spec, size) for size in sizes for name, spec in specs]


def _preset(name: str) -> QuantSpec:
    if name not in QuantSpec.PRESETS:
        raise AnalysisError(f"unknown spec {name!r}; presets: {', '.join(QuantSpec.PRESETS)}")
    return QuantSpec.preset(name)


def weight_tensors(state: Mapping[str, Any], skip: Sequence[str] = ()) -> list[NamedTensor]:
    """The 2-D floating `*.weight` entries of a state dict, marked when `skip` matches their
    module."""
    names = [
        name
        for name, value in state.items()
        if (name == "weight" or name.endswith(".weight")) and _is_float(value) and value.dim() == 2
    ]
    patterns = expand_skip(skip, [name.rpartition(".")[0] for name in names])
    return [
        NamedTensor(name, state[name], matches_skip(name.rpartition(".")[0], patterns))
        for name in names
    ]


def from_task(task: str, size: str) -> Source:
    """A task's model as built for a run with seed 0, on the CPU."""
    from fp4cli.tasks.base import create_task

    torch.manual_seed(0)
    model = create_task(task, size, device="cpu").build_model()
    description = {"kind": "task", "task": task, "size": size}
    return _checked(Source(description, weight_tensors(model.state_dict())), f"task {task}")


def from_run(store: str | Path | None, run_id: str) -> Source:
    """A run's latest checkpoint; layers its recipe skips are marked high precision."""
    from fp4cli.store import RunStore
    from fp4cli.train.checkpoint import load_checkpoint

    with RunStore(store, read_only=True) as run_store:
        run = run_store.get_run(run_id)
        checkpoint = run_store.latest_checkpoint(run["id"])
    if checkpoint is None:
        raise AnalysisError(f"run {run['id']} has no checkpoint")
    state = load_checkpoint(checkpoint["path"], torch.device("cpu"))
    skip = list(run["config"].get("recipe", {}).get("skip", []))
    description = {
        "kind": "run", "run": run["id"], "task": run["task"], "recipe": run["recipe"],
        "step": checkpoint["step"], "checkpoint": checkpoint["path"], "skip": skip,
    }  # fmt: skip
    return _checked(Source(description, weight_tensors(state["model"], skip)), f"run {run['id']}")


def from_file(path: str | Path) -> Source:
    """Every floating tensor with ndim >= 2 in a torch file: a tensor, or (nested) dicts and
    lists of them, such as a state dict; names are dotted keys."""
    from fp4cli.train.checkpoint import CheckpointError, read_plain

    path = Path(path)
    if not path.exists():
        raise AnalysisError(f"no such file: {path}")
    if not path.is_file():
        raise AnalysisError(f"{path} is not a regular file (a folder, a device or a pipe)")
    try:
        loaded = read_plain(path, "cpu", what="torch file of tensors")
    except CheckpointError as error:
        raise AnalysisError(str(error)) from None
    tensors = [
        NamedTensor(name, value)
        for name, value in _flatten(loaded, "")
        if _is_float(value) and value.dim() >= 2
    ]
    if len(tensors) == 1 and tensors[0].name == "":
        tensors = [NamedTensor(path.stem, tensors[0].tensor)]
    return _checked(Source({"kind": "file", "path": str(path)}, tensors), str(path))


def _flatten(value: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        yield prefix, value
        return
    for key, item in items:
        yield from _flatten(item, f"{prefix}.{key}" if prefix else str(key))


def _is_float(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and torch.is_floating_point(value)


def _checked(source: Source, where: str) -> Source:
    if not source.tensors:
        raise AnalysisError(f"{where} has no floating-point tensor with 2 or more dimensions")
    return source


def measure(tensor: torch.Tensor, variant: Variant, device: str = "cpu") -> Measurement | None:
    """Quantization error and scale exponents of `tensor` along its last axis under `variant`;
    None where the variant does not apply."""
    x = tensor.detach().to(device=device, dtype=torch.float32)
    if variant.spec.tile2d and x.dim() != 2:
        return None
    if variant.hadamard:
        if x.shape[-1] % variant.hadamard:
            return None
        x = rht(x, -1, variant.hadamard, HADAMARD_SEED)  # the rotated domain; R is orthogonal
    quantized = quantize(x, variant.spec, axis=-1, seed=ROUNDING_SEED)
    x_hat = quantized.dequantize(torch.float32)
    stats = operand_stats(x, x_hat, variant.spec, -1, ROUNDING_SEED, quantized_codes=quantized)
    histogram, zero_blocks, nan_blocks = scale_exponent_histogram(x, quantized)
    tensor_scale = None
    # one tensor scale (an outer-block spec has one per outer block: none is reported)
    if quantized.tensor_amax is not None and quantized.tensor_amax.dim() == 0:
        tensor_scale = global_encode_scale(quantized.tensor_amax, variant.spec)
    nonfinite = int((~torch.isfinite(tensor)).sum())
    return Measurement(
        **_metrics(stats, nonfinite, tensor.numel()),
        scale_exponents=histogram, zero_blocks=zero_blocks, nan_blocks=nan_blocks,
        tensor_scale=None if tensor_scale is None else float(tensor_scale),
        nonfinite=nonfinite,
    )  # fmt: skip


def _metrics(stats: Mapping[str, torch.Tensor], nonfinite: int, numel: int) -> dict[str, float]:
    """The metrics as floats; NaN where a NaN or Inf input leaves them undefined: the error
    as soon as one value is not finite, the shares when none is finite."""
    metrics = {name: float(stats[name]) for name in METRICS}
    undefined = ("rel_mse", "snr_db") if nonfinite < numel else METRICS
    if nonfinite:
        metrics.update({name: math.nan for name in undefined})
    return metrics


def scale_exponent_histogram(
    x: torch.Tensor, quantized: QuantizedTensor
) -> tuple[dict[int, int], int, int]:
    """({floor(log2 effective scale): blocks}, all-zero blocks, non-finite blocks) of
    `quantized`, the quantization of x along its last axis."""
    layout = quantized.layout
    block_amax = layout.to_blocks(layout.pad(x.to(torch.float32))).abs().amax(dim=-1)
    scales = quantized.scale_values()
    if quantized.tensor_amax is not None:  # the scale a value decodes with
        scales = decode_factors(scales, quantized.tensor_amax, quantized.spec)
    scales = scales.to(torch.float64)
    finite = torch.isfinite(scales)
    nonzero = finite & (block_amax > 0) & (scales > 0)  # a two-level scale may round to 0
    exponents, counts = torch.unique(floor_log2(scales[nonzero]), return_counts=True)
    histogram = dict(zip(exponents.tolist(), counts.tolist(), strict=True))
    return histogram, int((finite & ~nonzero).sum()), int((~finite).sum())


def inspect_tensor(named: NamedTensor, variants: Sequence[Variant], device: str) -> TensorReport:
    report = TensorReport(named.name, tuple(named.tensor.shape), named.high_precision)
    for variant in variants:
        report.measurements[variant.label] = measure(named.tensor, variant, device)
    blocks = sorted({block_size(v.spec, named.tensor.shape[-1]) for v in variants})
    for size in dict.fromkeys(v.hadamard for v in variants):
        report.outliers[transform_label(size)] = outliers(named.tensor, size, blocks, device)
    return report


def transform_label(hadamard: int | None) -> str:
    return f"rht{hadamard}" if hadamard else "none"


def block_size(spec: QuantSpec, channels: int) -> int:
    """Values per block along a last axis of `channels` values (a "row" block: all of them)."""
    return spec.block if isinstance(spec.block, int) else channels


def outliers(
    tensor: torch.Tensor, hadamard: int | None, blocks: Sequence[int], device: str = "cpu"
) -> OutlierStats | None:
    """Outlier statistics of the tensor, rotated by the Hadamard transform of size `hadamard`
    (the variants' seed) if one is given; None where that transform does not apply."""
    x = tensor.detach().to(device=device, dtype=torch.float32)
    if hadamard:
        if x.dim() == 0 or x.shape[-1] % hadamard:
            return None
        x = rht(x, -1, hadamard, HADAMARD_SEED)
    return outlier_stats(x, blocks)


def summarize(reports: Sequence[TensorReport], variants: Sequence[Variant]) -> dict[str, Summary]:
    """Per variant: metrics averaged over the tensors it applies to, weighted by element count
    (snr_db: that of the mean rel_mse, so that an exact tensor does not swamp it); histograms and
    block counts pooled."""
    return {
        v.label: _summary([(r.numel, r.measurements[v.label]) for r in reports]) for v in variants
    }


def _summary(weighted: Sequence[tuple[int, Measurement | None]]) -> Summary:
    present = [(n, m) for n, m in weighted if m is not None]
    elements = sum(n for n, _ in present)
    means = {
        name: sum(n * getattr(m, name) for n, m in present) / elements if elements else math.nan
        for name in METRICS
    }
    means["snr_db"] = -10 * math.log10(max(means["rel_mse"], TINY)) if elements else math.nan
    histogram: Counter[int] = Counter()
    for _, m in present:
        histogram.update(m.scale_exponents)
    return Summary(
        **means, scale_exponents=dict(sorted(histogram.items())),
        zero_blocks=sum(m.zero_blocks for _, m in present),
        nan_blocks=sum(m.nan_blocks for _, m in present),
        nonfinite=sum(m.nonfinite for _, m in present),
        tensors=len(present), elements=elements,
    )  # fmt: skip
