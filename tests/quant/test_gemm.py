"""The MXFP4 GEMM (fp4cli.mxfp4_matmul and its kernels) against its definition,
`matmul_reference` (float64).

On the CPU the kernels run under TRITON_INTERPRET=1 (`make test` sets it) with float32 data;
tests/gpu/test_gpu_gemm.py runs them compiled. Operands from tests/gemm_cases.py keep every float32
partial sum exact, so kernel and reference are compared bit for bit (atol=0) whatever the order
of summation; the sign of a zero result is not compared (int32 sums give +0 where float64 may
keep -0).
"""

from __future__ import annotations

import pytest
import torch

import fp4cli
from fp4cli.gemm import GemmError, gemm_path, matmul_reference, mxfp4_matmul
from fp4cli.quant import QuantSpec, SpecError, quantize
from fp4cli.quant.backend import interpreter_on, triton_available
from tests.gemm_cases import (
    MXFP4,
    exact_sum_pair,
    flushed_bound,
    nan_block,
    quantized,
    spread_rows,
    with_fields,
    zero_block,
)
from tests.kernel_checks import assert_bits

KERNELS = triton_available() and (interpreter_on() or torch.cuda.is_available())
needs_kernels = pytest.mark.skipif(
    not KERNELS, reason="the GEMM kernels need TRITON_INTERPRET=1 (CPU) or a CUDA GPU"
)
DEVICE = "cpu" if interpreter_on() or not torch.cuda.is_available() else "cuda"
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


def assert_matches(actual: torch.Tensor, expected: torch.Tensor, what: str = "product") -> None:
    """Bit for bit, except the sign of zero."""
    assert_bits(
        torch.where(actual == 0, 0.0, actual), torch.where(expected == 0, 0.0, expected), what
    )


def run(a, b, mode: str = "exact", out_dtype: torch.dtype = torch.float32, **kwargs):
    return mxfp4_matmul(a, b, out_dtype, mode, backend="triton", **kwargs)


# --------------------------------------------------------------------------------------------
# Exact and fast on ordinary data
# --------------------------------------------------------------------------------------------

SHAPES = [(1, 1, 32), (1, 16, 32), (33, 17, 100), (64, 48, 256), (5, 70, 200), (40, 33, 7)]


@needs_kernels
@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_reference_bit_for_bit(mode: str, shape: tuple[int, int, int]) -> None:
    a, b = exact_sum_pair(*shape, seed=sum(shape), device=DEVICE)
    assert_matches(run(a, b, mode), matmul_reference(a, b, torch.float32))


@needs_kernels
@pytest.mark.parametrize("block", [64, 96, 128, 256])
def test_larger_blocks(block: int) -> None:
    spec = QuantSpec.preset("mxfp4", block=block)
    a, b = exact_sum_pair(20, 24, 256, seed=block, device=DEVICE, spec=spec)
    for mode in ("exact", "fast"):
        assert_matches(run(a, b, mode), matmul_reference(a, b, torch.float32), mode)


# the interpreter's float32 -> bfloat16 conversion truncates: bfloat16 is tested on a GPU
OUT_DTYPES = [torch.float16] + ([] if interpreter_on() else [torch.bfloat16])


@needs_kernels
@pytest.mark.parametrize("out_dtype", OUT_DTYPES)
def test_output_dtypes_round_the_float32_result(out_dtype: torch.dtype) -> None:
    a, b = exact_sum_pair(9, 12, 96, seed=3, device=DEVICE)
    expected = matmul_reference(a, b, torch.float32).to(out_dtype)
    assert_matches(run(a, b, out_dtype=out_dtype), expected)


