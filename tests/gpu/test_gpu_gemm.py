"""On a CUDA GPU: the compiled MXFP4 GEMM kernels against the float64 reference.

Large products (8192^3) within float32 accumulation error (exact) or the stated bound (fast);
poisoned outputs fully overwritten; repeated runs identical; every tier of the exact GEMM; bf16
outputs and operands, which the interpreter cannot check. `make gpu-test` runs them.
"""

from __future__ import annotations

import pytest
import torch

from fp4cli.gemm import gemm_path, matmul_reference, mxfp4_matmul
from fp4cli.quant import QuantSpec, quantize
from tests.gemm_cases import exact_sum_pair, flushed_bound, nan_block, spread_rows, zero_block
from tests.kernel_checks import COMPILED_ON_GPU, assert_bits

pytestmark = COMPILED_ON_GPU
MXFP4 = QuantSpec.preset("mxfp4")
FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


def normal_pair(m: int, n: int, k: int, seed: int = 0):
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, k, generator=generator, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, generator=generator, device="cuda", dtype=torch.bfloat16)
    return quantize(x, MXFP4), quantize(w, MXFP4)


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    return ((actual.double() - reference).norm() / reference.norm()).item()


def float32_bound(a, b) -> torch.Tensor:
    """Elementwise bound on float32 summation error: K u sum |a||b| (u = 2^-24), plus the
    output's rounding."""
    magnitude = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().T
    return (a.shape[-1] + 1) * 2.0**-24 * magnitude


