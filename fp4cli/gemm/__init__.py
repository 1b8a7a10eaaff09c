"""The MXFP4 GEMM: `mxfp4_matmul(a, b)` computes a.dequantize() @ b.dequantize().T from two
quantized tensors blocked along K (or a float `a` against a quantized `b`), on the kernels the
device has; `matmul_reference` is its definition."""

from fp4cli.gemm.matmul import GEMM_MODES, gemm_path, mxfp4_matmul
from fp4cli.gemm.operands import GemmError
from fp4cli.gemm.reference import matmul_reference

__all__ = ["GEMM_MODES", "GemmError", "gemm_path", "matmul_reference", "mxfp4_matmul"]
