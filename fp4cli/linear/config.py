"""LinearConfig: one quantizer per GEMM operand of a linear layer, and the techniques around them.

| GEMM                     | operands                     | blocked along  |
| forward     Y = X W^T    | forward_x, forward_w         | in_features    |
| grad_input  dX = dY W    | grad_input_dy, grad_input_w  | out_features   |
| grad_weight dW = dY^T X  | grad_weight_dy, grad_weight_x| tokens         |

An operand whose spec is None stays in high precision.

`gemm` says how the fast executor multiplies a GEMM whose two operands `mxfp4_matmul` takes
(`fp4cli.gemm.operands.spec_pair_gap`): "dequantized" (the default) hands torch's GEMM the
operands' values in the compute dtype; "exact" and "fast" hand `mxfp4_matmul` the packed
operands in that mode. Every other GEMM, and every GEMM of the reference executor, multiplies
the values (which is "exact" up to float32 summation order).

`bias_gradient` says what the bias's gradient sums over the tokens: "dy" (the default) dY
itself; "quantized" the grad_input GEMM's dY operand, the values it multiplies (TetraJet's
released code sums its quantized Q3(dY)).

`out_control` keeps the input channels of largest activation norm in FP8 (TetraJet-v2's
OutControl, `fp4cli.techniques.out_control`); the reference executor alone runs it.

`trust` masks the gradients of the forward operands X and W where their values lay beyond the
grid (QuEST's trust estimator, `fp4cli.techniques.trust`); the reference executor alone runs
it. With a forward Hadamard transform the mask acts in the transform's basis. Double
quantization after a forward Hadamard transform re-quantizes the transformed forward operands:
the backward GEMMs then give the gradients in that basis, taken back to X's and W's own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from fp4cli.linear.operands import GEMMS, OPERANDS
from fp4cli.quant.spec import QuantSpec, SpecError
from fp4cli.techniques import (
    DGEConfig,
    HadamardConfig,
    OutControlConfig,
    OutlierConfig,
    QEMAConfig,
)
from fp4cli.techniques.trust import TrustConfig

GEMM_CHOICES = ("dequantized", "exact", "fast")
BIAS_GRADIENTS = ("dy", "quantized")


@dataclass(frozen=True)
class LinearConfig:
    forward_x: QuantSpec | None = None
    forward_w: QuantSpec | None = None
    grad_input_dy: QuantSpec | None = None
    grad_input_w: QuantSpec | None = None
    grad_weight_dy: QuantSpec | None = None
    grad_weight_x: QuantSpec | None = None
    forward_hadamard: HadamardConfig | None = None
    grad_input_hadamard: HadamardConfig | None = None
    grad_weight_hadamard: HadamardConfig | None = None
    double_quant: bool = False
    dge: DGEConfig | None = None
    outliers: OutlierConfig | None = None
    qema: QEMAConfig | None = None
    gemm: str = "dequantized"
    bias_gradient: str = "dy"
    out_control: OutControlConfig | None = None
    trust: TrustConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gemm, str) or self.gemm not in GEMM_CHOICES:
            choices = ", ".join(GEMM_CHOICES)
            raise SpecError(f"gemm: must be one of {choices} (got {self.gemm!r})")
        if not isinstance(self.bias_gradient, str) or self.bias_gradient not in BIAS_GRADIENTS:
            choices = ", ".join(BIAS_GRADIENTS)
            raise SpecError(f"bias_gradient: must be one of {choices} (got {self.bias_gradient!r})")
        if self.bias_gradient == "quantized" and (
            self.grad_input_dy is None or self.grad_input_hadamard is not None
        ):
            raise SpecError(
                "bias_gradient: quantized sums grad_input's quantized dY: it needs "
                "grad_input.dy quantized, without a Hadamard transform (whose values are rotated)"
            )
        if not isinstance(self.double_quant, bool):
            raise SpecError("double_quant: must be true or false")
        if self.dge is not None and self.forward_w is None:
            raise SpecError("dge: needs a quantized forward weight (forward.w)")
        if self.dge is not None and self.forward_hadamard is not None:
            raise SpecError("dge: cannot be combined with a forward Hadamard transform")
        if self.qema is not None and self.forward_w is None:
            raise SpecError("qema: needs a quantized forward weight (forward.w)")
        if self.outliers is not None and self.forward_x is None:
            raise SpecError("outliers: needs a quantized forward activation (forward.x)")
        compensated = self.outliers is not None and self.outliers.compensate
        if compensated and self.forward_hadamard is not None:
            raise SpecError(
                "outliers.compensate: cannot be combined with a forward Hadamard transform "
                "(the residual would be added in the rotated basis)"
            )
        self._check_out_control()
        self._check_trust()
        for name in OPERANDS:
            spec = getattr(self, name)
            if spec is not None and spec.tile2d and name.endswith(("_x", "_dy")):
                raise SpecError(f"{name}.tile2d: 2-D tiles are for weights only")

    def _check_out_control(self) -> None:
        if self.out_control is None:
            return
        if self.forward_x is None:
            raise SpecError("out_control: needs a quantized forward activation (forward.x)")
        others = {
            "dge": "DGE (its derivative is of the unsplit weight quantizer)",
            "outliers": "outlier clamping (both choose what to do with X's outliers)",
            "forward_hadamard": "a forward Hadamard transform (it mixes the channels)",
        }
        self._refuse_beside("out_control", others)

    def _check_trust(self) -> None:
        if self.trust is None:
            return
        if self.forward_x is None and self.forward_w is None:
            raise SpecError("trust: needs a quantized forward operand (forward.x or forward.w)")
        others = {
            "dge": "DGE (both replace the weight quantizer's gradient)",
            "outliers": "outlier clamping",
            "out_control": "OutControl",
        }
        self._refuse_beside("trust", others)

    def _refuse_beside(self, technique: str, others: dict[str, str]) -> None:
        """SpecError naming the first of `others` (field: what it is) this config also sets."""
        for name, what in others.items():
            if getattr(self, name) is not None:
                raise SpecError(f"{technique}: cannot be combined with {what}")

    def spec(self, operand: str) -> QuantSpec | None:
        return getattr(self, operand)

    @property
    def routes(self) -> dict[str, str | None]:
        """Each GEMM's `fp4cli.linear.routes.gemm_route`, worked out once, on first use (a
        QuantLinear's construction: the executors ask on every call, and torch.compile then
        reads a plain attribute). Not a field: no repr, eq or to_dict; reading recipes imports
        no torch."""
        routes: dict[str, str | None] | None = self.__dict__.get("_routes")
        if routes is None:
            from fp4cli.linear.routes import gemm_route

            routes = {gemm: gemm_route(self, gemm) for gemm in GEMMS}
            object.__setattr__(self, "_routes", routes)
        return routes

    def hadamard(self, gemm: str) -> HadamardConfig | None:
        return getattr(self, f"{gemm}_hadamard")

    @property
    def is_high_precision(self) -> bool:
        """True when nothing is quantized and no technique changes the layer."""
        choices = ("gemm", "bias_gradient")  # how it computes, not what is quantized
        fields = (f.name for f in dataclasses.fields(self) if f.name not in choices)
        return all(getattr(self, name) in (None, False) for name in fields)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        """A compact one-line description for extra_repr."""
        parts = []
        for name in OPERANDS:
            spec = self.spec(name)
            parts.append(f"{name}={spec.short() if spec else 'hp'}")
        for gemm in GEMMS:
            h = self.hadamard(gemm)
            if h is not None:
                parts.append(f"{gemm}_{h.kind}={h.size}")
        if self.double_quant:
            parts.append("double_quant")
        if self.gemm != "dequantized":
            parts.append(f"gemm={self.gemm}")
        if self.bias_gradient != "dy":
            parts.append(f"bias_gradient={self.bias_gradient}")
        for name in ("dge", "outliers", "qema", "out_control", "trust"):
            cfg = getattr(self, name)
            if cfg is not None:
                values = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)}
                fields = ",".join(f"{k}={_short(v)}" for k, v in values.items())
                parts.append(f"{name}({fields})")
        return ", ".join(parts)


def _short(value: Any) -> Any:
    """A technique's field for `summary`: a quantizer (OutControl's format) by its short form."""
    return value.short() if isinstance(value, QuantSpec) else value
