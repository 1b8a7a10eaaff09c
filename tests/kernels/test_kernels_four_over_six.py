"""Four-over-six in the quantize and pair kernels against the reference quantizer, bit for bit:
each block's choice between its amax scaled to 6 and to 4, on every scale family, with SR,
the guide, a Hadamard transform, 2-D weight tiles read both ways, and the edge cases (ties of
the two candidates, zeros, subnormals, huge blocks, NaN and Inf). Interpreter on the CPU, or a
GPU."""

import pytest
import torch

from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.four_over_six import block_errors, error_units
from tests.kernel_cases import (  # skips this module where the kernels cannot run
    FP32_MAX,
    INF,
    assert_bits,
    edge_blocks,
    on_device,
    seeded_normal,
)
from tests.kernel_checks import assert_same_up_to_zero_sign, check_backends_agree

launch_pair = pytest.importorskip("fp4cli.kernels.quantization.launch_pair")
Direction, quantize_pair = launch_pair.Direction, launch_pair.quantize_pair

NVFP4_46 = QuantSpec.preset("nvfp4-4over6")  # UE4M3 per 16, FP32 tensor scale (S = 256)
SPECS = {
    "nvfp4": NVFP4_46,
    "nvfp4-sr": NVFP4_46.replace(rounding="sr"),
    "nvfp4-ceil-away": NVFP4_46.replace(scale_rule="ceil", rounding="away"),
    "nvfp4-block32": NVFP4_46.replace(block=32),
    "ue5m3-ts": QuantSpec.preset("mxfp4-ue5m3", four_over_six=True, tensor_scale=True),
    "ue4m3-per-block": QuantSpec(scale="ue4m3", block=16, four_over_six=True),
    "e8m0-ceil": QuantSpec(scale_rule="ceil", four_over_six=True),
    "e8m0-ceil-sr": QuantSpec(scale_rule="ceil", rounding="sr", four_over_six=True),
    # TransformerEngine's metric: the absolute errors, exact sums alone
    "nvfp4-mae": NVFP4_46.replace(four_over_six_metric="mae"),
    "nvfp4-sr-mae": NVFP4_46.replace(rounding="sr", four_over_six_metric="mae"),
    "e8m0-ceil-mae": QuantSpec(scale_rule="ceil", four_over_six=True, four_over_six_metric="mae"),
}
PER_BLOCK_MAE = SPECS["ue4m3-per-block"].replace(four_over_six_metric="mae")


def _fours(x, spec, axis):
    """The share of finite blocks whose scale the candidate scaled to 4 set (the reference's)."""
    chosen = quantize(x, spec, axis=axis, seed=11, backend="torch").scale_values()
    sixes = quantize(x, spec.replace(four_over_six=False), axis=axis, seed=11, backend="torch")
    if spec.tensor_scale:  # S differs: compare the scales against both candidates' rules
        return None
    finite = chosen.isfinite()
    return (chosen[finite] != sixes.scale_values()[finite]).float().mean().item()


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("axis", [0, 1])
def test_the_kernels_match_the_reference(name, axis):
    check_backends_agree(edge_blocks(), SPECS[name], axis=axis, seed=11)


def test_both_candidates_win_somewhere():
    """The inputs exercise the choice: some blocks keep 6, others take 4."""
    x = edge_blocks()
    x[4:7] = 1.0
    share = _fours(x, SPECS["ue4m3-per-block"], 1)
    assert share is not None and 0.1 < share < 0.9


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-sr"])
def test_ragged_and_bfloat16_inputs(name):
    x = edge_blocks(37, 100, seed=4)[:, 25:75].contiguous()  # 50 wide: a partial block each row
    check_backends_agree(x, SPECS[name], axis=1, seed=3)
    check_backends_agree(x, SPECS[name], axis=0, seed=3)
    finite = x.nan_to_num(0.0, 0.0, 0.0).clamp(-1e30, 1e30)
    check_backends_agree(finite.to(torch.bfloat16), SPECS[name], axis=1, seed=3)


@pytest.mark.parametrize("name", ["nvfp4", "nvfp4-sr"])
def test_with_a_hadamard_transform(name):
    x = edge_blocks(seed=3)[7:]  # finite rows: the tensor amax of the transform
    check_backends_agree(x, SPECS[name], seed=5, hadamard=16, hadamard_seed=9)


