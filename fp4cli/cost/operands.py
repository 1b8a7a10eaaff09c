"""The work of quantizing one GEMM operand: its sizes, and the passes that produce it.

Sizes (n: the operand's elements; along: its blocked dimension, padded to a multiple of the
Hadamard size when the GEMM has one, and to a multiple of the block):
    codes  = padded elements x element bits / 8      (4-bit: 2 per byte; FP8: 1 byte)
    scales = scale count x scale bytes (+ 4 for an FP32 tensor scale)
             scale count: along / block x across (block x block tiles: x across / block);
             "row": one per vector along the axis (across); "column": along; "tensor": one
             scale bytes: 1 for E8M0, UE5M3 and UE4M3 codes, 4 for FP32, 2 for BF16

The quantize pass reads the BF16 operand once and writes codes and scales:
    bytes = 2 n + codes + scales,   ops = 10 per element
(abs, block max, multiply by the reciprocal scale, four to round on the float32 bits, clamp,
encode and pack; the per-block scale computation is folded into the 10). Fused into it, with no
bytes of their own:
    Hadamard transform of size h: log2(h) add/sub per element (the butterfly: each of log2(h)
        stages turns a pair (a, b) into (a + b, a - b)); the sign flips and the 1/sqrt(h) factor
        fold into the load and the block scale.
    stochastic rounding: one Philox4x32-10 call per 4 elements (per 16 at `sr_bits` 8, per 8 at
        16), 100 ops a call (10 rounds of two 32x32-bit multiplies, each two ops for its high
        and low halves, four xors and two key additions), plus 2 ops per element to turn the
        word into noise and add it.
    four-over-six: the block quantized a second time (scaled to 4), both candidates decoded and
        their exact integer errors formed in float64 and int64 (48 FP32-op equivalents per
        element, `CANDIDATE_ERROR_OPS`): 10 + 48 ops per element.
A spec with a tensor scale (or block "tensor" or "column") first needs the tensor's amax (or
its columns'): one more pass,
    bytes = 2 n, ops = 2 per element (+ log2(h) when the amax is of the transformed tensor).
A "row" scale is computed in the quantize pass (the vector is assumed to fit on chip).
An operand left in high precision under a Hadamard GEMM is transformed in a pass of its own:
    bytes = 2 n read + 2 n' written (n': padded), ops = log2(h) per element.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fp4cli.cost.devices import DeviceProfile
from fp4cli.cost.items import CostItem, Work, fused_items, pass_item, pass_seconds
from fp4cli.cost.measured import MeasuredRate, MeasuredRates, spec_key
from fp4cli.cost.shapes import OPERAND_DIMS, LayerShape
from fp4cli.quant.blocking import BlockLayout, transformed_length

if TYPE_CHECKING:
    from fp4cli.quant.spec import QuantSpec

HP_BYTES = 2  # a high-precision (BF16) element
QUANTIZE_OPS = 10  # per element
AMAX_OPS = 2  # abs, max
# four-over-six's errors, per element in FP32-op equivalents of the kernels' float64 and int64
# work (conversions at a quarter of the FP32 rate, float64 and int64 arithmetic at half): x
# widened once (4); per candidate the decode and the finiteness test (3), the widening (4), the
# difference, scaling, square and cap (4 x 2), the truncation to int64 (4) and a select (1);
# the int64 difference and sum (4)
CANDIDATE_ERROR_OPS = 4 + 2 * (3 + 4 + 4 * 2 + 4 + 1) + 4
EDEN_OPS = 4  # MS-EDEN: two products summed per element (the per-block scale draw is negligible)
DEQUANTIZE_OPS = 3  # unpack, decode, multiply by the scale
PHILOX_OPS_PER_CALL = 100
ELEMENTS_PER_PHILOX_CALL = 4
SR_NOISE_OPS = 2  # word to uniform, add to the fraction
IN_MEASURED = "in measured quantize"


@dataclass(frozen=True)
class OperandSize:
    """along: the blocked dimension (padded to the Hadamard size); across: the other one;
    elements: the high-precision operand's element count (unpadded)."""

    along: int
    across: int
    elements: int

    @property
    def transformed_elements(self) -> int:
        return self.along * self.across


def operand_size(operand: str, shape: LayerShape, hadamard: int | None = None) -> OperandSize:
    along_dim, across_dim = OPERAND_DIMS[operand]
    along, across = shape.dim(along_dim), shape.dim(across_dim)
    padded = transformed_length(along, hadamard)
    return OperandSize(padded, across, along * across)


def layout(spec: QuantSpec, size: OperandSize) -> BlockLayout:
    """The quantizer's block layout of the operand (blocked dimension last)."""
    return BlockLayout.for_tensor((size.across, size.along), spec)


def code_elements(spec: QuantSpec, size: OperandSize) -> int:
    """Elements the codes hold: the operand padded to whole blocks (tiles)."""
    return math.prod(layout(spec, size).padded_shape)


def quantized_bytes(spec: QuantSpec, size: OperandSize) -> int:
    """Codes plus scales (plus the tensor scale)."""
    return sum(layout(spec, size).stored_bytes(spec))


def quantize_bytes(spec: QuantSpec, size: OperandSize) -> int:
    """The quantize pass's traffic: the BF16 operand read, codes and scales written (the count
    `fp4 bench quantize` divides by its time)."""
    return HP_BYTES * size.elements + quantized_bytes(spec, size)


