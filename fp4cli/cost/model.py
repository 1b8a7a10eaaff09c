"""The cost model: a layer's three GEMMs and the work each technique adds, against BF16.

The model prices a layer as a native low-precision implementation would run it, not as the
fake-quantizing simulation does: each quantized operand is written once as codes and scales by a
fused quantize kernel, and its GEMM reads those at the rate of its operands' formats. Per layer
of M tokens, K in_features, N out_features:

GEMM (each of the three): FLOP = 2 M N K,
    bytes = what it reads of its two operands (codes + scales, or 2 bytes an element) + its
    BF16 output (forward M x N, grad_input M x K, grad_weight N x K),
    seconds = max(FLOP / rate, bytes / bandwidth), the rate by the operands' formats: both NVFP4
    (E2M1, UE4M3 scales per 16, a tensor scale) -> nvfp4, or the NVFP4 GEMM measured on this
    GPU nearest in FLOP (`fp4cli.cost.measured`) where the store has one; both E2M1 otherwise
    -> fp4; both quantized otherwise -> fp8; either in high precision -> bf16. The scale
    formats do not change the rate (scales are applied by the tensor cores or in the epilogue;
    for UE5M3 scales and blocks other than 16 or 32 Blackwell has no native support, so there
    the figure is optimistic). Hadamard padding of the reduction dimension and the bias are
    not counted; SR's 3/4 pre-scale is undone in the epilogue at no cost.
BF16 layer: the three GEMMs with BF16 operands. ratio = seconds / bf16_seconds.
Quantizers, Hadamard transforms and stochastic rounding: see fp4cli.cost.operands.
Double quantization (function.py: Q4 reads Q2(W), Q6 reads Q1(X)): each backward operand whose
    forward operand is quantized first dequantizes it (fp4cli.cost.operands.dequantize_item);
    the backward quantizer then reads that BF16 tensor as usual.
Outliers, DGE, Q-EMA, Q-Ramping: see fp4cli.cost.techniques.
A layer with quantized=False (or a config that changes nothing) costs its BF16 time in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fp4cli.cost import operands, techniques
from fp4cli.cost.devices import DeviceProfile
from fp4cli.cost.errors import CostError
from fp4cli.cost.items import CostItem, Work
from fp4cli.cost.measured import MeasuredRates
from fp4cli.cost.shapes import OUTPUT_DIMS, LayerShape
from fp4cli.linear.operands import GEMM_OPERAND_FIELDS, GEMMS

if TYPE_CHECKING:
    from fp4cli.linear.config import LinearConfig
    from fp4cli.quant.spec import QuantSpec
    from fp4cli.recipe_schema import QRampConfig

# backward operand -> the forward operand it re-quantizes under double quantization
DOUBLE_QUANT_SOURCE = {"grad_input_w": "forward_w", "grad_weight_x": "forward_x"}


@dataclass(frozen=True)
class LayerCost:
    """One layer's itemized estimate for one training step (forward and backward)."""

    shape: LayerShape
    items: tuple[CostItem, ...]
    bf16_seconds: float

    @property
    def seconds(self) -> float:
        return sum(item.seconds for item in self.items)

    @property
    def ratio(self) -> float:
        return self.seconds / self.bf16_seconds

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape.label(),
            "seconds": self.seconds,
            "bf16_seconds": self.bf16_seconds,
            "ratio": self.ratio,
            "items": [item.to_dict() for item in self.items],
        }


@dataclass(frozen=True)
class ModelCost:
    """The layers' estimates summed: ratio = total seconds / total BF16 seconds."""

    layers: tuple[LayerCost, ...]

    @property
    def seconds(self) -> float:
        return sum(layer.seconds for layer in self.layers)

    @property
    def bf16_seconds(self) -> float:
        return sum(layer.bf16_seconds for layer in self.layers)

    @property
    def ratio(self) -> float:
        return self.seconds / self.bf16_seconds

    def to_dict(self) -> dict[str, Any]:
        totals = {"seconds": self.seconds, "bf16_seconds": self.bf16_seconds, "ratio": self.ratio}
        return {**totals, "layers": [layer.to_dict() for layer in self.layers]}


def gemm_item(
    gemm: str,
    specs: tuple[QuantSpec | None, QuantSpec | None],
    hadamard: int | None,
    shape: LayerShape,
    profile: DeviceProfile,
    measured: MeasuredRates | None = None,
) -> CostItem:
    """One GEMM at the rate of its operands' formats (a measured NVFP4 GEMM's, if any)."""
    precision = gemm_precision(specs)
    output = shape.dim(OUTPUT_DIMS[gemm][0]) * shape.dim(OUTPUT_DIMS[gemm][1])
    moved = operands.HP_BYTES * output + sum(
        operands.gemm_operand_bytes(operand, spec, hadamard, shape)
        for operand, spec in zip(GEMM_OPERAND_FIELDS[gemm], specs, strict=True)
    )
    flops = shape.gemm_flops
    rate, source = profile.gemm_flops(precision), f"model ({precision} {profile.kind(precision)})"
    found = measured.gemm(precision, flops) if measured is not None else None
    if found is not None:
        rate, source = found.tflops * 1e12, found.source
    seconds = max(flops / rate, moved / profile.bandwidth)
    return CostItem("gemm", gemm, flops, moved, seconds, source)


