"""On a CUDA GPU: the compiled NVFP4 GEMM (bfloat16 decode, tensor cores) against its
definition, `nvfp4_matmul_reference`.

Exact operands (tests/kernels/test_gemm_nvfp4.py builds and checks them) bit for bit with
bfloat16 and float32 outputs, in every autotuned tile and both implementations; the extreme,
zero, subnormal and NaN scales; a large random product within float32 summation error; and the
benchmark's NVFP4 rows. `make gpu-test` runs them; nothing here asserts on a time.
"""

from __future__ import annotations

import pytest
import torch

from fp4cli.gemm import nvfp4_alpha, nvfp4_matmul, nvfp4_matmul_reference
from fp4cli.gemm.reference import block_scaled_values
from fp4cli.quant import QuantSpec, quantize
from tests.kernel_checks import COMPILED_ON_GPU
from tests.kernels.test_gemm_nvfp4 import (
    SHAPES,
    assert_exact_sums,
    assert_matches,
    edge_operands,
    random_operand,
)

pytestmark = COMPILED_ON_GPU
IMPLS = ("fused", "decoded")
NVFP4 = QuantSpec.preset("nvfp4")


def run(a, b, impl: str, out_dtype: torch.dtype = torch.bfloat16, **kwargs) -> torch.Tensor:
    return nvfp4_matmul(a, b, out_dtype, backend="triton", impl=impl, **kwargs)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32, torch.float16])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_exact_operands_bit_for_bit(shape, impl: str, out_dtype: torch.dtype) -> None:
    m, n, k = shape
    a = random_operand(m, k, seed=sum(shape), device="cuda")
    b = random_operand(n, k, seed=k + 1, device="cuda")
    assert_exact_sums(a, b)
    assert_matches(run(a, b, impl, out_dtype), nvfp4_matmul_reference(a, b, out_dtype))


def test_every_fused_tile_bit_for_bit() -> None:
    from fp4cli.kernels.gemm import nvfp4_launch as launch

    a = random_operand(300, 256, seed=1, device="cuda")  # ragged M, N against every tile
    b = random_operand(270, 256, seed=2, device="cuda")
    assert_exact_sums(a, b)
    expected = nvfp4_matmul_reference(a, b, torch.float32)
    factor = 2688.0 * 2688.0
    for tile in launch.FUSED_TILES:
        out = torch.full((300, 270), float("nan"), device="cuda")
        launch.fused_matmul(launch.operand(a), launch.operand(b), factor, out, tile=tile)
        assert_matches(out, expected, str(tile))


@pytest.mark.parametrize("impl", IMPLS)
def test_extreme_zero_subnormal_and_nan_scales(impl: str) -> None:
    a, b = edge_operands("cuda")
    for out_dtype in (torch.float32, torch.bfloat16):
        assert_matches(run(a, b, impl, out_dtype), nvfp4_matmul_reference(a, b, out_dtype))


@pytest.mark.parametrize("impl", IMPLS)
def test_amax_zero_gives_zero(impl: str) -> None:
    a = quantize(torch.zeros(256, 512, device="cuda"), NVFP4)
    b = random_operand(128, 512, seed=3, device="cuda")
    assert (run(a, b, impl) == 0).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_large_random_within_float32_summation_error(impl: str) -> None:
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2048, 4096, generator=generator, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(1536, 4096, generator=generator, device="cuda", dtype=torch.bfloat16)
    a, b = quantize(x, NVFP4), quantize(w, NVFP4)
    alpha = float(nvfp4_alpha(a, b))
    va, vb = block_scaled_values(a), block_scaled_values(b)
    exact = alpha * (va @ vb.T)
    bound = alpha * 4097 * 2.0**-24 * (va.abs() @ vb.abs().T) + 2.0**-23 * exact.abs()
    assert ((run(a, b, impl, torch.float32).double() - exact).abs() <= bound).all()
    # bf16 output: the float32 result rounded once more
    rounded = run(a, b, impl).double()
    assert ((rounded - exact).abs() <= bound + 2.0**-8 * exact.abs()).all()


@pytest.mark.parametrize("impl", IMPLS)
def test_repeated_runs_identical_and_out_fully_written(impl: str) -> None:
    a = random_operand(513, 1024, seed=4, device="cuda", scale_codes=(0x30, 0x7E))
    b = random_operand(385, 1024, seed=5, device="cuda", scale_codes=(0x30, 0x7E))
    first = run(a, b, impl)
    out = torch.full_like(first, float("nan"))
    assert run(a, b, impl, out=out) is out
    assert_matches(out, first)


def test_bench_rows_of_both_implementations() -> None:
    from fp4cli.bench.gemm import run_gemm_bench
    from fp4cli.bench.gemm_cases import GemmShape

    impls = ["cublas-bf16", "nvfp4", "nvfp4-decoded"]
    rows = run_gemm_bench([GemmShape(1024, 768, 512)], impls, torch.device("cuda"), rep_ms=5)
    assert [row.impl for row in rows] == impls
    for row in rows:
        assert row.note is None and row.ms is not None and row.format == "nvfp4"
        assert row.rel_error is not None and row.rel_error < 2**-8
    for row in rows[1:]:  # the float32 result rounded to bf16: little beyond that rounding
        assert row.beyond_rounding is not None and row.beyond_rounding < 2**-12