def test_the_guide():
    x = edge_blocks(seed=5)
    guide = x + on_device(seeded_normal(tuple(x.shape), 6)) * x.abs() * 0.2
    for spec in (SPECS["nvfp4"], SPECS["e8m0-ceil"]):
        kernel = fake_quantize(x, spec, guide=guide, backend="triton")
        reference = fake_quantize(x, spec, guide=guide, backend="torch")
        assert_same_up_to_zero_sign(kernel, reference, "guided")


def test_ties_keep_six_and_nearer_four_wins():
    """NVFP4 with the tensor amax at 256 * 6 = 1536 (global scales 1): a block of 6 and 3 is
    exact both ways (6 = 1 * 6 = 1.5 * 4, 3 = 1 * 3 = 1.5 * 2): a tie keeps scale 1; a block
    of 5 and 4 is nearer scaled to 4 (scale 1.25: 5, 3.75); an all-zero block keeps 6."""
    x = torch.zeros(2, 48)
    x[0, 0] = 1536.0
    x[0, 16], x[0, 17] = 6.0, 3.0
    x[0, 32], x[0, 33] = 5.0, 4.0
    x[1, :16] = 1536.0 * torch.linspace(-1, 1, 16)
    for backend in ("torch", "triton"):
        scales = quantize(on_device(x), NVFP4_46, backend=backend).scale_values().cpu()
        assert scales[0].tolist() == [256.0, 1.0, 1.25], backend
        assert scales[1, 1:].tolist() == [0.0, 0.0], backend  # zero blocks: scale 0, 6's
    check_backends_agree(on_device(x), NVFP4_46)


def test_a_candidate_that_decodes_to_infinity_loses():
    """E8M0 with the ceil rule near FLT_MAX: scaled to 4, a block takes scale 2^127, on which
    its 6s decode to Inf (an infinite error); the kernels choose as the reference does."""
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 1] = FP32_MAX, 2.5e38
    x[1, 0], x[1, 1] = 3.0e38, -3.0e38
    check_backends_agree(on_device(x), SPECS["e8m0-ceil"])
    check_backends_agree(on_device(x), SPECS["e8m0-ceil-sr"], seed=2)


@pytest.mark.parametrize("axis", [0, 1])
def test_near_ties_on_both_sides_of_the_float32_estimate(axis):
    """Blocks of 6 and v = 2.125 + k * 2^-22 (UE4M3 scales 1 and 1.5): scaled to 6, v decodes
    to 2 (error 0.125 + k ulps); scaled to 4, to 2.25 (0.125 - k ulps), so four wins exactly for
    k > 0. The kernels' float32 sums tell the two apart for |k| > 16 and leave the tiles with
    |k| <= 16 to the exact integer sums: both give the reference's choice, in the single-
    direction kernel and in the pair kernel (alone, with the estimate, and beside the other
    direction, on the exact sums only), along and across the blocks."""
    spec = SPECS["ue4m3-per-block"]
    steps = torch.arange(-200, 201, dtype=torch.float32)
    x = torch.zeros(len(steps), 16)
    x[:, 0] = 6.0
    x[:, 1] = 2.125 + steps * 2.0**-22
    x = on_device(x if axis == 1 else x.T.contiguous())
    chosen = quantize(x, spec, axis=axis, backend="triton").scale_values().cpu().reshape(-1)
    assert chosen.tolist() == torch.where(steps > 0, 1.5, 1.0).tolist()
    check_backends_agree(x, spec, axis=axis)
    expected = quantize(x, spec, axis=axis, backend="torch").scales
    lone = (Direction(spec), None) if axis == 1 else (None, Direction(spec))
    assert_bits(quantize_pair(x, *lone)[1 - axis].scales, expected, "a lone direction's scales")
    both = quantize_pair(x, Direction(spec), Direction(spec))[1 - axis]
    assert_bits(both.scales, expected, "the pair's scales")


