"""The NVFP4 GEMM (fp4cli.gemm.nvfp4_matmul, both implementations) against its definition,
`nvfp4_matmul_reference`.

On the CPU the kernels run under TRITON_INTERPRET=1 (`make test` sets it), decoding to float32;
tests/gpu/test_gemm_nvfp4_gpu.py runs them compiled, decoding to bfloat16. Operands built here
hold products whose every float32 partial sum is exact (`assert_exact_sums` checks it for each
case), so any summation order gives the reference's bits: compared with atol=0.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fp4cli.gemm import (
    GemmError,
    nvfp4_alpha,
    nvfp4_matmul,
    nvfp4_matmul_reference,
    nvfp4_path,
)
from fp4cli.gemm.reference import block_scaled_values
from fp4cli.quant import QuantizedTensor, QuantSpec, SpecError, quantize
from fp4cli.quant.backend import interpreter_on, triton_available
from tests.kernel_checks import assert_bits

NVFP4 = QuantSpec.preset("nvfp4")
IMPLS = ("fused", "decoded")
KERNELS = triton_available() and (interpreter_on() or torch.cuda.is_available())
needs_kernels = pytest.mark.skipif(
    not KERNELS, reason="the GEMM kernels need TRITON_INTERPRET=1 (CPU) or a CUDA GPU"
)
DEVICE = "cpu" if interpreter_on() or not torch.cuda.is_available() else "cuda"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# --------------------------------------------------------------------------------------------
# Operands (shared with tests/gpu/test_gemm_nvfp4_gpu.py)
# --------------------------------------------------------------------------------------------


def nvfp4_tensor(codes: torch.Tensor, scales: torch.Tensor, amax: float, k: int) -> QuantizedTensor:
    """A (rows, k) NVFP4 tensor with the given packed codes (rows, K_padded / 2), scale codes
    (rows, K_padded / 16) and tensor amax."""
    template = quantize(torch.zeros(codes.shape[0], k), NVFP4, backend="torch")
    assert template.codes.shape == codes.shape and template.scales.shape == scales.shape
    amax_tensor = torch.tensor(amax, dtype=torch.float32, device=codes.device)
    return dataclasses.replace(template, codes=codes, scales=scales, tensor_amax=amax_tensor)


def random_operand(
    rows: int, k: int, seed: int, scale_codes: tuple[int, int] = (0x50, 0x57), device=DEVICE
) -> QuantizedTensor:
    """Random codes (zero in the padding past k) and scale codes in [lo, hi]: by default s from
    8 to 15, where K <= 256 keeps every float32 partial sum exact (`assert_exact_sums`)."""
    generator = torch.Generator().manual_seed(seed)
    k_padded = -(-k // 16) * 16
    nibbles = torch.randint(0, 16, (rows, k_padded), generator=generator, dtype=torch.uint8)
    nibbles[:, k:] = 0
    codes = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    lo, hi = scale_codes
    scales = torch.randint(lo, hi + 1, (rows, k_padded // 16), generator=generator)
    amax = float(torch.empty(()).uniform_(0.01, 100.0, generator=generator))
    return nvfp4_tensor(codes.to(device), scales.to(torch.uint8).to(device), amax, k)


def lowest_bit_exponent(values: torch.Tensor) -> torch.Tensor:
    """e with 2^e the lowest set bit of each nonzero float64 (exact)."""
    mantissa, exponent = torch.frexp(values.abs())
    integer = (mantissa * 2.0**53).to(torch.int64)
    lowest = (integer & -integer).to(torch.float64)
    return exponent - 53 + torch.frexp(lowest)[1] - 1


def assert_exact_sums(a: QuantizedTensor, b: QuantizedTensor) -> None:
    """For every output, its products (q_a s_a)(q_b s_b) are multiples of 2^e0 and the sum of
    their magnitudes is below 2^(24 + e0): then every float32 partial sum, in any order, is
    exact. (NaN blocks give NaN whatever the order: they are left out.)"""
    x = torch.nan_to_num(block_scaled_values(a).reshape(-1, a.codes.shape[-1] * 2).cpu())
    y = torch.nan_to_num(block_scaled_values(b).cpu())
    products = x[:, None, :] * y[None, :, :]  # (M, N, K_padded)
    lowest = torch.where(products != 0, lowest_bit_exponent(products), 10_000)
    e0 = lowest.amin(dim=-1).to(torch.float64)
    assert (products.abs().sum(dim=-1) < torch.exp2(24 + e0)).all(), "sums that may round"


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, what: str = "product") -> None:
    """Bit for bit, except the sign of zero."""
    assert_bits(
        torch.where(actual == 0, 0.0, actual).to(actual.dtype),
        torch.where(expected == 0, 0.0, expected).to(expected.dtype),
        what,
    )


def run(a, b, impl: str, out_dtype: torch.dtype = torch.float32, **kwargs) -> torch.Tensor:
    return nvfp4_matmul(a, b, out_dtype, backend="triton", impl=impl, **kwargs)


# --------------------------------------------------------------------------------------------
# Exact data, both implementations
# --------------------------------------------------------------------------------------------

SHAPES = [(1, 1, 16), (1, 16, 32), (33, 17, 112), (64, 48, 256), (5, 70, 208), (40, 33, 16),
          (9, 10, 7)]  # fmt: skip


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_bit_for_bit(impl: str, shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    a, b = random_operand(m, k, seed=sum(shape)), random_operand(n, k, seed=k + 1)
    assert_exact_sums(a, b)
    expected = nvfp4_matmul_reference(a, b, torch.float32)
    assert_matches(run(a, b, impl), expected)
    assert expected.abs().max() > 0


# the interpreter's float32 -> bfloat16 conversion truncates: bfloat16 is tested on a GPU
OUT_DTYPES = [torch.float16] + ([] if interpreter_on() else [torch.bfloat16])


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_output_dtypes_round_the_float32_result(impl: str, out_dtype: torch.dtype) -> None:
    a = random_operand(24, 96, seed=3, scale_codes=(0x30, 0x46))  # s from 0.5 to 3.5
    b = random_operand(20, 96, seed=4, scale_codes=(0x48, 0x57))
    assert_exact_sums(a, b)
    assert_matches(run(a, b, impl, out_dtype), nvfp4_matmul_reference(a, b, out_dtype))


def edge_operands(device=DEVICE) -> tuple[QuantizedTensor, QuantizedTensor]:
    """A (6, 64): row 0 all codes 6 with the largest scale (448), row 1 subnormal scales
    (codes 1..7 with random codes), row 2 zero scales over nonzero codes, row 3 a NaN block
    (0x7F), row 4 a NaN block coded 0xFF, row 5 scale 1 with codes -6. B (5, 64): the largest,
    subnormal and zero rows again, a NaN block in row 3, ordinary scales in row 4."""
    generator = torch.Generator().manual_seed(7)
    a_codes = torch.randint(0, 256, (6, 32), generator=generator, dtype=torch.uint8)
    a_codes[0] = 0x77
    a_codes[5] = 0xFF
    a_scales = torch.full((6, 4), 0x40, dtype=torch.uint8)
    a_scales[0] = 0x7E
    a_scales[1] = torch.tensor([1, 3, 5, 7])
    a_scales[2] = 0
    a_scales[3, 2] = 0x7F
    a_scales[4, 0] = 0xFF
    a_scales[5] = 0x38
    b_codes = torch.randint(0, 256, (5, 32), generator=generator, dtype=torch.uint8)
    b_codes[0] = 0x77
    b_scales = torch.full((5, 4), 0x3C, dtype=torch.uint8)
    b_scales[0] = 0x7E
    b_scales[1] = torch.tensor([7, 2, 1, 4])
    b_scales[2] = 0
    b_scales[3, 1] = 0x7F
    a = nvfp4_tensor(a_codes.to(device), a_scales.to(device), 3.5, 64)
    b = nvfp4_tensor(b_codes.to(device), b_scales.to(device), 1.25, 64)
    return a, b


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
def test_extreme_zero_subnormal_and_nan_scales(impl: str) -> None:
    a, b = edge_operands()
    assert_exact_sums(a, b)
    expected = nvfp4_matmul_reference(a, b, torch.float32)
    actual = run(a, b, impl)
    assert_matches(actual, expected)
    nan_rows, nan_cols = torch.tensor([3, 4]), torch.tensor([3])
    assert actual[nan_rows].isnan().all() and actual[:, nan_cols].isnan().all()
    finite = torch.ones_like(actual, dtype=torch.bool)
    finite[nan_rows] = False
    finite[:, nan_cols] = False
    assert actual[finite].isfinite().all()
    assert (actual[2][finite[2]] == 0).all() and (actual[:, 2][finite[:, 2]] == 0).all()
    alpha = float(nvfp4_alpha(a, b))
    assert actual[0, 0] == torch.tensor(alpha * 64 * 2688.0**2, dtype=torch.float32)


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
def test_amax_zero_gives_zero(impl: str) -> None:
    zeros = quantize(torch.zeros(12, 48), NVFP4, backend="torch").codes.to(DEVICE)
    a = quantize(torch.zeros(12, 48, device=DEVICE), NVFP4, backend="torch")
    assert float(a.tensor_amax) == 0 and (a.codes == zeros).all()
    b = random_operand(9, 48, seed=5)
    assert (run(a, b, impl) == 0).all()
    # an amax of 0 over nonzero codes: alpha is 0, so is every finite output
    c = dataclasses.replace(random_operand(12, 48, seed=6), tensor_amax=a.tensor_amax)
    actual = run(c, b, impl)
    assert (actual == 0).all()
    assert_matches(actual, nvfp4_matmul_reference(c, b, torch.float32))


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
def test_random_data_within_float32_summation_error(impl: str) -> None:
    generator = torch.Generator().manual_seed(11)
    x, w = torch.randn(40, 1024, generator=generator), torch.randn(24, 1024, generator=generator)
    a, b = quantize(x.to(DEVICE), NVFP4), quantize(w.to(DEVICE), NVFP4)
    alpha = float(nvfp4_alpha(a, b))
    va, vb = block_scaled_values(a), block_scaled_values(b)
    exact = alpha * (va @ vb.T)
    bound = alpha * 1025 * 2.0**-24 * (va.abs() @ vb.abs().T) + 2.0**-23 * exact.abs()
    error = (run(a, b, impl).double() - exact).abs()
    assert (error <= bound).all()
    assert error.max() > 0 or impl == "decoded"  # sums of 1024 products do round


@needs_kernels
@pytest.mark.parametrize("impl", IMPLS)
def test_leading_dimensions_and_out(impl: str) -> None:
    a = random_operand(6, 64, seed=8)
    b = random_operand(10, 64, seed=9)
    a3 = dataclasses.replace(
        a, codes=a.codes.reshape(2, 3, -1), scales=a.scales.reshape(2, 3, -1),
        shape=torch.Size((2, 3, 64)), axis=2,
    )  # fmt: skip
    expected = nvfp4_matmul_reference(a, b, torch.float32)
    assert_matches(run(a3, b, impl), expected.reshape(2, 3, 10))
    target = torch.full((10, 6), float("nan"), device=DEVICE).T  # strided out
    assert run(a, b, impl, out=target) is target
    assert_matches(target, expected)


# --------------------------------------------------------------------------------------------
# The reference, the paths, bad inputs (no kernels needed)
# --------------------------------------------------------------------------------------------


def test_alpha_is_the_float32_amax_product_over_2688_squared() -> None:
    a, b = random_operand(2, 32, seed=1, device="cpu"), random_operand(2, 32, seed=2, device="cpu")
    product = a.tensor_amax * b.tensor_amax  # float32
    expected = product / torch.tensor(2688.0 * 2688.0, dtype=torch.float32)
    assert_bits(nvfp4_alpha(a, b), expected)
    four_six = QuantSpec.preset("nvfp4-4over6")
    c = dataclasses.replace(a, spec=four_six)
    assert_bits(nvfp4_alpha(c, b), product / torch.tensor(1536.0 * 2688.0))


def test_reference_is_near_but_not_dequantize_then_gemm() -> None:
    generator = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 512, generator=generator), torch.randn(48, 512, generator=generator)
    a, b = quantize(x, NVFP4, backend="torch"), quantize(w, NVFP4, backend="torch")
    reference = nvfp4_matmul_reference(a, b, torch.float64)
    dequantized = a.dequantize(torch.float64) @ b.dequantize(torch.float64).T
    difference = ((reference - dequantized).norm() / dequantized.norm()).item()
    assert 0 < difference < 1e-6  # each dequantized element is rounded to float32


def test_torch_backend_and_paths(monkeypatch) -> None:
    a, b = random_operand(5, 48, seed=1, device="cpu"), random_operand(4, 48, seed=2, device="cpu")
    expected = nvfp4_matmul_reference(a, b, torch.bfloat16)
    assert_bits(nvfp4_matmul(a, b, backend="torch"), expected)
    assert nvfp4_path(a, b, "torch") == "reference"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert nvfp4_path(a, b) == "reference"  # a CPU without the interpreter
    assert_bits(nvfp4_matmul(a, b), expected)
    with pytest.raises(GemmError, match="needs triton and CUDA"):
        nvfp4_matmul(a, b, backend="triton")
    if triton_available():
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert nvfp4_path(a, b, impl="decoded") == "decoded"


def _bad_requests() -> list[tuple[str, object]]:
    x = torch.randn(8, 64)
    a = quantize(x, NVFP4, backend="torch")
    b = quantize(torch.randn(6, 64), NVFP4, backend="torch")
    return [
        ("quantize with QuantSpec.preset", (quantize(x, QuantSpec.preset("mxfp4")), b)),
        ("along axis 0", (quantize(torch.randn(64, 8), NVFP4, axis=0, backend="torch"), b)),
        ("K = 48", (quantize(torch.randn(8, 48), NVFP4, backend="torch"), b)),
        ("16x16 tiles", (quantize(x, QuantSpec.preset("nvfp4-2d"), backend="torch"), b)),
        ("per 128 values", (quantize(x, QuantSpec.preset("nvfp4-outer128"), backend="torch"), b)),
        ("sr_prescale", (quantize(x, QuantSpec.preset("nvfp4-eden"), seed=1, backend="torch"), b)),
        ("ue5m3", (quantize(x, QuantSpec.preset("mxfp4-ue5m3", block=16), backend="torch"), b)),
        ("must be a QuantizedTensor", (x, b)),
        ("b must be 2-D", (a, dataclasses.replace(b, shape=torch.Size((1, 6, 64)), axis=2))),
        ("out_dtype must be", (a, b, torch.int32)),
        ("out must be a", (a, b, torch.float32, "auto", torch.empty(8, 5))),
        ("impl must be one of", (a, b, torch.float32, "auto", None, "cutlass")),
    ]


@pytest.mark.parametrize(
    "fragment, args", _bad_requests(), ids=lambda v: v if isinstance(v, str) else "args"
)
def test_bad_inputs_raise_one_line_gemm_errors(fragment: str, args: tuple) -> None:
    with pytest.raises(GemmError, match=fragment) as raised:
        nvfp4_matmul(*args)  # type: ignore[arg-type]
    assert "\n" not in str(raised.value)


def test_bad_backend_is_a_spec_error() -> None:
    a = random_operand(2, 16, seed=1, device="cpu")
    with pytest.raises(SpecError, match="backend"):
        nvfp4_matmul(a, a, backend="cuda")


# --------------------------------------------------------------------------------------------
# Compiled for Hopper (sm_90), bfloat16 decode (tests/hopper_compile.py)
# --------------------------------------------------------------------------------------------

COMPILE = """
import torch
import fp4cli.kernels.gemm.nvfp4_launch as launch
from tests.hopper_compile import compile_launches