def assert_matches(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert_bits(torch.where(actual == 0, 0.0, actual), torch.where(expected == 0, 0.0, expected))


@pytest.fixture(scope="module")
def large():
    a, b = normal_pair(8192, 8192, 8192)
    reference = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    return a, b, reference


def test_large_exact_within_float32_accumulation_error(large) -> None:
    a, b, reference = large
    assert gemm_path(a, b) == "hopper" or not FP8_GPU
    exact = mxfp4_matmul(a, b, torch.float32, "exact")
    a32, b32 = a.dequantize(torch.float32), b.dequantize(torch.float32)
    torch.backends.cuda.matmul.allow_tf32 = False
    float32_gemm = a32 @ b32.T
    error, float32_error = relative_error(exact, reference), relative_error(float32_gemm, reference)
    assert error <= 2 * max(float32_error, 2.0**-24), (error, float32_error)
    bf16 = mxfp4_matmul(a, b, torch.bfloat16, "exact")
    assert relative_error(bf16, reference.to(torch.bfloat16).double()) < 1e-6


def test_large_fast_within_its_bound(large) -> None:
    """Gaussian rows span fewer binades than either fold range, so nothing is flushed; what
    remains is the tensor cores' 14-bit accumulation between float32 promotions."""
    a, b, reference = large
    fast = mxfp4_matmul(a, b, torch.bfloat16, "fast")  # cuBLAS path
    assert relative_error(fast, reference) < 4e-3  # bf16 output: ~2^-9
    assert relative_error(fast, reference.to(torch.bfloat16).double()) < 1e-3
    fast_fp32 = mxfp4_matmul(a, b, torch.float32, "fast")  # the FP8 kernel
    assert relative_error(fast_fp32, reference) < 2.0**-12


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize(
    "shape", [(8192, 8192, 8192), (1000, 1504, 700), (129, 4097, 96), (1, 256, 32)]
)
def test_poisoned_outputs_are_overwritten_and_runs_repeat(mode, shape) -> None:
    a, b = normal_pair(*shape, seed=sum(shape))
    for out_dtype in (torch.bfloat16, torch.float32):
        runs = []
        for _ in range(3):
            out = torch.full((shape[0], shape[1]), float("nan"), device="cuda", dtype=out_dtype)
            mxfp4_matmul(a, b, out_dtype, mode, out=out)
            assert not out.isnan().any(), f"{mode} {out_dtype}: unwritten outputs"
            runs.append(out)
        assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


@pytest.mark.parametrize("binades", [2, 10, 26, 40, 100])
def test_every_exact_tier_on_wide_rows(binades: int) -> None:
    """Rows spread over `binades` go to INT8 (<= 3), FP8 (4..26) or per-window (more) tiles;
    B's zero first block keeps the result inside float32's range for any spread."""
    a, b = normal_pair(1024, 768, 4096, seed=binades)
    a = spread_rows(a, list(range(0, 1024, 7)), binades)
    b = zero_block(b, 0)
    reference = matmul_reference(a, b, torch.float64)
    exact = mxfp4_matmul(a, b, torch.float32, "exact")
    assert ((exact.double() - reference).abs() <= float32_bound(a, b)).all()
    fast = mxfp4_matmul(a, b, torch.float32, "fast")  # the FP8 kernel: flushes beyond 26
    magnitude = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().T
    slack = flushed_bound(a, b, fold_range=26) + 2.0**-7 * magnitude
    assert ((fast.double() - reference).abs() <= slack).all()


@pytest.mark.parametrize("shape", [(2048, 1536, 4096), (777, 1000, 4000)])
def test_outlier_channels_split_k_and_stay_exact(shape) -> None:
    """32 of K's channels 200 times larger (activation outliers): the split sends their windows
    to FP8 and keeps every row on the INT8 tier, within float32 accumulation error, and runs
    repeat bit for bit."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import prepare
    from fp4cli.kernels.gemm.split import k_split

    m, n, k = shape
    generator = torch.Generator(device="cuda").manual_seed(k)
    x = torch.randn(m, k, generator=generator, device="cuda")
    channels = torch.randperm(k, generator=generator, device="cuda")[:32]
    x[:, channels] *= 200
    w = torch.randn(n, k, generator=generator, device="cuda")
    a, b = quantize(x.bfloat16(), MXFP4), quantize(w.bfloat16(), MXFP4)
    a_op, b_op = kernel_operand(a), kernel_operand(b)
    split = k_split(a_op.scales, b_op.scales, 32)
    outlier_windows = set((channels // 32).tolist())
    assert set(split.source[: len(outlier_windows)].tolist()) == outlier_windows
    flags = prepare(a_op, b_op, int8=True, e5m2=True, tier_flags=True, split=split).facts[1]
    assert (flags == 0).float().mean() > 0.99  # without the split: every row flagged 4
    reference = matmul_reference(a, b, torch.float64)
    runs = [mxfp4_matmul(a, b, torch.float32, "exact") for _ in range(2)]
    assert torch.equal(runs[0], runs[1])
    assert ((runs[0].double() - reference).abs() <= float32_bound(a, b)).all()


@pytest.mark.skipif(not FP8_GPU, reason="the cuBLAS path needs FP8 tensor cores")
def test_fast_cublas_path_flushes_within_its_bound() -> None:
    """The cuBLAS path folds into E4M3: blocks more than 11 binades below their row's largest
    are flushed; nothing else moves beyond the bf16 output's rounding."""
    a, b = normal_pair(512, 384, 2048, seed=12)
    a = spread_rows(a, list(range(0, 512, 5)), 15)
    reference = matmul_reference(a, b, torch.float64)
    fast = mxfp4_matmul(a, b, torch.bfloat16, "fast").double()
    magnitude = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().T
    bound = flushed_bound(a, b, fold_range=11) + 2.0**-7 * magnitude + 2.0**-8 * reference.abs()
    assert ((fast - reference).abs() <= bound).all()
    assert not torch.allclose(fast, reference.to(torch.bfloat16).double())  # something flushed


@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_the_bias_joins_the_sums_in_the_epilogue(mode) -> None:
    """A bf16 bias: the exact kernels round fl32(sum + bias) once (the reference's bits where
    float32 sums are exact); cuBLAS's FP8 GEMM (fast, bf16) adds it in its epilogue."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import cublas_fast_supported

    a, b = exact_sum_pair(304, 272, 256, seed=6, device="cuda")
    bias = torch.randn(272, device="cuda").to(torch.bfloat16)
    got = mxfp4_matmul(a, b, torch.bfloat16, mode, bias=bias)
    expected = matmul_reference(a, b, torch.float32, bias).to(torch.bfloat16)
    if mode == "exact":
        assert_matches(got, expected)
        return
    out = torch.empty(304, 272, device="cuda", dtype=torch.bfloat16)
    assert cublas_fast_supported(kernel_operand(a), kernel_operand(b), out, bias) == FP8_GPU
    reference = matmul_reference(a, b, torch.float64, bias)
    magnitude = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().T
    bound = 2.0**-12 * magnitude + 2.0**-8 * reference.abs()
    assert ((got.double() - reference).abs() <= bound).all()
    assert ((got.double() - expected.double()).abs() > 0).float().mean() < 0.01


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_exact_is_bit_exact_where_float32_sums_are(out_dtype) -> None:
    a, b = exact_sum_pair(300, 272, 256, seed=4, device="cuda")
    a, b = nan_block(a, 17, 3), nan_block(b, 5, 0)
    expected = matmul_reference(a, b, torch.float32).to(out_dtype)
    assert_matches(mxfp4_matmul(a, b, out_dtype, "exact"), expected)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_fast_nan_rows_and_columns(out_dtype) -> None:
    a, b = exact_sum_pair(300, 272, 256, seed=5, device="cuda")
    a, b = nan_block(a, 17, 3), nan_block(b, 5, 0)
    fast = mxfp4_matmul(a, b, out_dtype, "fast").double()
    reference = matmul_reference(a, b, torch.float64)
    assert torch.equal(fast.isnan(), reference.isnan())
    magnitude = a.dequantize(torch.float64).abs() @ b.dequantize(torch.float64).abs().T
    finite = ~reference.isnan()
    rounding = 2.0**-8 * reference.abs()  # bf16 output
    assert ((fast - reference).abs() <= 2.0**-7 * magnitude + rounding)[finite].all()


def test_weight_only_bf16() -> None:
    b = exact_sum_pair(8, 512, 256, seed=1, device="cuda")[1]
    a_quantized = exact_sum_pair(300, 8, 256, seed=2, device="cuda")[0]
    a = a_quantized.dequantize(torch.bfloat16)  # bf16 values whose products sum exactly
    assert gemm_path(a, b) == "weight-only"
    assert_matches(mxfp4_matmul(a, b, torch.float32), matmul_reference(a, b, torch.float32))


def test_dot_scaled_kernel() -> None:
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import scaled_dot_matmul

    a, b = exact_sum_pair(300, 272, 256, seed=6, device="cuda")
    out = torch.full((300, 272), float("nan"), device="cuda")
    scaled_dot_matmul(kernel_operand(a), kernel_operand(b), out)
    assert_matches(out, matmul_reference(a, b, torch.float32))


def test_paths_by_capability(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = exact_sum_pair(64, 48, 128, seed=8, device="cuda")
    for capability, path in (((10, 0), "blackwell"), ((9, 0), "hopper"), ((8, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_, c=capability: c)
        assert gemm_path(a, b) == path
    result = mxfp4_matmul(a, b, torch.bfloat16)  # the bf16 path runs anywhere
    assert_matches(result, matmul_reference(a, b, torch.bfloat16))
