"""The tensor-amax passes of two-level pairs at GPT-2-small's and larger shapes, each timed from
a CUDA graph of 20 calls beside a device copy (x the copy's bandwidth, the input's bytes
counted once). A diagnosis script; `fp4 bench quantize` is the benchmark.

    python benchmarks/amax_probe.py
"""

from __future__ import annotations

import functools

import torch
from step_probe import graph_us

from fp4cli.kernels.quantization.launch_amax import pair_amax
from fp4cli.kernels.quantization.launch_pair import Direction
from fp4cli.quant import QuantSpec

NVFP4 = QuantSpec.preset("nvfp4")
UE5M3_SR = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")


def cases(seed: torch.Tensor) -> dict:
    """nvfp4's X and dY (plain rows, RHT-16 down the columns), its 2-D W without transforms,
    and ue5m3-hadamard-sr's operands (RHT-32 both ways)."""
    return {
        "nvfp4 plain + RHT-16 cols": lambda x: pair_amax(
            x, Direction(NVFP4), Direction(NVFP4, None, 16, (seed, 9)), (64, 64)
        ),
        "nvfp4 plain both ways": lambda x: pair_amax(
            x, Direction(NVFP4), Direction(NVFP4), (32, 64)
        ),
        "ue5m3 RHT-32 both ways": lambda x: pair_amax(
            x, Direction(UE5M3_SR, 3, 32, 5), Direction(UE5M3_SR, 4, 32, 6), (32, 64)
        ),
    }


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("error: amax_probe.py times CUDA kernels and needs a GPU")
    print(torch.cuda.get_device_name(), torch.__version__)
    seed = torch.tensor(7, device="cuda")
    generator = torch.Generator("cuda").manual_seed(0)
    print(f"{'tensor':<12}{'pass':<28}{'us':>8}{'x copy':>8}")
    for rows, cols in ((8192, 768), (8192, 3072), (8192, 8192)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16, generator=generator)
        copy = graph_us(x.clone)
        for name, fn in cases(seed).items():
            us = graph_us(functools.partial(fn, x))
            print(f"{rows}x{cols:<7}{name:<28}{us:>8.1f}{copy / 2 / us:>8.2f}", flush=True)


if __name__ == "__main__":
    main()