@pytest.mark.parametrize("hadamard", [None, 16])
def test_the_pair_kernel_writes_both_directions(hadamard):
    """Activation-like pairs (X: values one way, codes the other), two-level, SR on one."""
    x = edge_blocks(64, 96, seed=8)
    x[4:7] = 1.0  # the pair's amax pass reads the tensor: finite values only
    for row_spec, col_spec in ((SPECS["nvfp4"], SPECS["nvfp4"]), (SPECS["nvfp4-sr"], NVFP4_46)):
        row = Direction(row_spec, 3, hadamard, 5, torch.float32)
        col = Direction(col_spec, 4, hadamard, 6)
        row_out, col_out = quantize_pair(x, row, col)
        args = dict(hadamard=hadamard, hadamard_seed=5, backend="torch")
        assert_same_up_to_zero_sign(
            row_out.values, fake_quantize(x, row_spec, 1, 3, **args), "row values"
        )
        reference = quantize(x, col_spec, 0, 4, hadamard=hadamard, hadamard_seed=6, backend="torch")
        assert_bits(col_out.codes, reference.codes, "column codes")
        assert_bits(col_out.scales, reference.scales, "column scale codes")


def test_square_tiles_choose_alike_both_ways():
    """nvfp4-2d with four-over-six (a weight's 16 x 16 tiles): the pair kernel's two directions
    are the reference's along each axis, and those are one tensor (each tile's choice is the
    same read along its rows or down its columns)."""
    spec = QuantSpec.preset("nvfp4-2d", four_over_six=True)
    w = edge_blocks(48, 80, seed=9)[7:]  # finite: one tensor amax
    w[0, :16] = 0.0
    row = Direction(spec, None, None, 0, torch.float32)
    col = Direction(spec, None, None, 0, torch.float32)
    row_out, col_out = quantize_pair(w, row, col)
    along_rows = fake_quantize(w, spec, axis=1, backend="torch")
    down_columns = fake_quantize(w, spec, axis=0, backend="torch")
    assert_bits(along_rows, down_columns, "the reference both ways")
    assert_same_up_to_zero_sign(row_out.values, along_rows, "row values")
    assert_same_up_to_zero_sign(col_out.values, down_columns, "column values")


def test_the_integer_error_by_hand():
    """amax 3 (exponent field 128, E = 2): unit 2^22; errors 0.5 and -0.25 add
    (2^21)^2 + (2^20)^2; a value decoding to Inf makes the error the int64 maximum."""
    amax = torch.tensor([3.0, 0.0, 1e-40])
    assert error_units(amax).tolist() == [2.0**22, 2.0**149, 2.0**149]
    blocks = torch.tensor([[3.0, 1.0, 0.0]])
    decoded = torch.tensor([[3.5, 0.75, 0.0]])
    assert block_errors(blocks, decoded, amax[:1]).tolist() == [2**42 + 2**40]
    decoded[0, 2] = INF
    assert block_errors(blocks, decoded, amax[:1]).tolist() == [torch.iinfo(torch.int64).max]


def test_the_absolute_error_by_hand():
    """amax 3: unit 2^22, the absolute error's 2^46; errors 0.5 and -0.25 add 2^45 + 2^44."""
    blocks = torch.tensor([[3.0, 1.0, 0.0]])
    decoded = torch.tensor([[3.5, 0.75, 0.0]])
    amax = torch.tensor([3.0])
    assert block_errors(blocks, decoded, amax, "mae").tolist() == [2**45 + 2**44]
    decoded[0, 2] = -INF
    assert block_errors(blocks, decoded, amax, "mae").tolist() == [torch.iinfo(torch.int64).max]


