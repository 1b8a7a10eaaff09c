"""The FP4 GEMMs. `mxfp4_matmul(a, b)` computes a.dequantize() @ b.dequantize().T from two
quantized tensors blocked along K (or a float `a` against a quantized `b`), on the kernels the
device has; `matmul_reference` is its definition. `nvfp4_matmul(a, b)` is the NVFP4 GEMM as
Blackwell computes it (block-scaled products, the tensor scales applied in the epilogue);
`nvfp4_matmul_reference` is its definition."""

from fp4cli.gemm.matmul import GEMM_MODES, gemm_path, mxfp4_matmul
from fp4cli.gemm.nvfp4 import NVFP4_IMPLS, nvfp4_matmul, nvfp4_path
from fp4cli.gemm.operands import GemmError
from fp4cli.gemm.reference import matmul_reference, nvfp4_alpha, nvfp4_matmul_reference

__all__ = [
    "GEMM_MODES",
    "NVFP4_IMPLS",
    "GemmError",
    "gemm_path",
    "matmul_reference",
    "mxfp4_matmul",
    "nvfp4_alpha",
    "nvfp4_matmul",
    "nvfp4_matmul_reference",
    "nvfp4_path",
]
