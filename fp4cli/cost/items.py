"""Cost items: one piece of a layer step's work, with its FLOP or ops, bytes and time.

An elementwise pass (quantize, dequantize, a transform, an update) is memory- or issue-bound:

    seconds = max(bytes / bandwidth, ops / op rate)

Work fused into one pass (a quantizer with its Hadamard transform and stochastic rounding) moves
its bytes once: its parts are itemized by how much each adds to the pass's time, in order, so the
items of one pass sum to the pass's time, and a part hidden under the memory traffic costs 0 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from fp4cli.cost.devices import DeviceProfile

MODEL = "model"


@dataclass(frozen=True)
class CostItem:
    """technique: gemm, quantize, tensor amax, hadamard, stochastic rounding, double quant,
    outliers, dge, qema, qramp. target: the GEMM (forward, grad_input, grad_weight), the operand
    (forward_x, ..., grad_weight_x) or the weight. flops: tensor-core FLOP for a GEMM,
    elementwise ops for a pass. bytes: read plus written. source: "model" (and the GEMM rate's
    kind), or the measurement the time comes from."""

    technique: str
    target: str
    flops: float
    bytes: float
    seconds: float
    source: str = MODEL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Work:
    """One part of an elementwise pass: its ops and the bytes it adds to the pass."""

    technique: str
    ops: float
    bytes: float = 0.0


def pass_seconds(moved: float, ops: float, profile: DeviceProfile) -> float:
    """An elementwise pass's time: bound by memory traffic or by instruction issue."""
    return max(moved / profile.bandwidth, ops / profile.vector_ops)


def pass_item(technique: str, target: str, work: Work, profile: DeviceProfile) -> CostItem:
    """A pass of its own."""
    seconds = pass_seconds(work.bytes, work.ops, profile)
    return CostItem(technique, target, work.ops, work.bytes, seconds)


def fused_items(target: str, parts: Sequence[Work], profile: DeviceProfile) -> list[CostItem]:
    """One fused pass, one item per part: each part's seconds are what it adds to the pass."""
    items: list[CostItem] = []
    ops = moved = before = 0.0
    for part in parts:
        ops, moved = ops + part.ops, moved + part.bytes
        now = pass_seconds(moved, ops, profile)
        items.append(CostItem(part.technique, target, part.ops, part.bytes, now - before))
        before = now
    return items
