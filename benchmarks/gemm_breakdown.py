"""Where an MXFP4 GEMM's time goes, on one CUDA GPU: each launch of fp4cli's exact and fast
paths timed alone (GPU time by do_bench; CPU time per call from a loop without waiting), the
INT8 and FP8 GEMM kernels alone against cuBLAS bf16, FP8 and INT8, and the compiler's register
report of each GEMM kernel.

    python benchmarks/gemm_breakdown.py [--shapes 8192x8192x8192,4096x4096x4096,8192x768x768]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from triton.testing import do_bench

from fp4cli.gemm import mxfp4_matmul
from fp4cli.gemm.operands import kernel_operand
from fp4cli.kernels.gemm import launch as gemm_launch
from fp4cli.kernels.gemm.fp8 import mxfp4_fp8_gemm_kernel
from fp4cli.kernels.gemm.int8 import mxfp4_int8_gemm_kernel
from fp4cli.kernels.gemm.split import k_split
from fp4cli.quant import QuantSpec, quantize


def cpu_us(call: Callable[[], object], calls: int = 30) -> float:
    """CPU time per call, not waiting for the GPU (what a launch costs the host)."""
    call()
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(calls):
        call()
    elapsed = time.perf_counter() - began
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def report(name: str, call: Callable[[], object], flop: int) -> None:
    gpu_ms = do_bench(call, return_mode="median")
    print(f"  {name:34s} {gpu_ms * 1e3:9.1f} us {flop / gpu_ms / 1e9:8.0f} TF/s"
          f"   CPU {cpu_us(call):6.1f} us/call")  # fmt: skip


def breakdown(m: int, n: int, k: int) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    spec = QuantSpec.preset("mxfp4")
    x = torch.randn(m, k, generator=generator, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=generator, device="cuda", dtype=torch.bfloat16)
    a, b = quantize(x, spec), quantize(w, spec)
    a_op, b_op = kernel_operand(a), kernel_operand(b)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    split = k_split(a_op.scales, b_op.scales, a_op.block)
    prepared = gemm_launch.prepare(a_op, b_op, int8=True, e5m2=True, tier_flags=True, split=split)
    flop = 2 * m * n * k
    print(f"{m}x{n}x{k}")
    a_bf16, b_bf16 = a.dequantize(torch.bfloat16), b.dequantize(torch.bfloat16)
    report("cuBLAS bf16", lambda: torch.matmul(a_bf16, b_bf16.T, out=out), flop)
    a8, b8 = a_bf16.to(torch.float8_e4m3fn), b_bf16.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    fp8 = lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16)  # noqa: E731
    report("cuBLAS fp8 (tensor-wise)", fp8, flop)
    ai, bi = prepared.int8
    report("cuBLAS int8 (torch._int_mm)", lambda: torch._int_mm(ai, bi.T), flop)
    report("fp4cli exact (end to end)", lambda: mxfp4_matmul(a, b, mode="exact", out=out), flop)
    report("fp4cli fast (end to end)", lambda: mxfp4_matmul(a, b, mode="fast", out=out), flop)
    report("  K split (outlier windows)", lambda: k_split(a_op.scales, b_op.scales, 32), flop)
    report(
        "  prepare: INT8 + E5M2",
        lambda: gemm_launch.prepare(a_op, b_op, True, True, tier_flags=True, split=split),
        flop,
    )
    report("  prepare: E4M3", lambda: gemm_launch.prepare(a_op, b_op, e4m3=True), flop)
    report("  INT8 kernel", lambda: gemm_launch.launch_int8(a_op, b_op, prepared, out), flop)
    int8 = gemm_launch.INT8_TILE
    report("  FP8 kernel, no wide tile (exits)",
           lambda: gemm_launch.launch_fp8(a_op, b_op, prepared, out, True, int8), flop)  # fmt: skip
    report("  FP8 kernel, exact, every tile",
           lambda: gemm_launch.launch_fp8(a_op, b_op, prepared, out, True), flop)  # fmt: skip
    report("  FP8 kernel, fast, every tile",
           lambda: gemm_launch.launch_fp8(a_op, b_op, prepared, out, False), flop)  # fmt: skip


def register_report() -> None:
    """Registers and spills of every GEMM kernel variant compiled so far (the constexprs, in
    the kernel's argument order, end each cache key)."""
    print("compiled GEMM kernels: registers per thread, spilled registers, cache key's end")
    for kernel in (mxfp4_int8_gemm_kernel, mxfp4_fp8_gemm_kernel):
        for cache in kernel.device_caches.values():
            for key, compiled in cache[0].items():
                print(f"  {kernel.__name__}: {compiled.n_regs} regs, {compiled.n_spills} spills"
                      f" | {str(key)[-150:]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="8192x8192x8192,4096x4096x4096,8192x768x768")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    for shape in args.shapes.split(","):
        breakdown(*map(int, shape.split("x")))
    try:
        register_report()
    except (AttributeError, KeyError, TypeError) as error:  # the cache's layout is Triton's own
        print(f"no register report from this Triton version ({type(error).__name__}: {error})")


if __name__ == "__main__":
    main()
