"""The vector-wise kernels (kernels/vector/vector_wise.py, kernels/vector/launch.py) against the
reference quantizer: one E8M0 scale per row, column or tensor, E2M1 / E4M3 / E5M2 elements, the
fused per-row outlier clamp, bit for bit (signs of zero included) on ragged shapes and edge
values."""

import pytest
import torch

import fp4cli.kernels.vector.launch as launch_vector
from fp4cli.kernels.vector.launch import Clamp, decode_vector, quantize_codes, quantize_vector
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.techniques.outliers import OutlierConfig, clamp_outliers, nearest_ranks
from tests.hopper_compile import run_compiler_module
from tests.kernel_cases import DEVICE, FP32_MAX, INF, NAN, assert_bits, assert_same_up_to_zero_sign

SPECS = {
    "fp4-row": QuantSpec.preset("fp4-row"),
    "fp4-column": QuantSpec.preset("fp4-column"),
    "fp4-row-floor": QuantSpec(block="row"),
    "e4m3-tensor": QuantSpec.preset("fp8-e4m3-tensor"),
    "e5m2-tensor": QuantSpec.preset("fp8-e5m2-tensor"),
    "e4m3-row-floor": QuantSpec(element="e4m3", block="row"),
    "e5m2-column": QuantSpec(element="e5m2", block="column", scale_rule="ceil"),
    # ties toward +inf (Wang et al.'s E2M1 thresholds), on FP4 and on an FP8 grid
    "fp4-row-ties-up": QuantSpec.preset("fp4-row", rounding="ties_up"),
    "fp4-column-ties-up": QuantSpec.preset("fp4-column", rounding="ties_up"),
    "e4m3-tensor-ties-up": QuantSpec.preset("fp8-e4m3-tensor", rounding="ties_up"),
    # MS-AMP's scale in bfloat16 arithmetic (QuantSpec.scale_bf16)
    "fp4-row-bf16-scale": QuantSpec.preset("fp4-row", rounding="ties_up", scale_bf16=True),
    "fp4-column-bf16-scale": QuantSpec.preset("fp4-column", scale_bf16=True),
    "fp4-tensor-bf16-scale": QuantSpec(block="tensor", scale_rule="ceil", scale_bf16=True),
}


def edge_tensor(rows=37, cols=45, seed=0):
    """Gaussian values with a NaN row, an Inf row, an all-zero row, huge, tiny (subnormal) and
    tie values, and negative zeros."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator) * 3
    x[1, 4] = NAN
    x[2, 7] = -INF
    x[3] = 0.0
    x[4, :5] = torch.tensor([FP32_MAX, -FP32_MAX, 1e38, -2.5e-38, 1.0])
    x[5] = torch.tensor([1e-40, -3e-42, 2e-45]).repeat(cols)[:cols]  # subnormal values
    x[6, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0])  # E2M1 ties at scale 1
    x[6, 8] = 6.0
    x[7, :4] = torch.tensor([-0.0, 0.01, -0.001, 0.0])
    return x.to(DEVICE)


def _check(x, spec, axis, **kwargs):
    """Values, codes decoded and scales against the reference."""
    reference = fake_quantize(x, spec, axis=axis, backend="torch")
    values, scales = quantize_vector(x, spec, axis, x.dtype, scales=True, **kwargs)
    assert_bits(values, reference, f"values {spec.short()} axis {axis}")
    codes, code_scales = quantize_vector(x, spec, axis, None, scales=True, **kwargs)
    assert codes.dtype == torch.uint8
    decoded = decode_vector(codes, code_scales, spec, axis, x.dtype)
    assert_bits(decoded, reference, f"decoded {spec.short()} axis {axis}")
    expected_scales = quantize(x, spec, axis=axis, backend="torch").scale_values().reshape(-1)
    if spec.block == "column" and spec.packed:  # the reference pads the axis to whole bytes
        expected_scales = expected_scales[: x.shape[axis]]
    assert_bits(scales, expected_scales, "scales")
    return values


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("axis", [0, 1])
def test_every_operand_matches_the_reference_bit_for_bit(name, axis):
    _check(edge_tensor(), SPECS[name], axis)


@pytest.mark.parametrize("axis", [0, 1])
def test_msamps_scale_for_every_bfloat16_amax(axis):
    """One line per bfloat16 amax of 2^-12..2^12 (3,073 lines, each the amax and a few
    smaller values), bfloat16 input: the kernels' MS-AMP exponents are the reference's, one
    below the exact rule's on a share of the lines (those that clip)."""
    every = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    amax = every[(every.float() >= 2.0**-12) & (every.float() <= 2.0**12)]
    line = torch.tensor([1.0, -0.5, 0.3, -0.999, 0.0], dtype=torch.bfloat16)
    x = (amax[:, None] * line[None, :]).to(DEVICE)
    x = x if axis == 1 else x.T.contiguous()
    spec = SPECS["fp4-row-bf16-scale"]
    _check(x, spec, axis)
    _, scales = quantize_vector(x, spec, axis, x.dtype, scales=True)
    _, exact = quantize_vector(x, QuantSpec.preset("fp4-row", rounding="ties_up"), axis,
                               x.dtype, scales=True)  # fmt: skip
    ratio = (exact / scales).unique().tolist()
    assert sorted(ratio) == [1.0, 2.0]