def hadamard_ops(size: OperandSize, hadamard: int) -> int:
    return size.transformed_elements * int(math.log2(hadamard))


def philox_ops(elements: int, sr_bits: int = 24) -> int:
    """Stochastic rounding's work: a Philox call per 4 elements at 24 bits a value, per
    128 / sr_bits at 8 or 16, and the noise's ops per element."""
    per_call = ELEMENTS_PER_PHILOX_CALL if sr_bits == 24 else 128 // sr_bits
    calls = -(-elements // per_call)
    return calls * PHILOX_OPS_PER_CALL + elements * SR_NOISE_OPS


def needs_amax_pass(spec: QuantSpec) -> bool:
    """Whether the quantizer needs the whole tensor's amax first (an outer block's is local)."""
    return spec.whole_tensor_scale or spec.block in ("tensor", "column")


def quantize_parts(spec: QuantSpec, size: OperandSize, hadamard: int | None) -> list[Work]:
    """The fused quantize pass: quantize, then its Hadamard transform and stochastic rounding."""
    elements = code_elements(spec, size)
    parts = [Work("quantize", QUANTIZE_OPS * elements, quantize_bytes(spec, size))]
    if hadamard:
        parts.append(Work("hadamard", hadamard_ops(size, hadamard)))
    if spec.rounding == "sr":
        parts.append(Work("stochastic rounding", philox_ops(elements, spec.sr_bits)))
    if spec.four_over_six:
        parts.append(Work("four-over-six", (QUANTIZE_OPS + CANDIDATE_ERROR_OPS) * elements))
    if spec.rounding == "eden":
        parts.append(Work("ms-eden correction", EDEN_OPS * elements))
    return parts


def amax_work(size: OperandSize, hadamard: int | None) -> Work:
    transform = hadamard_ops(size, hadamard) if hadamard else 0
    return Work("tensor amax", AMAX_OPS * size.transformed_elements + transform, 2 * size.elements)


def operand_items(
    operand: str,
    spec: QuantSpec | None,
    hadamard: int | None,
    shape: LayerShape,
    profile: DeviceProfile,
    measured: MeasuredRates | None = None,
    extras: tuple[Work, ...] = (),
) -> list[CostItem]:
    """The passes that turn the BF16 operand into what its GEMM reads. `extras`: work of other
    techniques fused into the quantize pass (Q-EMA's guide, the outlier clamp)."""
    size = operand_size(operand, shape, hadamard)
    if spec is None:
        if not hadamard:
            return []
        moved = HP_BYTES * (size.elements + size.transformed_elements)
        return [
            pass_item(
                "hadamard", operand, Work("hadamard", hadamard_ops(size, hadamard), moved), profile
            )
        ]
    amax = [amax_work(size, hadamard)] if needs_amax_pass(spec) else []
    parts = quantize_parts(spec, size, hadamard)
    rate = measured.lookup(spec_key(spec, hadamard), size.elements) if measured else None
    if rate is not None:
        return _measured_items(operand, [*amax, *parts], extras, rate, profile)
    separate = [pass_item(work.technique, operand, work, profile) for work in amax]
    return separate + fused_items(operand, [*parts, *extras], profile)


def _measured_items(
    operand: str, covered: list[Work], extras: tuple[Work, ...], rate: MeasuredRate,
    profile: DeviceProfile,
) -> list[CostItem]:  # fmt: skip
    """The measured kernel's time on the quantize item (its call includes the amax pass, the
    transform and the rounding); fused extras are added as passes of their own."""
    items = [CostItem(w.technique, operand, w.ops, w.bytes, 0.0, IN_MEASURED) for w in covered]
    index = next(i for i, item in enumerate(items) if item.technique == "quantize")
    seconds = covered[index].bytes / (rate.gbps * 1e9)
    items[index] = dataclasses.replace(items[index], seconds=seconds, source=rate.source)
    for work in extras:
        seconds = pass_seconds(work.bytes, work.ops, profile)
        items.append(CostItem(work.technique, operand, work.ops, work.bytes, seconds))
    return items


def dequantize_item(
    operand: str, source: str, spec: QuantSpec, shape: LayerShape, profile: DeviceProfile
) -> CostItem:
    """Double quantization: the backward `operand` re-quantizes the dequantized forward operand
    `source`, so the forward codes and scales are read back and written out in BF16:
    bytes = codes + scales + 2 n, ops = 3 per element."""
    size = operand_size(source, shape)
    moved = quantized_bytes(spec, size) + HP_BYTES * size.elements
    work = Work("double quant", DEQUANTIZE_OPS * code_elements(spec, size), moved)
    return pass_item("double quant", operand, work, profile)


def gemm_operand_bytes(
    operand: str, spec: QuantSpec | None, hadamard: int | None, shape: LayerShape
) -> int:
    """What the GEMM reads of an operand: codes and scales, or the BF16 tensor."""
    size = operand_size(operand, shape, hadamard)
    return quantized_bytes(spec, size) if spec else HP_BYTES * size.transformed_elements


def element_precision(spec: QuantSpec | None) -> str:
    """The tensor-core format an operand feeds: fp4 (E2M1), fp8 (E4M3, E5M2, and E3M0 or INT4,
    decoded exactly to E4M3) or bf16 (high precision)."""
    if spec is None:
        return "bf16"
    return "fp4" if spec.element == "e2m1" else "fp8"
