"""Benchmarks: kernels measured side by side in one process, each measurement a store row.

`run_quantize_bench` times the quantization kernels (Triton, the PyTorch reference and the
reference under torch.compile) against the device's copy bandwidth; `fp4 bench quantize` is its
command line.
"""

from fp4cli.bench.configs import CONFIGS, BenchConfig, BenchError
from fp4cli.bench.quantize import BenchRow, Case, run_quantize_bench

__all__ = ["CONFIGS", "BenchConfig", "BenchError", "BenchRow", "Case", "run_quantize_bench"]