def test_ties_go_toward_positive_infinity():
    """Every E2M1 tie at scale 1 (amax 6, the ceil rule): up for a positive value, toward zero
    for a negative one (the thresholds of Wang et al.'s kernel: v < -5 -> -6, else v < -3.5 ->
    -4, ...); E4M3 ties likewise (1 + 2^-4 between 1 and 1 + 2^-3)."""
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    up = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    toward_zero = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0])
    x = torch.cat([torch.tensor([6.0]), ties, -ties]).reshape(1, -1).to(DEVICE)
    expected = torch.cat([torch.tensor([6.0]), up, -toward_zero]).reshape(1, -1)
    for backend in ("torch", "kernels"):
        spec = SPECS["fp4-row-ties-up"]
        if backend == "torch":
            got = fake_quantize(x, spec, axis=1, backend="torch")
        else:
            got = quantize_vector(x, spec, 1, x.dtype)[0]
        assert_same_up_to_zero_sign(got.cpu(), expected, backend)
    e4m3 = torch.tensor([[448.0, 1 + 2**-4, -(1 + 2**-4), 1 + 3 * 2**-4]]).to(DEVICE)
    got = quantize_vector(e4m3, SPECS["e4m3-tensor-ties-up"], 1, e4m3.dtype)[0].cpu()
    assert got[0, 1:].tolist() == [1 + 2**-3, -1.0, 1 + 2**-2]  # the last: to even either way


@pytest.mark.parametrize("shape", [(1, 1), (1, 9), (9, 1), (3, 130), (70, 3)])
def test_ragged_and_degenerate_shapes(shape):
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 100).to(DEVICE)
    for spec in (SPECS["fp4-row"], SPECS["fp4-column"], SPECS["e5m2-tensor"]):
        for axis in (0, 1):
            _check(x, spec, axis)


def test_all_zero_and_non_finite_tensors():
    zeros = torch.zeros(5, 7, device=DEVICE)
    negative_zeros = -zeros
    for spec in SPECS.values():
        for x in (zeros, negative_zeros):
            assert_bits(_check(x, spec, 1), x, "zeros stay zeros, their signs too")
    single_inf = torch.ones(5, 7, device=DEVICE)
    single_inf[2, 3] = INF
    values = _check(single_inf, SPECS["e4m3-tensor"], 0)
    assert values.isnan().all()


