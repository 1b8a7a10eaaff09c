"""Python side of the NVFP4 GEMM kernels: operands, tiles and launches.

Both launchers compute out = out_dtype(fl32(alpha * sum_k (q_a s_a)(q_b s_b))) into `out`
(`fp4cli.gemm.nvfp4` states the contract) and return it:

- `fused_matmul`: one launch of `nvfp4_fused_kernel`, decoding in registers. On a GPU its tile
  is autotuned per (M, N, K) over `FUSED_TILES` (the first call of a shape measures them);
  under the interpreter it runs `INTERPRETER_TILE`.
- `decoded_matmul`: both operands decoded to bfloat16 (`nvfp4_decode_kernel`), then cuBLASLt's
  bf16 GEMM reading alpha from the GPU and applying it (and a bias) in its epilogue
  (`gemm.cublaslt`); where that cannot run (another layout, a problem of a few rows), cuBLAS's
  bf16 GEMM with a float32 output
  (`torch.mm(..., out_dtype=torch.float32)`) and the alpha epilogue (`nvfp4_alpha_kernel`).
  Under the interpreter the operands decode to float32 and the GEMM is a float32 `torch.mm`.

The decode type is bfloat16 on a GPU and float32 under the interpreter (whose bfloat16 rounds
wrongly); both are exact. The launchers run eagerly under torch.compile.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
import triton

from fp4cli.kernels.gemm.cublaslt import alpha_matmul
from fp4cli.kernels.gemm.launch import GemmTile, PackedRows
from fp4cli.kernels.gemm.nvfp4 import nvfp4_fused_kernel
from fp4cli.kernels.gemm.nvfp4_decoded import (
    nvfp4_alpha_kernel,
    nvfp4_alpha_scalar_kernel,
    nvfp4_decode_kernel,
)
from fp4cli.kernels.host.launch import launch
from fp4cli.quant import QuantizedTensor
from fp4cli.quant.backend import interpreter_on
from fp4cli.replay import host_step

# Hopper: wide tiles amortize the decode (each A tile is decoded N / BN times, each B tile
# M / BM times); BK is at least 128 (each of the 8 dots of a K step takes BK / 8). Compiled
# for sm_90, 128 x 256 holds at 255 registers with 128-136 bytes spilled, 128 x 128 at 169
# with none; the autotuner picks among them per shape.
FUSED_TILES = (
    GemmTile(128, 256, 128, 8, 3),
    GemmTile(128, 256, 128, 8, 4),
    GemmTile(128, 256, 256, 8, 2),
    GemmTile(128, 128, 128, 8, 3),
)
INTERPRETER_TILE = GemmTile(32, 32, 128, 4, 1, 4)
DECODE_ROWS, DECODE_BYTES, DECODE_WARPS = 8, 128, 4
ALPHA_BM, ALPHA_BN, ALPHA_WARPS = 32, 128, 4


@dataclass(frozen=True)
class NvOperand(PackedRows):
    """One NVFP4 operand blocked along K: packed codes, (rows, K_padded / 16) E4M3 scale
    codes, and the tensor amax (1,) float32, all contiguous."""

    scales: torch.Tensor
    amax: torch.Tensor


def operand(q: QuantizedTensor) -> NvOperand:
    """The kernels' view of a checked NVFP4 tensor (`fp4cli.gemm.nvfp4.check_nvfp4_inputs`)."""
    assert q.tensor_amax is not None
    codes = q.codes.reshape(-1, q.codes.shape[-1]).contiguous()
    scales = q.scales.reshape(-1, q.scales.shape[-1]).contiguous()
    amax = q.tensor_amax.to(torch.float32).reshape(1).contiguous()
    return NvOperand(codes, scales, amax)


def decode_type() -> str:
    """The dot's input type: float32 under the interpreter, bfloat16 on a GPU."""
    return "fp32" if interpreter_on() else "bf16"


@cache
def _tuned_kernel() -> Any:
    """The fused kernel autotuned over FUSED_TILES (built once, on first use on a GPU)."""
    configs = [
        triton.Config(
            {"BM": t.bm, "BN": t.bn, "BK": t.bk, "GROUP_M": t.group_m},
            num_warps=t.warps,
            num_stages=t.stages,
        )  # fmt: skip
        for t in FUSED_TILES
    ]
    even_k = triton.heuristics({"EVEN_K": lambda args: args["k_padded"] % args["BK"] == 0})
    return triton.autotune(configs, key=["M", "N", "k_padded"])(even_k(nvfp4_fused_kernel))


@host_step(graphable=True)
def _autotuned_launch(grid: Any, args: tuple[Any, ...]) -> None:
    """The autotuned fused kernel's launch: one step of a recording (`fp4cli.replay`),
    replayed through the autotuner, which keeps the configuration it chose for the shapes (so
    a CUDA graph of the program may hold it)."""
    _tuned_kernel()[grid](*args, DECODE=decode_type())


