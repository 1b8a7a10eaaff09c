"""Benchmarks: kernels measured side by side in one process, each measurement a store row.

`run_quantize_bench` times the quantization kernels (Triton, the PyTorch reference and the
reference under torch.compile) against the device's copy bandwidth; `fp4 bench quantize` is its
command line. `run_gemm_bench` times MXFP4 GEMMs (cuBLAS bf16 and FP8, Triton's tl.dot_scaled,
fp4cli's exact and fast) against cuBLAS bf16, with their error against float64; `fp4 bench gemm`.
"""

from fp4cli.bench.configs import CONFIGS, BenchConfig, BenchError
from fp4cli.bench.gemm import GemmRow, run_gemm_bench
from fp4cli.bench.gemm_cases import GemmShape
from fp4cli.bench.quantize import BenchRow, Case, run_quantize_bench

__all__ = [
    "CONFIGS",
    "BenchConfig",
    "BenchError",
    "BenchRow",
    "Case",
    "GemmRow",
    "GemmShape",
    "run_gemm_bench",
    "run_quantize_bench",
]