@needs_kernels
@pytest.mark.parametrize("path", ["exact", "fast", "weight-only", "scaled-dot"])
def test_the_bias_joins_the_sums_before_their_rounding(path: str) -> None:
    """Every kernel adds the bias to its float32 sums and rounds once, as the reference (and
    cuBLAS's epilogue) does: sums exact in float32, so the bits are the reference's; and a
    sum on a float16 tie that the bias decides."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import scaled_dot_matmul

    a, b = exact_sum_pair(19, 24, 96, seed=21, device=DEVICE)
    bias = torch.randn(24, generator=torch.Generator().manual_seed(22)).to(DEVICE)
    expected = matmul_reference(a, b, torch.float32, bias)
    if path == "scaled-dot":
        got = torch.full((19, 24), float("nan"), device=DEVICE)
        scaled_dot_matmul(kernel_operand(a), kernel_operand(b), got, bias=bias)
    elif path == "weight-only":
        got = run(a.dequantize(torch.float32), b, bias=bias)
    else:
        got = run(a, b, path, bias=bias)
    assert_matches(got, expected)
    assert not torch.equal(expected, matmul_reference(a, b, torch.float32))
    # 1 + 2^-11 lies halfway between two float16 numbers; 2^-13 more rounds it up
    row = torch.zeros(1, 64)
    row[0, 0], row[0, 32] = 1.0, 2.0**-11
    ones = torch.zeros(1, 64)
    ones[0, 0] = ones[0, 32] = 1.0
    a_tie, b_tie = (quantize(t.to(DEVICE), MXFP4, axis=-1, backend="torch") for t in (row, ones))
    bias_tie = torch.tensor([2.0**-13], device=DEVICE)
    if path in ("exact", "fast"):
        tie = run(a_tie, b_tie, path, torch.float16, bias=bias_tie)
        assert tie.item() == 1 + 2.0**-10
        assert_matches(tie, matmul_reference(a_tie, b_tie, torch.float16, bias_tie))


# --------------------------------------------------------------------------------------------
# The exact GEMM's tiers, chosen per tile by the spread of its rows' block scales
# --------------------------------------------------------------------------------------------


def tier_flags(q) -> list[int]:
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import prepare

    operand = kernel_operand(q)
    return prepare(operand, operand, tier_flags=True).flags(operand.rows)[0].tolist()


@needs_kernels
@pytest.mark.parametrize(
    "binades, flag", [(3, 0), (4, 4), (26, 4), (27, 6), (60, 6)], ids=lambda v: str(v)
)
def test_spread_chooses_the_tier_and_stays_exact(binades: int, flag: int) -> None:
    """Rows 3 and 40 span `binades`: 0-3 stay on INT8 (flag 0), 4-26 go to FP8 (flag 4), more
    to the per-window kernel (flags 2 | 4). B's first block is zero, so the raised blocks add
    only exact zeros and the result stays exactly representable."""
    a, b = exact_sum_pair(48, 40, 128, seed=binades, device=DEVICE)
    a = spread_rows(a, [3, 40], binades)
    b = zero_block(b, 0)
    flags = tier_flags(a)
    assert flags[3] == flags[40] == flag
    out = torch.full((48, 40), float("nan"), device=DEVICE)
    run(a, b, out=out)
    assert_matches(out, matmul_reference(a, b, torch.float32))
    # each tile takes the bias once, whichever tier's kernel writes it
    bias = torch.linspace(-3, 3, 40, device=DEVICE)
    assert_matches(run(a, b, bias=bias), matmul_reference(a, b, torch.float32, bias))


@needs_kernels
@pytest.mark.parametrize("tiles", ["default", "int8-twice-fp8"])
def test_every_tile_is_written_when_the_tiers_tile_differently(tiles: str) -> None:
    """INT8 tiles of two FP8 tiles' rows (the GPU's: 256 against 128): an INT8 tile with one
    row beyond INT8 (row 3) is left to the FP8 kernel, whose tiles must then write all of its
    rows, those within INT8's range too (rows 32..63 here, 128..255 on a GPU)."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import GemmTile, exact_matmul

    chosen = None
    if tiles != "default":
        chosen = (GemmTile(64, 32, 64, 4, 1, 4), GemmTile(32, 32, 64, 4, 1, 4))
    a, b = exact_sum_pair(600, 40, 128, seed=4, device=DEVICE)
    a = spread_rows(a, [3], 4)  # flag 4: beyond INT8, within E5M2
    assert tier_flags(a)[3] == 4 and set(tier_flags(a)[4:]) == {0}
    out = torch.full((600, 40), float("nan"), device=DEVICE)
    exact_matmul(kernel_operand(a), kernel_operand(b), out, tiles=chosen)
    assert_matches(out, matmul_reference(a, b, torch.float32))


