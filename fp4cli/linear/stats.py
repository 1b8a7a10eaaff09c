"""Quantization error statistics of one GEMM operand (recorded on the steps a trainer asks for).

rel_mse: ||Q(x) - x||^2 / ||x||^2; snr_db: -10 log10(rel_mse); clipped: the share of values
beyond the element grid's largest value after scaling (they saturate); flushed: the share of
non-zero values that quantize to zero. Non-finite values are left out. Values are 0-d tensors,
so collecting them does not synchronize with the GPU.
"""

from __future__ import annotations

import torch

from fp4cli.quant import QuantizedTensor, QuantSpec, quantize
from fp4cli.quant.random_bits import Seed

METRICS = ("rel_mse", "snr_db", "clipped", "flushed")


def operand_stats(
    source: torch.Tensor,
    quantized: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    seed: Seed,
    backend: str = "auto",
    quantized_codes: QuantizedTensor | None = None,
) -> dict[str, torch.Tensor]:
    """The statistics of `quantized`, the fake quantization of `source`. `quantized_codes`:
    the QuantizedTensor of `source` when the caller has it (else it is quantized again to read
    its grid units)."""
    x = source.detach().to(torch.float32)
    q = quantized.detach().to(torch.float32)
    finite = torch.isfinite(x)
    x, q = torch.where(finite, x, 0.0), torch.where(finite, q, 0.0)
    signal = x.square().sum()
    error = (q - x).square().sum()
    tiny = torch.finfo(torch.float32).tiny
    rel_mse = error / signal.clamp_min(tiny)
    if quantized_codes is None:
        quantized_codes = quantize(x, spec, axis=axis, seed=seed, backend=backend)
    units = quantized_codes.grid_units(x)
    nonzero = x != 0
    return {
        "rel_mse": rel_mse,
        "snr_db": -10 * torch.log10(rel_mse.clamp_min(tiny)),
        "clipped": (units.abs() > spec.element_format.max_value).float().mean(),
        "flushed": (nonzero & (q == 0)).sum() / nonzero.sum().clamp_min(1),
    }