def gemm_precision(specs: tuple[QuantSpec | None, QuantSpec | None]) -> str:
    """nvfp4 (both NVFP4), fp4 (both E2M1 otherwise), fp8 (both quantized) or bf16."""
    if all(spec is not None and _is_nvfp4(spec) for spec in specs):
        return "nvfp4"
    precisions = {operands.element_precision(spec) for spec in specs}
    return "bf16" if "bf16" in precisions else "fp8" if "fp8" in precisions else "fp4"


def _is_nvfp4(spec: QuantSpec) -> bool:
    return (spec.element, spec.scale, spec.block, spec.tensor_scale) == ("e2m1", "ue4m3", 16, True)


def bf16_items(shape: LayerShape, profile: DeviceProfile) -> list[CostItem]:
    """The three GEMMs of the layer in BF16."""
    return [gemm_item(gemm, (None, None), None, shape, profile) for gemm in GEMMS]


def estimate_layer(
    config: LinearConfig,
    shape: LayerShape,
    profile: DeviceProfile,
    measured: MeasuredRates | None = None,
    *,
    qramp: QRampConfig | None = None,
) -> LayerCost:
    """One layer under `config` on `profile`; `measured`: quantize kernels measured on it;
    `qramp`: the recipe's Q-Ramping optimizer option, if any."""
    reference = bf16_items(shape, profile)
    bf16_seconds = sum(item.seconds for item in reference)
    if not shape.quantized or config.is_high_precision:
        return LayerCost(shape, tuple(reference), bf16_seconds)
    items: list[CostItem] = []
    for gemm in GEMMS:
        items += _gemm_items(config, gemm, shape, profile, measured)
    if config.qema is not None:
        items.append(techniques.qema_update_item(shape, profile))
    if qramp is not None and config.forward_w is not None:
        items += techniques.qramp_items(qramp, items, shape, profile)
    return LayerCost(shape, tuple(items), bf16_seconds)


def estimate_model(
    config: LinearConfig,
    shapes: Sequence[LayerShape],
    profile: DeviceProfile,
    measured: MeasuredRates | None = None,
    *,
    qramp: QRampConfig | None = None,
) -> ModelCost:
    """Every layer's estimate; the ratio is the total over the total in BF16."""
    if not shapes:
        raise CostError("shapes: name at least one layer shape")
    layers = [estimate_layer(config, shape, profile, measured, qramp=qramp) for shape in shapes]
    return ModelCost(tuple(layers))


def _gemm_items(
    config: LinearConfig,
    gemm: str,
    shape: LayerShape,
    profile: DeviceProfile,
    measured: MeasuredRates | None,
) -> list[CostItem]:
    """The operands' passes, the GEMM, and the techniques attached to it."""
    transform = config.hadamard(gemm)
    hadamard = transform.size if transform is not None else None
    items: list[CostItem] = []
    if gemm == "forward" and config.outliers is not None:
        items.append(techniques.quantile_item(config.outliers, shape, profile))
    for operand in GEMM_OPERAND_FIELDS[gemm]:
        source = DOUBLE_QUANT_SOURCE.get(operand)
        source_spec = config.spec(source) if source else None
        if config.double_quant and source is not None and source_spec is not None:
            items.append(operands.dequantize_item(operand, source, source_spec, shape, profile))
        extras = _fused_extras(config, operand, shape)
        spec = config.spec(operand)
        items += operands.operand_items(operand, spec, hadamard, shape, profile, measured, extras)
    specs = (config.spec(GEMM_OPERAND_FIELDS[gemm][0]), config.spec(GEMM_OPERAND_FIELDS[gemm][1]))
    items.append(gemm_item(gemm, specs, hadamard, shape, profile, measured))
    if gemm == "forward" and config.outliers is not None and config.outliers.compensate:
        items.append(techniques.compensation_item(config.outliers, shape, profile))
    if gemm == "grad_weight" and config.dge is not None:
        items.append(techniques.dge_item(shape, profile))
    return items


def _fused_extras(config: LinearConfig, operand: str, shape: LayerShape) -> tuple[Work, ...]:
    """Work of other techniques that rides in an operand's quantize pass."""
    if operand == "forward_w" and config.qema is not None:
        return (techniques.qema_guide_work(shape),)
    if operand == "forward_x" and config.outliers is not None:
        return (techniques.clamp_work(shape),)
    return ()