@needs_kernels
def test_fp8_tiles_must_tile_the_int8_tiles() -> None:
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import GemmTile, exact_matmul

    a, b = exact_sum_pair(48, 40, 128, seed=4, device=DEVICE)
    tiles = (GemmTile(48, 32, 64, 4, 1, 4), GemmTile(32, 32, 64, 4, 1, 4))
    with pytest.raises(ValueError, match="INT8 tiles 48 x 32 are not whole FP8 tiles 32 x 32"):
        exact_matmul(kernel_operand(a), kernel_operand(b), torch.empty(48, 40), tiles=tiles)


@needs_kernels
def test_far_block_that_dominates_is_kept_exactly() -> None:
    """A block 40 binades below its row's largest, paired with B's only nonzero values there:
    the whole result comes from it. Exact mode keeps it; fast mode flushes it, within the
    stated bound (each product with a block beyond the fold range)."""
    a, b = exact_sum_pair(24, 16, 128, seed=11, device=DEVICE)
    a = spread_rows(a, list(range(24)), 40)
    b = zero_block(b, 0)
    reference = matmul_reference(a, b, torch.float32)
    assert reference.abs().max() > 0
    assert_matches(run(a, b, "exact"), reference)
    fast = run(a, b, "fast")
    assert not torch.equal(fast, reference)
    bound = flushed_bound(a, b, fold_range=26).float()
    assert ((fast - reference).abs() <= bound).all()


@needs_kernels
def test_zero_rows_blocks_and_negative_zeros() -> None:
    a, b = exact_sum_pair(20, 18, 128, seed=5, device=DEVICE)
    a = zero_block(a, 1)  # a block of zeros in every row
    codes = a.codes.clone()
    codes[4] = 0  # an all-zero row
    codes[5] = 0x88  # a row of negative zeros
    a = type(a)(codes, a.scales, None, a.shape, a.spec, a.axis, a.dtype, a.layout)
    for mode in ("exact", "fast"):
        out = run(a, b, mode)
        assert_matches(out, matmul_reference(a, b, torch.float32), mode)
        assert (out[4] == 0).all() and (out[5] == 0).all()


@needs_kernels
@pytest.mark.parametrize("mode", ["exact", "fast"])
def test_nan_blocks_make_their_row_and_column_nan(mode: str) -> None:
    a, b = exact_sum_pair(20, 18, 96, seed=7, device=DEVICE)
    a, b = nan_block(a, 3, 1), nan_block(b, 9, 2)
    out = run(a, b, mode)
    expected = matmul_reference(a, b, torch.float32)
    assert out[3].isnan().all() and out[:, 9].isnan().all()
    assert_matches(out, expected)


# --------------------------------------------------------------------------------------------
# Outlier columns: K split between the FP8 and INT8 tiers (`gemm.split`)
# --------------------------------------------------------------------------------------------


def outlier_pair(m: int, n: int, columns: list[int], block: int = 32, lift: int = 8):
    """A (m, 256) with every row's blocks at scale code 120 but those in `columns`, `lift`
    binades higher (outlier channels); B (n, 256) at one scale. Products span at most 2^(lift +
    7.2), so with K = 256 every float32 partial sum stays exact for lift <= 8."""
    spec = QuantSpec.preset("mxfp4", block=block)
    a, b = exact_sum_pair(m, n, 256, seed=len(columns) + block, device=DEVICE, spec=spec)
    scales = torch.full_like(a.scales, 120)
    scales[:, columns] = 120 + lift
    return with_fields(a, scales=scales), with_fields(b, scales=torch.full_like(b.scales, 121))


def split_of(a, b):
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.split import k_split

    a_op, b_op = kernel_operand(a), kernel_operand(b)
    return a_op, b_op, k_split(a_op.scales, b_op.scales, a_op.block)


