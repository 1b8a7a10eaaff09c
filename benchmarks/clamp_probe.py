"""What Wang et al.'s per-token outlier clamp costs: the clamped per-row FP4 quantization of the
vector-wise executor (its X operand) against the same quantization without the clamp, each
timed from a CUDA graph of 20 calls, on normal bf16 rows, on rows with outlier channels
(every 97th channel 40 times larger, which widens the threshold search most) and on rows with
eight adjacent outlier channels (more than two beyond a threshold in one group of candidates:
every row is searched again over all its keys, the slowest case), with the values
checked bit for bit against the reference (`clamp_outliers`, then `fake_quantize`). A diagnosis
script; `fp4 bench step` is the benchmark.

    python benchmarks/clamp_probe.py [--rows 8192] [--widths 768,3072,11008] [--quantile 0.99]
"""

from __future__ import annotations

import argparse

import torch
from step_probe import graph_us

from fp4cli.kernels.vector.launch import Clamp, quantize_vector
from fp4cli.quant import QuantSpec, fake_quantize
from fp4cli.techniques.outliers import OutlierConfig, clamp_outliers, nearest_ranks

SPEC = QuantSpec.preset("fp4-row")


def rows_of(pattern: str, rows: int, cols: int) -> torch.Tensor:
    """bf16 rows, seeded by their width: normal values, or with outlier channels spread out or
    side by side."""
    generator = torch.Generator(device="cuda").manual_seed(cols)
    x = torch.randn(rows, cols, generator=generator, device="cuda").to(torch.bfloat16)
    if pattern == "outliers":
        x[:, ::97] *= 40
    if pattern == "adjacent":
        x[:, 8:16] *= 40
    return x


def unlike_the_reference(x: torch.Tensor, clamped: torch.Tensor, quantile: float) -> int:
    """How many values the fused clamp writes unlike the reference (a zero's sign aside)."""
    expected, _ = clamp_outliers(x, OutlierConfig(quantile, compensate=False))
    expected = fake_quantize(expected, SPEC, axis=1, backend="torch")
    return int(
        ((clamped != expected) & (clamped.view(torch.int16) != expected.view(torch.int16))).sum()
    )


def times(x: torch.Tensor, clamp: Clamp) -> tuple[float, float]:
    """Microseconds per call of the quantization of x with and without the clamp."""
    with_clamp = graph_us(lambda: quantize_vector(x, SPEC, 1, torch.bfloat16, clamp=clamp))
    return with_clamp, graph_us(lambda: quantize_vector(x, SPEC, 1, torch.bfloat16))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--widths", default="768,3072,11008")
    parser.add_argument("--quantile", type=float, default=0.99)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: clamp_probe.py times CUDA kernels and needs a GPU")
    print(torch.cuda.get_device_name(), torch.__version__)
    print(f"{'tensor':<14}{'values':<10}{'clamp us':>10}{'no clamp us':>13}{'unlike ref':>12}")
    for cols in (int(width) for width in args.widths.split(",")):
        clamp = Clamp(*nearest_ranks(cols, args.quantile))
        for pattern in ("normal", "outliers", "adjacent"):
            x = rows_of(pattern, args.rows, cols)
            clamped, _ = quantize_vector(x, SPEC, 1, torch.bfloat16, clamp=clamp)
            wrong = unlike_the_reference(x, clamped, args.quantile)
            with_clamp, without = times(x, clamp)
            shape = f"{args.rows}x{cols}"
            print(f"{shape:<14}{pattern:<10}{with_clamp:>10.1f}{without:>13.1f}{wrong:>12}")


if __name__ == "__main__":
    main()