@torch.compiler.disable
def fused_matmul(
    a: NvOperand, b: NvOperand, factor: float, out: torch.Tensor, tile: GemmTile | None = None
) -> torch.Tensor:
    """One launch of the fused kernel; `tile` fixes the tile (None: autotuned on a GPU)."""
    m, n, k_padded = a.rows, b.rows, a.k_padded
    # codes as int32 words of 8 (K_padded is a multiple of 16); row strides passed apart so
    # that the compiler sees their divisibility
    words_a, words_b = a.codes.view(torch.int32), b.codes.view(torch.int32)
    args = (words_a, a.scales, a.amax, words_b, b.scales, b.amax, factor, out, m, n, k_padded,
            k_padded // 8, k_padded // 16, out.stride(0), out.stride(1))  # fmt: skip
    if tile is None and not interpreter_on():

        def grid(meta: dict[str, Any]) -> tuple[int]:
            return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

        _autotuned_launch(grid, args)
        return out
    tile = tile or INTERPRETER_TILE
    launch(
        nvfp4_fused_kernel, (triton.cdiv(m, tile.bm) * triton.cdiv(n, tile.bn),), args,
        dict(BM=tile.bm, BN=tile.bn, BK=tile.bk, GROUP_M=tile.group_m,
             EVEN_K=k_padded % tile.bk == 0, DECODE=decode_type()),
        num_warps=tile.warps, num_stages=tile.stages,
    )  # fmt: skip
    return out


@torch.compiler.disable
def decode_values(q: NvOperand) -> torch.Tensor:
    """(rows, K_padded) q * s of every element (NaN in NaN blocks): bfloat16 on a GPU, float32
    under the interpreter."""
    dtype = torch.float32 if interpreter_on() else torch.bfloat16
    values = torch.empty(q.rows, q.k_padded, dtype=dtype, device=q.codes.device)
    grid = (triton.cdiv(q.rows, DECODE_ROWS), triton.cdiv(q.k_padded // 2, DECODE_BYTES))
    launch(
        nvfp4_decode_kernel, grid, (q.codes, q.scales, values, q.rows, q.k_padded),
        dict(ROWS=DECODE_ROWS, BYTES=DECODE_BYTES), num_warps=DECODE_WARPS,
    )  # fmt: skip
    return values


@torch.compiler.disable
def decoded_matmul(a: NvOperand, b: NvOperand, factor: float, out: torch.Tensor) -> torch.Tensor:
    """Decode both operands, multiply them with a float32 result, apply alpha into `out`."""
    a_values, b_values = decode_values(a), decode_values(b)
    return block_values_matmul(a_values, b_values, (a.amax, b.amax), factor, out)


@torch.compiler.disable
def block_values_matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    amaxes: tuple[torch.Tensor, torch.Tensor],
    factor: float,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """out = out_dtype(fl32(alpha * a @ b^T) (+ bias, in float32)) for block values a (M, K)
    and b (N, K) (any strides torch.mm takes; bfloat16 or float32), the two tensor amaxes
    (float32, one element each) and an optional (N,) bias: cuBLASLt with alpha in its epilogue
    (`alpha_matmul`) where it takes the problem, else torch.mm with a float32 result and one
    launch of the alpha epilogue."""
    from fp4cli.kernels.host.launch import launches_skipped

    if launches_skipped():  # a custom op's fake implementation: the output's layout only
        return out
    if a.dtype != torch.float32 and a.is_cuda:
        alpha = torch.empty(1, dtype=torch.float32, device=out.device)
        launch(
            nvfp4_alpha_scalar_kernel, (1,), (amaxes[0], amaxes[1], factor, alpha), {}, num_warps=4
        )
        if alpha_matmul(a, b, alpha, out, bias):
            return out
    product = _float32_product(a, b, out)
    m, n = out.shape
    launch(
        nvfp4_alpha_kernel, (triton.cdiv(m, ALPHA_BM), triton.cdiv(n, ALPHA_BN)),
        (product, amaxes[0], amaxes[1], factor, out, out if bias is None else bias.contiguous(),
         m, n, out.stride(0), out.stride(1)),
        dict(BM=ALPHA_BM, BN=ALPHA_BN, HAS_BIAS=bias is not None), num_warps=ALPHA_WARPS,
    )  # fmt: skip
    return out


def _float32_product(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """(M, N) float32 a @ b^T, contiguous: written into `out` when it is a contiguous float32
    tensor (the epilogue then scales it in place)."""
    target = out if out.dtype == torch.float32 and out.is_contiguous() else None
    if a.dtype == torch.float32:  # the interpreter's operands: IEEE float32 products
        return torch.mm(a, b.T, out=target)
    return torch.mm(a, b.T, out_dtype=torch.float32, out=target)
