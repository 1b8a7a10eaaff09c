"""The GEMM shapes `fp4 bench gemm` measures and the implementations it compares (on MXFP4
operands, or on NVFP4 operands for the `nvfp4` ones).

A shape is (M, N, K): C (M, N) = A (M, K) @ B (N, K)^T. Named sets: cubes, and the linear layers
of a GPT-2-small and a Llama-7B block with M = 8192 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from fp4cli.bench.configs import BenchError
from fp4cli.bench.parsing import parse_choices, split_list


@dataclass(frozen=True)
class GemmShape:
    m: int
    n: int
    k: int
    name: str = ""

    @property
    def text(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"

    @property
    def flop(self) -> int:
        return 2 * self.m * self.n * self.k


TOKENS = 8192
SHAPE_SETS: dict[str, tuple[GemmShape, ...]] = {
    "square": tuple(GemmShape(s, s, s, f"square {s}") for s in (4096, 8192, 16384)),
    "gpt2-small": (
        GemmShape(TOKENS, 2304, 768, "gpt2 qkv"),
        GemmShape(TOKENS, 768, 768, "gpt2 attn-out"),
        GemmShape(TOKENS, 3072, 768, "gpt2 mlp-up"),
        GemmShape(TOKENS, 768, 3072, "gpt2 mlp-down"),
    ),
    "llama-7b": (
        GemmShape(TOKENS, 12288, 4096, "llama qkv"),
        GemmShape(TOKENS, 4096, 4096, "llama attn-out"),
        GemmShape(TOKENS, 11008, 4096, "llama gate/up"),
        GemmShape(TOKENS, 4096, 11008, "llama down"),
    ),
}
DEFAULT_SHAPES = "square,gpt2-small,llama-7b"

# name: what it runs
IMPLS: dict[str, str] = {
    "cublas-bf16": "cuBLAS bf16 GEMM of the dequantized operands (exact in bf16)",
    "cublas-fp8": "cuBLAS FP8 E4M3 GEMM (torch._scaled_mm, per-tensor scales) of the same",
    "dot-scaled": "Triton tl.dot_scaled e2m1 x e2m1 (bf16 emulation on Hopper)",
    "exact": "fp4cli.mxfp4_matmul(mode='exact')",
    "fast": "fp4cli.mxfp4_matmul(mode='fast')",
    "exact-fp8": "exact on FP8 tensor cores only (no INT8 tier)",
    "fast-fp8": "fast on the FP8 kernel (not cuBLAS)",
    "exact-fused": "exact FP8, E2M1 decoded in registers (no staged copy)",
    "fast-fused": "fast FP8, E2M1 decoded in registers (no staged copy)",
    "nvfp4": "fp4cli.gemm.nvfp4_matmul(impl='fused') on NVFP4 operands: decoded in registers",
    "nvfp4-decoded": "nvfp4_matmul(impl='decoded'): bf16 q*s once, cuBLASLt, alpha in its epilogue",
}
# implementations that multiply NVFP4 operands (the others MXFP4), and their nvfp4_matmul impl
NVFP4_IMPLS = {"nvfp4": "fused", "nvfp4-decoded": "decoded"}
DEFAULT_IMPLS = "cublas-bf16,cublas-fp8,dot-scaled,exact,fast"
BASELINE = "cublas-bf16"


def parse_gemm_shapes(text: str) -> list[GemmShape]:
    """Named sets and MxNxK shapes, comma-separated, in order."""
    shapes: list[GemmShape] = []
    for item in split_list(text):
        if item in SHAPE_SETS:
            shapes += SHAPE_SETS[item]
            continue
        dims = item.lower().split("x")
        if len(dims) != 3 or not all(d.isdigit() and int(d) > 0 for d in dims):
            raise BenchError(
                f"shape {item!r}: expected MxNxK (positive integers) or one of "
                f"{', '.join(SHAPE_SETS)}"
            )
        m, n, k = (int(d) for d in dims)
        shapes.append(GemmShape(m, n, k))
    if not shapes:
        raise BenchError(f"shapes: give at least one MxNxK or {', '.join(SHAPE_SETS)}")
    return shapes


def parse_impls(text: str) -> list[str]:
    return parse_choices("impls", text, tuple(IMPLS))