@pytest.mark.parametrize("row", [0, 127, 128, 161, 299])
def test_the_amax_pass_reads_every_tile_of_its_programs(row):
    """A program of the amax pass reads several row tiles down its columns: the largest value,
    or an Inf, in any of them (the first and last rows of a program, a later tile, the ragged
    last program) sets the scale of a per-tensor and a per-column spec."""
    x = torch.randn(300, 130, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    x[row, 129] = 1e4
    for spec in (SPECS["e5m2-tensor"], SPECS["fp4-column"]):
        _check(x, spec, 0)
    x[row, 129] = INF
    assert _check(x, SPECS["e4m3-tensor"], 0).isnan().all()


def test_long_rows_are_read_in_chunks(monkeypatch):
    """Rows longer than the chunk a program holds loop over it (the same bits)."""
    monkeypatch.setattr(launch_vector, "ROW_CHUNK", 16)
    x = edge_tensor(9, 45, seed=2)
    for spec in (SPECS["fp4-row"], SPECS["e4m3-row-floor"]):
        _check(x, spec, 1)
    _check_clamp(x, 0.9)
    _check_clamp(x, 0.6)


def _check_clamp(x, quantile, residual=False):
    """The fused clamp (+ quantize) against clamp_outliers + fake_quantize, up to the sign of a
    zero threshold (torch.sort leaves the order of -0.0 and 0.0 open)."""
    spec = SPECS["fp4-row"]
    config = OutlierConfig(quantile, compensate=residual, method="nearest")
    clamped, rest = clamp_outliers(x, config)
    expected = fake_quantize(clamped, spec, axis=1, backend="torch")
    if residual:
        expected = (expected.float() + rest.float()).to(x.dtype)
    ranks = nearest_ranks(x.shape[1], quantile)
    got, _ = quantize_vector(x, spec, 1, x.dtype, clamp=Clamp(*ranks, residual))
    assert_same_up_to_zero_sign(got, expected, f"clamp q={quantile}")


@pytest.mark.parametrize("quantile", [0.99, 0.9, 0.75])
def test_clamp_equals_the_reference_quantiles(quantile):
    x = edge_tensor(23, 150, seed=3)
    x[8, :20] = 9.0  # ties at the top
    x[9, :] = torch.arange(150.0) % 3  # ties everywhere, zeros at the bottom
    x[10, :2] = torch.tensor([INF, -INF])  # clamped away: one value beyond each rank
    x[11, :] = INF
    x[12, :] = torch.linspace(-1e-40, 1e-40, 150)
    x[13, ::16] = torch.tensor([1e30, -1e30] * 5)  # a few outlier columns
    x[14, :] = torch.linspace(-1.0, 1.0, 150)
    x[14, 3] = NAN  # one NaN among ordered values
    _check_clamp(x, quantile)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_clamp_of_16_bit_inputs_searches_only_their_bits(dtype, monkeypatch):
    """A bf16 (fp16) row's keys have 16 (13) low zero bits, which the threshold search skips;
    negative thresholds, ties, Inf rows and subnormals included; several rows a program, and
    one (a row per program, as on a GPU)."""
    x = edge_tensor(23, 150, seed=6)
    x[8, :20] = -9.0
    x[9, :] = torch.arange(150.0) % 3 - 1
    x[11, :] = INF
    x[12, :] = torch.linspace(-1e-6, 1e-6, 150)
    for chunk in (4096, 256):
        monkeypatch.setattr(launch_vector, "ROW_CHUNK", chunk)
        for quantile in (0.99, 0.75):
            _check_clamp(x.to(dtype), quantile)


def test_short_rows_are_not_clamped():
    """Rows shorter than 1 / (1 - q) keep every value (the ranks are the row's ends)."""
    x = edge_tensor(12, 45, seed=4)
    assert nearest_ranks(45, 0.99) == (0, 44)
    _check_clamp(x, 0.99)


def test_compensation_adds_the_residual_once():
    _check_clamp(edge_tensor(15, 120, seed=5), 0.95, residual=True)


def test_fused_amax_feeds_a_per_tensor_spec_of_the_written_values():
    """Double quantization: the forward pass reduces the amax of what it writes, and the
    per-tensor FP8 cast of those values from it equals the reference's."""
    x = edge_tensor(19, 33, seed=6)
    x[1, 4] = 2.0  # finite: otherwise everything downstream is NaN
    x[2, 7] = -1.0
    amax = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    forward, _ = quantize_vector(x, SPECS["fp4-row"], 1, x.dtype, amax_out=amax)
    spec = SPECS["e4m3-tensor"]
    codes, scales = quantize_vector(forward, spec, 0, None, scales=True, amax=amax)
    expected = fake_quantize(forward, spec, axis=0, backend="torch")
    assert_bits(decode_vector(codes, scales, spec, 0, x.dtype), expected, "double quantized")
    assert amax.item() == forward.abs().max().view(torch.int32).item()


@pytest.mark.parametrize("name", ["e4m3-tensor", "e5m2-column"])
@pytest.mark.parametrize("shape", [(70, 45), (33, 130), (1, 3), (600, 45)])
def test_the_amax_pass_sums_the_columns(name, shape):
    """column_sums: each column's float32 sum from the amax pass's read, over each program's
    tiles, then over the programs (600 rows: three programs down a column, the last ragged):
    on integers every order gives the same sums, so they equal torch's exactly; the quantized
    operand is unchanged by asking for them."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randint(-300, 301, shape, generator=generator).float().to(DEVICE)
    spec, axis = SPECS[name], 1  # one scale per tensor, or per column
    sums = torch.full((shape[1],), NAN, device=DEVICE)
    values, _ = quantize_vector(x, spec, axis, x.dtype, column_sums=sums)
    assert_bits(sums, x.sum(0), "column sums")
    assert_bits(values, fake_quantize(x, spec, axis=axis, backend="torch"), "values")
    sums.fill_(NAN)
    codes, codes_t, _ = quantize_codes(x, spec, axis, rows_out=True, transposed=True,
                                       column_sums=sums)  # fmt: skip
    assert codes is not None and codes_t is not None and torch.equal(codes_t, codes.t())
    assert_bits(sums, x.sum(0), "column sums with codes")


def test_column_sums_need_an_amax_pass():
    x, sums = torch.ones(4, 6, device=DEVICE), torch.empty(6, device=DEVICE)
    with pytest.raises(ValueError, match="amax pass"):
        quantize_vector(x, SPECS["fp4-row"], 1, x.dtype, column_sums=sums)
    amax = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="amax pass"):
        quantize_vector(x, SPECS["e4m3-tensor"], 1, x.dtype, amax=amax, column_sums=sums)
    with pytest.raises(ValueError, match="float32 of shape"):
        quantize_vector(x, SPECS["e4m3-tensor"], 1, x.dtype, column_sums=sums[:5])


def test_specs_the_kernels_refuse_are_named():
    gap = launch_vector.vector_spec_gap
    assert gap(QuantSpec.preset("mxfp4")) == ("block 32 (vector-wise kernels: row, column, tensor)")
    assert gap(QuantSpec.preset("fp8-e4m3")) == "scale 'fp32' (vector-wise kernels: e8m0)"
    assert gap(QuantSpec(element="int4", block="row")) == (
        "element 'int4' (vector-wise kernels: e2m1, e4m3, e5m2)"
    )
    assert gap(QuantSpec(block="row", rounding="sr")) == (
        "rounding 'sr' (vector-wise kernels: rne, ties_up)"
    )
    with pytest.raises(ValueError, match="one scale per row"):
        quantize_vector(torch.ones(4, 4, device=DEVICE), SPECS["fp4-column"], 1, None,
                        clamp=Clamp(0, 3))  # fmt: skip


def test_the_vector_wise_launches_compile_for_hopper():
    pytest.importorskip("triton.backends.nvidia")
    done = run_compiler_module("tests.hopper_compile_vector")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "25"  # with MS-AMP's bfloat16 scales: 3 more
