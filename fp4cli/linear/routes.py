"""How the quantized Linear multiplies each GEMM's operands (`LinearConfig.gemm`).

`gemm_route(config, gemm)`:

- None (every GEMM with `gemm: dequantized`, and any GEMM the others do not take): torch's GEMM
  on the dequantized operands in the compute dtype, as `nn.Linear` (cuBLAS on a GPU);
- "mxfp4": both operands packed, through `mxfp4_matmul` in the config's mode (exact or fast):
  E2M1 operands with E8M0 scales that its kernels take (`spec_pair_gap`); the fast executor
  only, as exact mode is the reference's product up to float32 summation order;
- "block": two two-level operands (NVFP4: E2M1 with UE4M3 scales per 16 values or 16 x 16
  tiles and a tensor scale; also UE5M3 scales, E1M2 elements, other blocks:
  `block_scaled_gap`): their block values q * s multiplied exactly, summed in float32, the
  tensor scales applied once (`block_product`, `fp4cli.gemm.nvfp4.block_scaled_mm`), which is
  how Blackwell's block-scaled MMA computes NVFP4; both executors, so it is the layer's
  definition;
- "fp8" (`gemm: fast` only): two FP8 operands (E4M3 / E5M2, one power-of-two scale per tensor,
  not both E5M2) multiplied as codes on the FP8 tensor cores (`fp4cli.gemm.fp8.fp8_mm`), their
  sums as the tensor cores add; the vector-wise executor only (Wang et al.'s backward GEMMs).
  With `gemm: exact` these GEMMs multiply the values, which BF16 holds exactly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from fp4cli.gemm.fp8 import FP8_DTYPES, fp8_pair_gap
from fp4cli.gemm.nvfp4 import block_scaled_gap, block_scaled_mm
from fp4cli.gemm.operands import spec_pair_gap
from fp4cli.gemm.reference import block_scaled_factor
from fp4cli.linear.operands import GEMM_OPERAND_FIELDS
from fp4cli.quant.spec import QuantSpec

if TYPE_CHECKING:
    from fp4cli.linear.config import LinearConfig


def gemm_gap(config: LinearConfig, gemm: str) -> str | None:
    """Why `gemm` multiplies dequantized values with torch's GEMM, or None when `gemm_route`
    sends it elsewhere."""
    if config.gemm == "dequantized":
        return "gemm: dequantized"
    if config.out_control is not None and gemm != "grad_input":
        return "OutControl (FP8 values on some channels)"
    names = GEMM_OPERAND_FIELDS[gemm]
    a, b = config.spec(names[0]), config.spec(names[1])
    if a is None or b is None:
        return f"{names[0] if a is None else names[1]} in high precision"
    route = _candidate(a, b)
    if route == "fp8":
        gap = _fp8_gap(a, b, names, config.gemm)
    elif route == "mxfp4":
        return spec_pair_gap(a, b, names)
    else:
        gap = block_scaled_gap(names[0], a) or block_scaled_gap(names[1], b)
    if gap is None and gemm == "forward" and config.double_quant:
        return "double quantization (it re-quantizes the forward operands' values)"
    if gap is None and gemm == "forward" and config.outliers is not None:
        return "outlier clamping (its residual is added to the forward operand's values)"
    return gap


def _candidate(a: QuantSpec, b: QuantSpec) -> str:
    """The one route two operand specs could take: "fp8" (both FP8 elements), "mxfp4" (no
    tensor scale) or "block"; `gemm_gap` says whether they do."""
    if a.element in FP8_DTYPES and b.element in FP8_DTYPES:
        return "fp8"
    return "block" if a.tensor_scale or b.tensor_scale else "mxfp4"


def _fp8_gap(a: QuantSpec, b: QuantSpec, names: tuple[str, str], mode: str) -> str | None:
    if mode != "fast":
        return "FP8 operands: their values' product is exact (the FP8 tensor cores: gemm fast)"
    return fp8_pair_gap(a, b, names)


def gemm_route(config: LinearConfig, gemm: str) -> str | None:
    """How `gemm` is multiplied (see the module): "mxfp4", "block" (for `gemm: exact` and
    `fast` alike), "fp8" or None."""
    if gemm_gap(config, gemm) is not None:
        return None
    a, b = (config.spec(name) for name in GEMM_OPERAND_FIELDS[gemm])
    assert a is not None and b is not None
    return _candidate(a, b)


def block_product(
    a: torch.Tensor,
    b: torch.Tensor,
    amaxes: tuple[torch.Tensor, torch.Tensor],
    config: LinearConfig,
    gemm: str,
    dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gemm`'s block-scaled product of block values a @ b (`block_scaled_mm`), plus the bias
    before the rounding."""
    names = GEMM_OPERAND_FIELDS[gemm]
    a_spec, b_spec = config.spec(names[0]), config.spec(names[1])
    assert a_spec is not None and b_spec is not None
    return block_scaled_mm(a, b, amaxes, block_scaled_factor(a_spec, b_spec), dtype, bias)
