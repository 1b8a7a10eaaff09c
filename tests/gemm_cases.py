"""Operands for the MXFP4 GEMM tests (tests/quant/test_gemm.py on the CPU interpreter,
tests/gpu/test_gpu_gemm.py on a GPU).

`exact_sum_pair` makes operands whose every float32 partial sum is exact (K <= 256, each row's
blocks within a few binades): any summation order then gives the reference's bits, so kernels
are compared with atol=0. `spread_rows` moves chosen rows' blocks apart by so many binades,
which sends their tiles to a given tier of the exact GEMM.
"""

from __future__ import annotations

import torch

from fp4cli.quant import QuantizedTensor, QuantSpec, quantize

MXFP4 = QuantSpec.preset("mxfp4")


def quantized(
    shape: tuple[int, ...], seed: int, device: str | torch.device, spec: QuantSpec = MXFP4
) -> QuantizedTensor:
    """A standard normal tensor quantized along its last axis by the reference."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(device)
    return quantize(x, spec, axis=-1, backend="torch")


def exact_sum_pair(
    m: int, n: int, k: int, seed: int, device: str | torch.device, spec: QuantSpec = MXFP4
) -> tuple[QuantizedTensor, QuantizedTensor]:
    assert k <= 256, "beyond K = 256 float32 partial sums may round"
    return quantized((m, k), seed, device, spec), quantized((n, k), seed + 1, device, spec)


def spread_rows(q: QuantizedTensor, rows: list[int], binades: int) -> QuantizedTensor:
    """q with the blocks of each row in `rows` set to one scale, 2^-7, and their first block's
    raised by `binades`: those rows span exactly that many binades."""
    scales = q.scales.clone()
    scales[rows] = 120
    scales[rows, 0] = 120 + binades
    return with_fields(q, scales=scales)


def zero_block(q: QuantizedTensor, block: int, rows: slice | list[int] = slice(None)):
    """q with one block (all its rows, or `rows`) of zero codes."""
    codes = q.codes.clone()
    width = int(q.spec.block) // 2
    codes[rows, block * width : (block + 1) * width] = 0
    return with_fields(q, codes=codes)


def nan_block(q: QuantizedTensor, row: int, block: int) -> QuantizedTensor:
    scales = q.scales.clone()
    scales[row, block] = 255
    return with_fields(q, scales=scales)


def with_fields(q: QuantizedTensor, **changes: torch.Tensor) -> QuantizedTensor:
    fields = dict(
        codes=q.codes,
        scales=q.scales,
        tensor_amax=q.tensor_amax,
        shape=q.shape,
        spec=q.spec,
        axis=q.axis,
        dtype=q.dtype,
        layout=q.layout,
    )
    return QuantizedTensor(**{**fields, **changes})


def flushed_bound(a: QuantizedTensor, b: QuantizedTensor, fold_range: int) -> torch.Tensor:
    """(M, N) upper bound of what flushing changes: the sum over K of |a||b| over the products
    where a's or b's block lies more than `fold_range` binades below its row's largest scale."""
    a_values, b_values = a.dequantize(torch.float64), b.dequantize(torch.float64)
    a_far = _far(a, fold_range)
    b_far = _far(b, fold_range)
    a_abs, b_abs = a_values.abs(), b_values.abs()
    near_a, near_b = a_abs * ~a_far, b_abs * ~b_far
    return a_abs @ b_abs.T - near_a @ near_b.T


def _far(q: QuantizedTensor, fold_range: int) -> torch.Tensor:
    codes = q.scales.to(torch.int32)
    far = (codes.amax(dim=-1, keepdim=True) - codes) > fold_range
    return far.repeat_interleave(int(q.spec.block), dim=-1)[..., : q.shape[-1]]
