"""Shared by the kernel tests: the device they run on, the specs they cover, and the checks.

Importing this module skips the importing test module where the kernels cannot run.
"""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec
from fp4cli.quant.backend import interpreter_on, triton_available

if not triton_available() or not (interpreter_on() or torch.cuda.is_available()):
    pytest.skip(
        "the Triton kernels run only under TRITON_INTERPRET=1 (CPU) or on a CUDA GPU, "
        "with triton installed",
        allow_module_level=True,
    )

from fp4cli.kernels.quantization.launch import Tile, dequantize_e2m1, quantize_e2m1, tensor_amax  # noqa: E402
from tests.kernel_checks import (
    assert_bits,
    assert_same_quantized,
    assert_same_up_to_zero_sign,
    check_backends_agree,
)

__all__ = [
    "Tile",
    "dequantize_e2m1",
    "quantize_e2m1",
    "tensor_amax",
    "assert_bits",
    "assert_same_quantized",
    "assert_same_up_to_zero_sign",
    "check_backends_agree",
]

# The interpreter runs CPU tensors; without it the kernels need CUDA tensors.
DEVICE = torch.device("cpu") if interpreter_on() else torch.device("cuda")
NAN, INF = float("nan"), float("inf")
FP32_MAX = torch.finfo(torch.float32).max

MXFP4 = QuantSpec.preset("mxfp4")
MXFP4_SR = QuantSpec.preset("mxfp4-sr")
MXFP4_SR_PRESCALE = QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75)
NVFP4 = QuantSpec.preset("nvfp4")
NVFP4_SR = QuantSpec.preset("nvfp4", rounding="sr")
MXFP4_AWAY = QuantSpec.preset("mxfp4", rounding="away")
NVFP4_AWAY = QuantSpec.preset("nvfp4", rounding="away")

SPECS = {
    "mxfp4": MXFP4,
    "mxfp4-ceil": QuantSpec.preset("mxfp4-ceil"),
    "mxfp4-sr": MXFP4_SR,
    "mxfp4-sr-prescale0.75": MXFP4_SR_PRESCALE,
    "nvfp4": NVFP4,
    "nvfp4-sr": NVFP4_SR,
    "mxfp4-ue5m3": QuantSpec.preset("mxfp4-ue5m3"),
    "ue4m3-ceil": QuantSpec(scale="ue4m3", scale_rule="ceil"),
    "ue5m3-ceil": QuantSpec(scale="ue5m3", scale_rule="ceil"),
    "ue5m3-ceil-ts-sr": QuantSpec(
        scale="ue5m3", scale_rule="ceil", rounding="sr", tensor_scale=True
    ),
    "mxfp4-away": MXFP4_AWAY,
    "nvfp4-away": NVFP4_AWAY,
    "ue5m3-ceil-away": QuantSpec(scale="ue5m3", scale_rule="ceil", rounding="away"),
}
# The other block sizes the kernels take (32 and 16 are above).
BLOCK_SPECS = {
    "mxfp4-block8": MXFP4.replace(block=8),
    "mxfp4-ceil-block16": QuantSpec.preset("mxfp4-ceil", block=16),
    "mxfp4-sr-block64": MXFP4_SR.replace(block=64),
    "nvfp4-block128": NVFP4.replace(block=128),
    "ue5m3-ceil-sr-block256": QuantSpec(scale="ue5m3", scale_rule="ceil", rounding="sr", block=256),
    "mxfp4-away-block8": MXFP4_AWAY.replace(block=8),
    "nvfp4-away-block64": NVFP4_AWAY.replace(block=64),
}


def on_device(values: torch.Tensor) -> torch.Tensor:
    return values.to(DEVICE)


def seeded_normal(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


def rows_over_binades(rows: int, cols: int, seed: int = 0, spread: float = 4) -> torch.Tensor:
    """Normal rows, row r scaled by 2^(spread * a normal draw): block scales over many binades,
    on the test device."""
    x = seeded_normal((rows, cols), seed) * torch.exp2(seeded_normal((rows, 1), seed + 1) * spread)
    return on_device(x)


def edge_blocks(rows: int = 40, cols: int = 100, seed: int = 0) -> torch.Tensor:
    """`rows_over_binades` (spread 6) with a zero block, a subnormal block, a huge block (with
    FLT_MAX) and NaN, Inf and -Inf in blocks of their own, in rows 1-6 (cols >= 71)."""
    x = rows_over_binades(rows, cols, seed, 6).cpu()
    x[1, :32] = 0.0
    x[2, :32] = seeded_normal((32,), seed + 2) * 1e-41
    x[3, :32] = seeded_normal((32,), seed + 3) * 1e37
    x[3, 7] = FP32_MAX
    x[4, 5], x[5, 40], x[6, 70] = NAN, INF, -INF
    return on_device(x)


# shapes and axes whose lines hold several 128-value groups, part of one, or one value
GROUP_SHAPES_AND_AXES = [((300, 5), 0), ((5, 7, 300), 1), ((3, 1100), -1), ((2, 130, 3), 1),
                         ((1, 1), 0)]  # fmt: skip


def line_cases() -> dict[str, torch.Tensor]:
    """Lines of 300-333 values, several 128-value groups each (outer blocks, MS-EDEN groups):
    `edge_blocks`' zero, subnormal, huge and NaN / Inf blocks, and ragged rows over 8 binades'
    spread."""
    return {"edge": edge_blocks(40, 300), "ragged": rows_over_binades(7, 333, seed=3, spread=8)}


def runs_at_extremes(
    cols: int, seed: int, max_cols: slice, huge: float, ragged_from: int
) -> torch.Tensor:
    """Six rows of seeded normals whose runs of 128 values (outer blocks, MS-EDEN groups) take
    extremes: all zero (row 0's first run), subnormal (row 1's second), -FLT_MAX..FLT_MAX over
    `max_cols` of row 2, 16 values `huge` times the rest (row 3), the smallest float32
    throughout (row 4), and zeros from `ragged_from` on (row 5's ragged last run)."""
    x = seeded_normal((6, cols), seed)
    x[0, :128] = 0.0
    x[1, 128:256] *= 2.0**-140
    x[2, max_cols] = torch.linspace(-1, 1, max_cols.stop - max_cols.start) * FP32_MAX
    x[3, 16:32] *= huge
    x[4, :] = 2.0**-149
    x[5, ragged_from:] = 0.0
    return on_device(x)


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """The largest finite |x| (NaN and Inf left out), as a 1-element tensor."""
    magnitude = x.abs()
    return torch.where(magnitude.isfinite(), magnitude, 0.0).amax().reshape(1)
