"""The calls a quantization benchmark times: one kernel on one backend, with no arguments.

Backends: "triton" (the fused kernels), "torch" (the reference) and "compile" (the reference
under torch.compile; quantize and fake-quantize only). Stochastic rounding uses a fixed seed and
the Hadamard signs their default one, so every backend computes the same bits. Every call goes
through the public API (`fp4cli.quant.quantize`, `fake_quantize`, `QuantizedTensor.dequantize`),
so its time includes the Python dispatch, which for a small tensor can outweigh the kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp4cli.bench.configs import BenchConfig
from fp4cli.bench.traffic import PAIR_AMAX_KERNEL, PAIR_DIRECTION_AMAX_KERNELS
from fp4cli.quant import fake_quantize, quantize

SEED = 0


def kernel_call(
    kernel: str, backend: str, x: torch.Tensor, config: BenchConfig, axis: int
) -> Callable[[], object]:
    """A no-argument call running `kernel` on x with `backend`."""
    if kernel == "copy":
        destination = torch.empty_like(x)
        return lambda: destination.copy_(x)
    if backend == "compile":
        compiled = torch.compile(_reference_function(kernel, config, axis))
        return lambda: compiled(x)
    spec, hadamard = config.spec, config.hadamard
    if kernel in ("tensor-amax", "quantize-given-amax"):
        return _two_level_pass(kernel, x, config, axis)
    if kernel == "quantize-pair":
        return _pair(x, config)
    if kernel in (PAIR_AMAX_KERNEL, *PAIR_DIRECTION_AMAX_KERNELS):
        return _pair_amax(x, config, kernel)
    if kernel.startswith("pair-"):
        return _pair_direction(x, config, kernel)
    if kernel == "quantize":
        return lambda: quantize(x, spec, axis, SEED, hadamard=hadamard, backend=backend)
    if kernel == "fake-quantize":
        return lambda: fake_quantize(
            x, spec, axis, SEED, hadamard=hadamard, out_dtype=x.dtype, backend=backend
        )
    quantized = quantize(x, spec, axis, SEED, hadamard=hadamard, backend=backend)
    return lambda: quantized.dequantize(x.dtype, backend=backend)


def _two_level_pass(
    kernel: str, x: torch.Tensor, config: BenchConfig, axis: int
) -> Callable[[], object]:
    """One of a two-level spec's two kernel passes (the Triton backend only)."""
    from fp4cli.kernels.quantization.launch import quantize_e2m1, tensor_amax

    axis = axis % x.dim()  # the launchers take a non-negative axis
    amax = tensor_amax(x, axis, config.hadamard, 0)
    if kernel == "tensor-amax":
        return lambda: tensor_amax(x, axis, config.hadamard, 0)
    return lambda: quantize_e2m1(x, config.spec, axis, SEED, config.hadamard, 0, t_amax=amax[0])


def _pair(x: torch.Tensor, config: BenchConfig) -> Callable[[], object]:
    """x (2-D) quantized to packed codes along its rows and down its columns in one launch (a
    two-level spec's amax pass first), or one launch a direction where `pair_tile` refuses the
    pair (wide directions both ways), as the quantized Linear quantizes its operands (the Triton
    backend only)."""
    from fp4cli.kernels.quantization.launch_pair import Direction, pair_tile, quantize_pair

    direction = Direction(config.spec, SEED, config.hadamard, SEED)
    if pair_tile(direction, direction) is None:
        return lambda: (quantize_pair(x, direction, None), quantize_pair(x, None, direction))
    return lambda: quantize_pair(x, direction, direction)


def _pair_amax(x: torch.Tensor, config: BenchConfig, kernel: str) -> Callable[[], object]:
    """A two-level spec's amax pass alone, as `quantize-pair` (pair-amax) or a lone direction
    (pair-rows-amax, pair-cols-amax) runs it: each direction's tensor amax from one read, and
    the encode tables (the Triton backend only). Where the pair takes a launch a direction, so
    does its amax."""
    from fp4cli.kernels.quantization.launch_pair import Direction, pair_amax_pass, pair_tile

    direction = Direction(config.spec, SEED, config.hadamard, SEED)
    row = direction if kernel != "pair-cols-amax" else None
    col = direction if kernel != "pair-rows-amax" else None
    tile = pair_tile(row, col)
    if tile is None:  # wide both ways: a pass a direction, each on its own tile
        rows_tile, cols_tile = pair_tile(row, None), pair_tile(None, col)
        assert rows_tile is not None and cols_tile is not None
        return lambda: (
            pair_amax_pass(x, row, None, rows_tile),
            pair_amax_pass(x, None, col, cols_tile),
        )
    return lambda: pair_amax_pass(x, row, col, tile)


def _pair_direction(x: torch.Tensor, config: BenchConfig, kernel: str) -> Callable[[], object]:
    """One direction of x's pair alone (`PAIR_DIRECTION_KERNELS`): along its rows or down its
    columns, to packed codes or to values in x's dtype, as the quantized Linear quantizes a
    direction that takes a launch of its own (a two-level spec's amax pass first)."""
    from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair

    values = x.dtype if kernel.endswith("-values") else None
    direction = Direction(config.spec, SEED, config.hadamard, SEED, values)
    if kernel.startswith("pair-rows"):
        return lambda: quantize_pair(x, direction, None)
    return lambda: quantize_pair(x, None, direction)


def _reference_function(
    kernel: str, config: BenchConfig, axis: int
) -> Callable[[torch.Tensor], object]:
    """The reference `kernel` as a function of x, for torch.compile."""
    spec, hadamard = config.spec, config.hadamard

    def reference_codes(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        quantized = quantize(x, spec, axis, SEED, hadamard=hadamard, backend="torch")
        amax = quantized.tensor_amax
        return (quantized.codes, quantized.scales, *(() if amax is None else (amax,)))

    def reference_values(x: torch.Tensor) -> torch.Tensor:
        return fake_quantize(
            x, spec, axis, SEED, hadamard=hadamard, out_dtype=x.dtype, backend="torch"
        )

    return reference_codes if kernel == "quantize" else reference_values