@pytest.mark.parametrize("axis", [0, 1])
def test_the_two_metrics_choose_apart(axis):
    """UE4M3 per 16, a block of 6, 5, 1, 1, 1: scaled to 6 (scale 1) 5 rounds to 4 (a tie, to
    the even code), errors 0, 1, 0, 0, 0; scaled to 4 (scale 1.5) 5 -> 3 * 1.5 = 4.5 and each
    1 -> 0.5 * 1.5 = 0.75: errors 0, 0.5, 0.25, 0.25, 0.25. Squared: 1 against 0.4375, four
    wins; absolute: 1 against 1.25, six wins. Both backends, the pair kernel too."""
    x = torch.zeros(1, 16)
    x[0, :5] = torch.tensor([6.0, 5.0, 1.0, 1.0, 1.0])
    x = on_device(x if axis == 1 else x.T.contiguous())
    expected = {"mse": 1.5, "mae": 1.0}
    for metric, scale in expected.items():
        spec = SPECS["ue4m3-per-block"].replace(four_over_six_metric=metric)
        for backend in ("torch", "triton"):
            chosen = quantize(x, spec, axis=axis, backend=backend).scale_values()
            assert chosen.reshape(-1).tolist() == [scale], (metric, backend)
        lone = (Direction(spec), None) if axis == 1 else (None, Direction(spec))
        reference = quantize(x, spec, axis=axis, backend="torch").scales
        assert_bits(quantize_pair(x, *lone)[1 - axis].scales, reference, f"pair, {metric}")


@pytest.mark.parametrize("row_metric", ["mse", "mae"])
def test_the_pair_kernel_with_the_absolute_metric(row_metric):
    """The pair kernel's directions with either metric beside the other (the absolute errors on
    their exact sums, the squared on the estimate where it tells): the reference's codes and
    values both ways."""
    x = edge_blocks(64, 96, seed=12)
    x[4:7] = 1.0
    row_spec = NVFP4_46.replace(four_over_six_metric=row_metric)
    for col_spec in (SPECS["nvfp4-mae"], NVFP4_46):
        row = Direction(row_spec, 3, None, 0, torch.float32)
        col = Direction(col_spec, 4, None, 0)
        row_out, col_out = quantize_pair(x, row, col)
        assert_same_up_to_zero_sign(
            row_out.values, fake_quantize(x, row_spec, 1, 3, backend="torch"), "row values"
        )
        reference = quantize(x, col_spec, 0, 4, backend="torch")
        assert_bits(col_out.codes, reference.codes, "column codes")
        assert_bits(col_out.scales, reference.scales, "column scale codes")


def test_the_metric_is_a_four_over_six_option():
    with pytest.raises(SpecError, match="four_over_six_metric: only applies with four_over_six"):
        QuantSpec(four_over_six_metric="mae")
    with pytest.raises(SpecError, match="four_over_six_metric: must be one of mse, mae"):
        NVFP4_46.replace(four_over_six_metric="max")
    assert PER_BLOCK_MAE.short().endswith("4over6mae")


@pytest.mark.parametrize("prescale", [0.75, 16 / 17])
@pytest.mark.parametrize("metric", ["mse", "mae"])
def test_with_the_sr_pre_scale(prescale, metric):
    """Four-over-six with SR after a pre-scale (Four Over Six's gradients: 16/17): each
    candidate decoded over the pre-scale as the reference divides, in both kernels."""
    spec = NVFP4_46.replace(rounding="sr", sr_prescale=prescale, four_over_six_metric=metric)
    x = edge_blocks(seed=6)
    check_backends_agree(x, spec, axis=1, seed=1)
    check_backends_agree(x, spec, axis=0, seed=1)
    finite = x[7:]
    row = Direction(spec, 3, 16, 5, torch.float32)
    col = Direction(spec, 4, None, 0)
    row_out, col_out = quantize_pair(finite, row, col)
    options = dict(hadamard=16, hadamard_seed=5, backend="torch")
    assert_same_up_to_zero_sign(
        row_out.values, fake_quantize(finite, spec, 1, 3, **options), "row values"
    )
    reference = quantize(finite, spec, 0, 4, backend="torch")
    assert_bits(col_out.codes, reference.codes, "column codes")
    assert_bits(col_out.scales, reference.scales, "column scale codes")


def test_the_pre_scale_changes_the_choice_somewhere():
    """The pre-scaled candidates are compared as such: on these blocks the choices under 16/17
    differ from those without a pre-scale (so the decoding over it is exercised)."""
    x = edge_blocks(seed=6)[7:]
    base = NVFP4_46.replace(rounding="sr")
    plain = quantize(x, base, seed=1, backend="triton").scales
    prescaled = quantize(x, base.replace(sr_prescale=16 / 17), seed=1, backend="triton").scales
    assert not torch.equal(plain, prescaled)
