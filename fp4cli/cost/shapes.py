"""A linear layer's shape, and the shape and reduction dimension of each GEMM operand.

| GEMM                      | operands                     | blocked along (the reduction) |
| forward     Y = X W^T     | forward_x, forward_w         | in_features  (K)              |
| grad_input  dX = dY W     | grad_input_dy, grad_input_w  | out_features (N)              |
| grad_weight dW = dY^T X   | grad_weight_dy, grad_weight_x| tokens       (M)              |
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fp4cli.cost.errors import CostError

# operand -> (the dimension it is blocked along, the other dimension)
OPERAND_DIMS = {
    "forward_x": ("in", "tokens"),
    "forward_w": ("in", "out"),
    "grad_input_dy": ("out", "tokens"),
    "grad_input_w": ("out", "in"),
    "grad_weight_dy": ("tokens", "out"),
    "grad_weight_x": ("tokens", "in"),
}
# GEMM -> its output's dimensions
OUTPUT_DIMS = {
    "forward": ("tokens", "out"),
    "grad_input": ("tokens", "in"),
    "grad_weight": ("out", "in"),
}
_SHAPE = re.compile(r"(\d+)x(\d+)x(\d+)(:bf16)?")
DIM_MAX = 2**30  # a dimension of a shape given by hand; beyond it no layer exists


@dataclass(frozen=True)
class LayerShape:
    """A linear layer on `tokens` rows per step: GEMM M = tokens, K = in_features,
    N = out_features. quantized=False: the layer stays in BF16 (a recipe's skipped layer)."""

    tokens: int
    in_features: int
    out_features: int
    quantized: bool = True

    def __post_init__(self) -> None:
        for name in ("tokens", "in_features", "out_features"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CostError(f"{name}: must be a positive integer (got {value!r})")

    def dim(self, name: str) -> int:
        """tokens, in or out."""
        return {"tokens": self.tokens, "in": self.in_features, "out": self.out_features}[name]

    @property
    def gemm_flops(self) -> int:
        """FLOP of one of the layer's three GEMMs: 2 M N K."""
        return 2 * self.tokens * self.in_features * self.out_features

    def label(self) -> str:
        text = f"{self.tokens}x{self.in_features}x{self.out_features}"
        return text if self.quantized else text + ":bf16"


def parse_shape(text: str) -> LayerShape:
    """TOKENSxINxOUT, e.g. 8192x4096x4096; a ':bf16' suffix keeps the layer in BF16."""
    match = _SHAPE.fullmatch(text.strip().lower())
    numbers = [int(group) for group in match.groups()[:3]] if match else []
    if match is None or min(numbers) < 1:
        raise CostError(
            f"bad shape {text!r}: expected TOKENSxINxOUT with positive integers, e.g. "
            "8192x4096x4096 (':bf16' appended keeps the layer in BF16)"
        )
    if max(numbers) > DIM_MAX:
        raise CostError(
            f"shape {text.strip()!r}: each dimension must be at most 2^30 = {DIM_MAX:,} "
            f"(got {max(numbers):,})"
        )
    tokens, in_features, out_features = numbers
    return LayerShape(tokens, in_features, out_features, quantized=match.group(4) is None)