def launches():
    codes = torch.zeros(64, 64, dtype=torch.uint8)
    op = launch.NvOperand(codes, torch.zeros(64, 8, dtype=torch.uint8), torch.ones(1))
    out = torch.empty(64, 64, dtype=torch.bfloat16)
    for tile in launch.FUSED_TILES:
        launch.fused_matmul(op, op, 7225344.0, out, tile=tile)
    launch.decode_values(op)
    launch.nvfp4_alpha_kernel[(1, 1)](
        out.float(), op.amax, op.amax, 7225344.0, out, out, 64, 64, 64, 1,
        BM=launch.ALPHA_BM, BN=launch.ALPHA_BN, HAS_BIAS=False, num_warps=launch.ALPHA_WARPS,
    )
    assert launch.decode_type() == "bf16"

kernels = [(launch, name) for name in
           ("nvfp4_fused_kernel", "nvfp4_decode_kernel", "nvfp4_alpha_kernel")]
print(compile_launches(launches, kernels))
"""


def test_kernels_compile_for_hopper_with_the_bf16_decode() -> None:
    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", COMPILE], cwd=Path(__file__).parents[2], env=env,
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "6"


# --------------------------------------------------------------------------------------------
# fp4 bench gemm with the NVFP4 implementations
# --------------------------------------------------------------------------------------------


def test_bench_operand_formats() -> None:
    from fp4cli.bench.gemm import operand_formats

    assert operand_formats(["cublas-bf16", "nvfp4", "nvfp4-decoded"]) == {
        "cublas-bf16": "nvfp4", "nvfp4": "nvfp4", "nvfp4-decoded": "nvfp4"
    }  # fmt: skip
    assert operand_formats(["cublas-bf16", "exact", "nvfp4"])["cublas-bf16"] == "mxfp4"
    assert operand_formats(["cublas-bf16"]) == {"cublas-bf16": "mxfp4"}


def test_bench_gemm_measures_the_nvfp4_impls(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fp4cli.cli.main import app
    from fp4cli.store import RunStore

    path = tmp_path / "fp4.db"
    args = ["bench", "gemm", "--shapes", "40x24x96", "--impls", "cublas-bf16,nvfp4,nvfp4-decoded",
            "--device", DEVICE, "--store", str(path)]  # fmt: skip
    result = CliRunner().invoke(app, args, env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "NVFP4 GEMM on" in result.stdout and "max err" in result.stdout
    with RunStore(path) as store:
        rows = store.benchmarks("gemm")
    assert {row["config"]["format"] for row in rows} == {"nvfp4"}
    measured = {(row["config"]["impl"], row["name"]): row["value"] for row in rows}
    assert ("cublas-bf16", "tflops") in measured
    if not KERNELS:
        assert "needs triton and CUDA" in result.stdout
        return
    for impl in ("nvfp4", "nvfp4-decoded"):
        assert measured[(impl, "tflops")] > 0
        # bf16 output (the interpreter's bfloat16 truncates: within a few bf16 ulps)
        assert 0 < measured[(impl, "rel_error")] < 2**-6
        assert measured[(impl, "max_rel_error")] < 2**-6


# --------------------------------------------------------------------------------------------
# fp4 cost: the NVFP4 GEMM's rate, assumed or measured
# --------------------------------------------------------------------------------------------

H100_NAME = "NVIDIA H100 80GB HBM3"


def gemm_bench_store(path: Path) -> Path:
    """NVFP4 GEMM rows as `fp4 bench gemm` stores them, and rows the cost model must ignore."""
    from fp4cli.store import RunStore

    def config(impl: str, size: int, fmt: str = "nvfp4") -> dict:
        return {"m": size, "n": size, "k": size, "shape": f"{size}^3", "impl": impl,
                "format": fmt, "out_dtype": "bf16"}  # fmt: skip

    with RunStore(path) as store:
        for device, cfg, name, value in (
            (H100_NAME, config("nvfp4", 8192), "tflops", 600.0),
            (H100_NAME, config("nvfp4-decoded", 8192), "tflops", 700.0),
            (H100_NAME, config("nvfp4", 1024), "tflops", 100.0),
            (H100_NAME, config("cublas-bf16", 8192, "nvfp4"), "tflops", 800.0),
            (H100_NAME, config("exact", 8192, "mxfp4"), "tflops", 900.0),
            (H100_NAME, config("nvfp4", 8192), "ms", 2.0),
            ("NVIDIA B200", config("nvfp4", 8192), "tflops", 5000.0),
        ):
            store.log_benchmark("gemm", device, {"torch": "2.11"}, cfg, name, value, "TFLOP/s")
    return path


def test_cost_prices_nvfp4_gemms_at_the_bf16_rate_on_hopper() -> None:
    from fp4cli.cost import estimate_layer, profile_for
    from fp4cli.cost.model import gemm_precision
    from fp4cli.cost.shapes import LayerShape
    from fp4cli.recipes import load_recipe

    two_d = QuantSpec.preset("nvfp4-2d")
    assert gemm_precision((NVFP4, two_d)) == "nvfp4"
    assert gemm_precision((NVFP4, QuantSpec.preset("mxfp4"))) == "fp4"
    h100, b200 = profile_for("h100"), profile_for("b200")
    assert h100.gemm_flops("nvfp4") == h100.gemm_flops("bf16") and h100.kind("nvfp4") == "assumed"
    assert b200.gemm_flops("nvfp4") == b200.gemm_flops("fp4")
    cost = estimate_layer(load_recipe("nvfp4").linear, LayerShape(8192, 8192, 8192), h100)
    gemms = [item for item in cost.items if item.technique == "gemm"]
    assert [item.source for item in gemms] == ["model (nvfp4 assumed)"] * 3
    assert gemms[0].seconds == pytest.approx(2 * 8192**3 / h100.gemm_flops("bf16"))


def test_cost_uses_the_measured_nvfp4_gemm(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from fp4cli.cli.main import app
    from fp4cli.cost import estimate_layer, measured_rates, profile_for
    from fp4cli.cost.shapes import LayerShape
    from fp4cli.recipes import load_recipe
    from fp4cli.store import RunStore

    store = gemm_bench_store(tmp_path / "s.db")
    with RunStore(store) as opened:
        rates = measured_rates(opened, "h100")
    assert len(rates.gemms) == 3 and len(rates) == 0  # nvfp4 x 2 at 8192, nvfp4 at 1024
    fastest = rates.gemm("nvfp4", 2 * 8000**3)
    assert fastest is not None and (fastest.impl, fastest.tflops) == ("nvfp4-decoded", 700.0)
    small = rates.gemm("nvfp4", 2 * 1100**3)
    assert small is not None and small.tflops == 100.0
    assert rates.gemm("fp4", 2 * 8192**3) is None
    shape = LayerShape(8192, 8192, 8192)
    cost = estimate_layer(load_recipe("nvfp4").linear, shape, profile_for("h100"), rates)
    forward = next(item for item in cost.items if item.technique == "gemm")
    assert forward.source.startswith("measured: fp4 bench gemm nvfp4-decoded 20")
    assert forward.seconds == pytest.approx(2 * 8192**3 / 700e12)
    mxfp4 = estimate_layer(load_recipe("mxfp4").linear, shape, profile_for("h100"), rates)
    assert not any(item.source.startswith("measured") for item in mxfp4.items)
    args = ["cost", "-r", "nvfp4", "--shape", "8192x8192x8192", "--device", "h100"]
    result = CliRunner().invoke(app, [*args, "--store", str(store)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    assert "measured: fp4 bench gemm nvfp4-decoded" in result.stdout
    assert "3 NVFP4 GEMM measurements" in result.stdout.replace("\n", " ")