@needs_kernels
@pytest.mark.parametrize("columns", [[], [2], [2, 5], [0, 3, 7]], ids=str)
def test_outlier_columns_go_to_fp8_and_the_rest_stays_on_int8(columns: list[int]) -> None:
    from fp4cli.kernels.gemm.launch import prepare

    a, b = outlier_pair(40, 36, columns)
    a_op, b_op, split = split_of(a, b)
    order = columns + [c for c in range(8) if c not in columns]
    assert split.source.tolist() == order
    assert split.lo_start.tolist() == [(len(columns) + 1) // 2 * 2]
    prepared = prepare(a_op, b_op, int8=True, e5m2=True, tier_flags=True, split=split)
    assert prepared.flags(40)[0].tolist() == [0] * 40  # every row on the INT8 tier
    if columns:  # without the split, each row spans 8 binades: all to FP8
        assert tier_flags(a) == [4] * 40
    assert_matches(run(a, b), matmul_reference(a, b, torch.float32))


@needs_kernels
def test_outlier_blocks_of_64_split_as_their_two_windows() -> None:
    a, b = outlier_pair(24, 20, [1], block=64)
    _, _, split = split_of(a, b)
    assert split.source.tolist() == [2, 3, 0, 1, 4, 5, 6, 7]
    assert split.lo_start.tolist() == [2]
    assert_matches(run(a, b), matmul_reference(a, b, torch.float32))


@needs_kernels
def test_split_staging_is_the_unsplit_one_in_the_splits_order() -> None:
    """E5M2 (folded against the row's reference) moves whole windows; INT8 folds the INT8
    segment against its own reference: 2^8 = 256 times the unsplit values, which flush."""
    from fp4cli.kernels.gemm.launch import prepare

    a, b = outlier_pair(8, 8, [1, 6])
    a_op, b_op, split = split_of(a, b)
    plain = prepare(a_op, b_op, int8=True, e5m2=True)
    moved = prepare(a_op, b_op, int8=True, e5m2=True, split=split)
    source = split.source.long().cpu()
    windows = (source.repeat_interleave(32) * 32 + torch.arange(32).repeat(8)).to(DEVICE)
    plain_e5m2 = plain.e5m2[0].view(torch.uint8)[:, windows]
    assert torch.equal(moved.e5m2[0].view(torch.uint8), plain_e5m2)
    lo = slice(64, 256)
    assert (plain.int8[0][:, windows][:, lo] == 0).all()  # 8 binades down: beyond INT8
    values = a.dequantize(torch.float64)[:, windows.cpu()][:, lo]
    assert_bits(moved.int8[0][:, lo].double().cpu() * 2.0 ** (120 - 127 - 4), values.cpu())
    assert moved.facts[2, :8].tolist() == [120] * 8 and moved.facts[0, :8].tolist() == [128] * 8


@needs_kernels
def test_rows_the_split_cannot_hold_take_the_fp8_tiers() -> None:
    """Row 3 spans 4 binades inside the INT8 segment (flag 4: FP8); row 9's INT8 segment lies
    70 binades below its outlier blocks, past GAP_LIMIT and E5M2's fold range (flags 6: per
    window). B's outlier columns are zero, so the result stays exactly representable."""
    from fp4cli.kernels.gemm.launch import prepare

    a, b = outlier_pair(16, 12, [2, 5])
    scales = a.scales.clone()
    scales[3, 4] = 116
    scales[9, [2, 5]] = 190
    a = with_fields(a, scales=scales)
    b = zero_block(zero_block(b, 2), 5)
    a_op, b_op, split = split_of(a, b)
    assert split.lo_start.tolist() == [2]
    flags = prepare(a_op, b_op, tier_flags=True, split=split).flags(16)[0].tolist()
    assert flags[3] == 4 and flags[9] == 6 and flags.count(0) == 14
    out = torch.full((16, 12), float("nan"), device=DEVICE)
    run(a, b, out=out)
    assert_matches(out, matmul_reference(a, b, torch.float32))


def test_outlier_columns_lie_more_than_two_binades_above_the_median() -> None:
    from fp4cli.kernels.gemm.split import outlier_columns

    scales = torch.full((4, 8), 100, dtype=torch.uint8)  # the median column: 100
    scales[:, 1] = 102  # exactly 2 above: not an outlier
    scales[:, 2] = 103  # 3 above
    scales[:2, 3] = 103
    scales[2:, 3] = 102  # mean 102.5, rounded down to 102
    scales[0, 5] = 140  # one row's spike: mean 110
    assert (
        outlier_columns(scales).tolist() == [False, False, True, False, False, True] + [False] * 2
    )


@needs_kernels
@pytest.mark.parametrize(
    "rows_a, rows_b, blocks, block",
    [(1, 1, 1, 32), (70, 3, 9, 32), (5, 130, 300, 32), (9, 7, 6, 64), (1000, 257, 12, 32)],
)
def test_the_split_kernels_follow_the_rule(rows_a, rows_b, blocks, block) -> None:
    """Random scale codes with random columns lifted (ties at the threshold included): the
    kernel's order and INT8 start are the rule's, for any sizes (chunks of 256 crossed, rows
    sampled)."""
    from fp4cli.kernels.gemm.split import HI_STEP, k_split, outlier_columns

    generator = torch.Generator().manual_seed(blocks + block)

    def codes(rows: int) -> torch.Tensor:
        base = torch.randint(118, 122, (rows, blocks), generator=generator)
        lift = torch.randint(0, 6, (blocks,), generator=generator) * (
            torch.rand(blocks, generator=generator) < 0.2
        )
        return (base + lift).to(torch.uint8)

    scales_a, scales_b = codes(rows_a), codes(rows_b)
    split = k_split(scales_a.to(DEVICE), scales_b.to(DEVICE), block)
    outlier = (outlier_columns(scales_a) | outlier_columns(scales_b)).repeat_interleave(block // 32)
    expected = torch.argsort((~outlier).to(torch.uint8), stable=True)
    assert split.source.tolist() == expected.tolist()
    count = int(outlier.sum())
    assert split.lo_start.tolist() == [(count + HI_STEP - 1) // HI_STEP * HI_STEP]


# --------------------------------------------------------------------------------------------
# Outputs, batches, weight-only, the Blackwell kernel
# --------------------------------------------------------------------------------------------


@needs_kernels
def test_out_is_overwritten_and_batched_a_keeps_its_leading_dims() -> None:
    a = quantized((2, 5, 64), 1, DEVICE)
    b = quantized((24, 64), 2, DEVICE)
    out = torch.full((2, 5, 24), float("nan"), device=DEVICE)
    result = run(a, b, out=out)
    assert result is out
    assert_matches(out, matmul_reference(a, b, torch.float32))
    strided = torch.full((24, 10), float("nan"), device=DEVICE).T  # (10, 24), not contiguous
    a2 = quantized((10, 64), 3, DEVICE)
    run(a2, b, out=strided)
    assert_matches(strided, matmul_reference(a2, b, torch.float32))


@needs_kernels
def test_weight_only_float_a() -> None:
    b = quantized((40, 96), 4, DEVICE)
    a_quantized = quantized((13, 96), 5, DEVICE)
    a = a_quantized.dequantize(torch.float32)  # float32 values whose products sum exactly
    assert gemm_path(a, b, "triton") == "weight-only"
    assert_matches(run(a, b), matmul_reference(a, b, torch.float32))
    generic = torch.randn(13, 96, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    result = run(generic, b)
    expected = matmul_reference(generic, b, torch.float64)
    bound = 96 * 2**-23 * (generic.abs().double() @ b.dequantize(torch.float64).abs().T)
    assert ((result.double() - expected).abs() <= bound).all()


@needs_kernels
def test_scaled_dot_kernel_matches_reference() -> None:
    """The Blackwell path's kernel (tl.dot_scaled), run here emulated."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import scaled_dot_matmul

    a, b = exact_sum_pair(33, 20, 160, seed=9, device=DEVICE)
    out = torch.full((33, 20), float("nan"), device=DEVICE)
    scaled_dot_matmul(kernel_operand(a), kernel_operand(b), out)
    assert_matches(out, matmul_reference(a, b, torch.float32))


@needs_kernels
def test_fused_decode_matches_staged() -> None:
    """Exact mode matches the reference; fast mode (the interpreter's dot sums exactly, a GPU's
    14-bit accumulation between promotions may round: tests/gpu bounds it) fused and staged
    alike."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import fp8_matmul

    a, b = exact_sum_pair(40, 36, 160, seed=12, device=DEVICE)
    a = spread_rows(a, [1, 2], 9)
    expected = matmul_reference(a, b, torch.float32)
    for exact in (True, False):
        name = "exact" if exact else "fast"
        outs = []
        for fused in (False, True):
            out = torch.full((40, 36), float("nan"), device=DEVICE)
            outs.append(fp8_matmul(kernel_operand(a), kernel_operand(b), out, exact, fused))
        assert_bits(outs[1], outs[0], f"{name}: fused against staged")
        if exact or interpreter_on():
            assert_matches(outs[0], expected, name)


# --------------------------------------------------------------------------------------------
# The staged 8-bit operands
# --------------------------------------------------------------------------------------------


@needs_kernels
def test_staged_operands_hold_every_code_at_every_shift() -> None:
    """Each row holds all 16 codes in every block, with block scales falling one binade per
    block from the row's largest: INT8, E5M2 and E4M3 staging times the row's scale give the
    dequantized values exactly within each format's range, and zero beyond it."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm.launch import prepare

    blocks = 30
    codes = torch.arange(16, dtype=torch.uint8).repeat(blocks * 2)  # 32 codes per block
    packed = (codes[0::2] | (codes[1::2] << 4)).reshape(1, -1).repeat(3, 1)
    top = torch.tensor([[200], [130], [60]])
    scales = (top - torch.arange(blocks)).to(torch.uint8)
    q = quantized((3, blocks * 32), 0, DEVICE)
    q = type(q)(packed.to(DEVICE), scales.to(DEVICE), None, q.shape, q.spec, 1, q.dtype, q.layout)
    other = kernel_operand(quantized((5, blocks * 32), 1, DEVICE))
    prepared = prepare(kernel_operand(q), other, True, True, True, tier_flags=True)
    expected = q.dequantize(torch.float64)
    below = torch.arange(blocks).repeat_interleave(32).to(DEVICE)
    ref = prepared.facts[0, :3].double()[:, None]
    assert prepared.e4m3_scales is not None
    assert_bits(prepared.e4m3_scales[0].double(), torch.exp2(ref[:, 0] - 133))
    for name, top_exponent, fold in (("int8", 4, 3), ("e5m2", 13, 26), ("e4m3", 6, 11)):
        staged = getattr(prepared, name)[0].double() * torch.exp2(ref - 127 - top_exponent)
        inside = below <= fold
        assert_matches(staged[:, inside], expected[:, inside], f"{name} within range")
        if name != "int8":  # INT8 has no -0
            assert_bits(staged[:, inside], expected[:, inside], f"{name} within range")
        assert (staged[:, ~inside] == 0).all(), f"{name} beyond range"
    assert prepared.flags(3)[0].tolist() == [6, 6, 6]


@needs_kernels
@pytest.mark.parametrize("k", [256, 512, 1024, 2304])
def test_one_format_preparation_is_the_same_in_every_program_shape(monkeypatch, k) -> None:
    """The kernel's program shape (rows, code words a step: `_prep_shape` picks the step that
    divides a row's words) moves no staged byte, reference, flag or E4M3 scale."""
    import fp4cli.kernels.gemm.launch as gemm_launch
    from fp4cli.gemm.operands import kernel_operand

    a = kernel_operand(quantized((21, k), 31, DEVICE))
    b = kernel_operand(quantized((10, k), 32, DEVICE))
    shapes = list(gemm_launch.PREP_SHAPES.values())
    words = 128 if k % 1024 == 0 else 64 if k % 512 == 0 else 32
    assert gemm_launch._prep_shape(k, 1)[1] == words  # rows: 32 under the interpreter
    results = []
    for shape in shapes:
        monkeypatch.setattr(gemm_launch, "_prep_shape", lambda *_, shape=shape: shape)
        for e4m3 in (False, True):
            prepared = gemm_launch.prepare(a, b, e5m2=not e4m3, e4m3=e4m3)
            staged = prepared.e4m3 if e4m3 else prepared.e5m2
            assert staged is not None
            results.append(
                (e4m3, prepared.facts, *(t.view(torch.uint8) for t in staged),
                 *(prepared.e4m3_scales or ()))
            )  # fmt: skip
    for got in results[2:]:
        expected = results[int(got[0])]
        for index, (x, y) in enumerate(zip(got[1:], expected[1:], strict=True)):
            assert_bits(x, y, f"output {index}")


def test_the_preparation_caps_its_registers_on_the_gpu_only(monkeypatch) -> None:
    """`maxnreg` goes to a GPU launch (Triton's option), never to the interpreter's."""
    import fp4cli.kernels.gemm.launch as gemm_launch

    assert gemm_launch.PREP_MAX_REGISTERS == 80
    monkeypatch.setattr(gemm_launch, "interpreter_on", lambda: False)
    assert gemm_launch._register_cap(80) == {"maxnreg": 80}
    assert gemm_launch._register_cap(None) == {}
    monkeypatch.setattr(gemm_launch, "interpreter_on", lambda: True)
    assert gemm_launch._register_cap(80) == {}


# --------------------------------------------------------------------------------------------
# Paths and errors
# --------------------------------------------------------------------------------------------


def test_reference_path_on_the_cpu_and_for_specs_the_kernels_skip() -> None:
    a, b = exact_sum_pair(6, 8, 64, seed=1, device="cpu")
    assert gemm_path(a, b, "torch") == "reference"
    if not interpreter_on():
        assert gemm_path(a, b, "auto") == "reference"
    nv_a, nv_b = exact_sum_pair(6, 8, 64, seed=2, device="cpu", spec=QuantSpec.preset("nvfp4"))
    assert gemm_path(nv_a, nv_b, "auto") == "reference"
    result = mxfp4_matmul(nv_a, nv_b, torch.float32)
    assert_bits(result, matmul_reference(nv_a, nv_b, torch.float32))
    with pytest.raises(SpecError, match="e2m1/e8m0"):
        mxfp4_matmul(nv_a, nv_b, backend="triton")
    assert fp4cli.mxfp4_matmul is mxfp4_matmul


def test_bad_inputs_fail_in_one_line() -> None:
    a, b = exact_sum_pair(6, 8, 64, seed=1, device="cpu")
    along_rows = quantize(torch.randn(64, 6), MXFP4, axis=0, backend="torch")
    wrong_k = quantized((6, 96), 3, "cpu")
    block_64 = quantized((8, 64), 4, "cpu", QuantSpec.preset("mxfp4", block=64))
    cases = [
        (lambda: mxfp4_matmul(along_rows, b), "quantized along axis 0"),
        (lambda: mxfp4_matmul(wrong_k, b), "K = 96 but b has K = 64"),
        (lambda: mxfp4_matmul(a, a.dequantize()), "b must be a QuantizedTensor"),
        (lambda: mxfp4_matmul(a, quantized((2, 8, 64), 5, "cpu")), "b must be 2-D"),
        (lambda: mxfp4_matmul(a, b, mode="quick"), "mode must be one of exact, fast"),
        (lambda: mxfp4_matmul(a, b, out_dtype=torch.int32), "out_dtype must be"),
        (lambda: mxfp4_matmul(a, b, out=torch.empty(6, 7)), "out must be a torch.bfloat16"),
        (lambda: mxfp4_matmul(a, b, backend="cuda"), "backend: must be one of"),
        (lambda: mxfp4_matmul("a", b), "a must be a QuantizedTensor or a tensor"),
        (lambda: mxfp4_matmul(a, b, bias=torch.zeros(7)), r"bias must be .* shape \(8,\)"),
        (lambda: mxfp4_matmul(a, b, bias=torch.zeros(8, dtype=torch.int32)), "floating-point"),
    ]
    for call, message in cases:
        with pytest.raises((GemmError, SpecError), match=message) as error:
            call()
        assert "\n" not in str(error.value)
    assert gemm_path(a, block_64, "auto") == "reference"
    with pytest.raises(SpecError, match="blocks of 32 and 64"):
        mxfp4_matmul(a, block_64, backend="triton")
