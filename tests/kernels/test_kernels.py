"""The Triton kernels (fp4cli.kernels) against the PyTorch reference (fp4cli.quant), bit for bit.

Runs on the CPU under TRITON_INTERPRET=1 (`make test` sets it), or on a CUDA GPU without it.
Shapes are small: the interpreter runs each program's tile through numpy, so a test costs about
its number of programs, whatever the elements. Float32 inputs only (bf16 in the interpreter is
not what the GPU computes: tests/gpu/test_gpu_kernels.py covers bf16 on a GPU).

Every comparison is kernel against reference on the same input (tests/kernel_checks.py):
codes, scale codes and tensor scale identical, dequantize() identical bit for bit (the sign of
zero included), fake_quantize identical up to the sign of zero (the reference's fake_quantize
returns -0.0 where a negative value rounds to zero; its own codes, and the kernels, give +0.0).
"""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import fake_quantize, quantize
from fp4cli.techniques.hadamard import rht
from tests.kernel_cases import (
    BLOCK_SPECS,
    FP32_MAX,
    INF,
    MXFP4,
    MXFP4_SR,
    NAN,
    NVFP4_SR,
    SPECS,
    Tile,
    assert_bits,
    check_backends_agree,
    dequantize_e2m1,
    finite_amax,
    on_device,
    quantize_e2m1,
    seeded_normal,
    tensor_amax,
)

# numpy warns about the Inf and NaN that non-finite blocks and saturating lanes compute in the
# interpreter, and that the kernels then discard.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_TIES = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2  # 0.25, 0.75, ..., 5
TIES_TO_EVEN = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])  # each tie, rounded
TIES_AWAY = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # each tie, rounded up
GROUP = 8  # the smallest kernel block: each group of 8 starts with the anchor 6 * scale


def grid_rows(block_scales: list[float]) -> torch.Tensor:
    """One row per block scale s. Every group of 8 along a row starts with the anchor 6 s (so
    every block, 8 to 256 wide, has amax 6 s, or its float32 successor where that is among the
    values), then test values: each E2M1 grid point and midpoint (tie) times s, both signs, and
    both float32 neighbours of each of those (nextafter)."""
    rows = []
    for scale in block_scales:
        points = torch.cat([E2M1_GRID, E2M1_TIES]) * scale
        points = torch.cat([points, -points])
        up, down = torch.full_like(points, INF), torch.full_like(points, -INF)
        values = torch.cat([points, torch.nextafter(points, up), torch.nextafter(points, down)])
        per_group = GROUP - 1
        groups = -(-values.numel() // per_group)
        padded = torch.zeros(groups * per_group)
        padded[: values.numel()] = values
        row = torch.cat([torch.full((groups, 1), 6.0 * scale), padded.view(groups, -1)], dim=1)
        rows.append(row.reshape(-1))
    return torch.stack(rows)


def grid_ties_case() -> torch.Tensor:
    """Block scales 2^-3, 1, 2^4: powers of two that stay exact under every scale format and
    the tensor scale (448 * 6 / (6 * 16) = 28), so the midpoints reach the rounding as ties."""
    return grid_rows([2.0**-3, 1.0, 2.0**4])


def grid_wide_case() -> torch.Tensor:
    """The grid at block scales across float32's range, and at two not powers of two."""
    return grid_rows([2.0**-100, 2.0**-20, 0.6, 3.0, 2.0**40, 2.0**100])


def tiny_case() -> torch.Tensor:
    """Zeros, negative zeros, subnormal inputs, and blocks whose amax is 2^-126 or 2^-149."""
    x = torch.zeros(6, 64)
    x[1] = -0.0  # a row of negative zeros
    x[2, 32:] = torch.tensor([0.0, -0.0] * 16)
    x[2, 40] = 1.5  # one value among signed zeros
    x[3] = 1e-40 * torch.linspace(-1, 1, 64)  # subnormal float32 inputs
    x[4, :32] = torch.linspace(-1, 1, 32) * 2.0**-126  # amax exactly 2^-126 (smallest normal)
    x[4, 32], x[4, 40] = 2.0**-149, -(2.0**-149)  # amax 2^-149 (smallest subnormal)
    x[5] = seeded_normal((64,), 5) * 1e-38
    return x


def huge_case() -> torch.Tensor:
    """Blocks whose amax is 2^127, 3e38 or the float32 max, next to ordinary blocks, and values
    in (6, 8) times the block scale (they saturate under the floor rule)."""
    x = seeded_normal((6, 64), 6)
    x[0, :32] = torch.linspace(-1, 1, 32) * 2.0**127
    x[0, 7] = 2.0**127
    x[1, :32] = torch.linspace(-1, 1, 32) * 3e38
    x[1, 32:35] = torch.tensor([FP32_MAX, -FP32_MAX, 3e38])
    saturating = torch.linspace(6.01, 7.99, 32)
    x[2, :32] = saturating  # amax in (6, 8): floor scale 1 (clips), ceil scale 2
    x[2, 32:] = -saturating * 2.0**-10
    x[3, :32] = torch.cat([saturating[:16] * 2.0**20, torch.linspace(-6, 6, 16) * 2.0**20])
    x[4] = seeded_normal((64,), 4) * 1e30
    return x


def random_ragged_case() -> torch.Tensor:
    """Ragged (45 is no multiple of any block), magnitudes 10^-3..10^3 varying per element."""
    magnitudes = 10.0 ** (torch.rand(5, 45, generator=torch.Generator().manual_seed(1)) * 6 - 3)
    return seeded_normal((5, 45), 2) * magnitudes


def scale_boundaries_case() -> torch.Tensor:
    """One row per block amax a (every block of 8..32 along the row has amax a): a / 6 halfway
    between two UE4M3 / UE5M3 scale values (ties of the floor rule's nearest-even rounding,
    normal and subnormal), and a at the E8M0 rules' edges (2^k and 6 * 2^k, and their float32
    neighbours). A row with amax 2688 sets the two-level tensor scale to exactly 1, so the
    ties stay ties with it."""
    scale_ties = torch.tensor(
        [1.0625, 1.1875, 1.3125, 1.9375, 1.0625 * 2**-6, 1.5 * 2**-9, 2.5 * 2**-9, 432.0]
        + [1.5 * 2**-17, 2.5 * 2**-17, 1.0625 * 2**-14]  # UE5M3's subnormals and smallest normal
    )
    edges = torch.tensor([2.0**-3, 1.0, 2.0**5, 6 * 2.0**-3, 6.0, 6 * 2.0**5])
    neighbours = [torch.nextafter(edges, edges * 2), torch.nextafter(edges, edges / 2)]
    amax = torch.cat([6 * scale_ties, edges, *neighbours, torch.tensor([2688.0])])
    fractions = torch.tensor([1.0, 0.9, -0.7, 0.55, 0.3, -0.12, 0.01, 0.26])
    return (amax[:, None] * fractions).repeat(1, 4)


CASES = {
    "grid_ties": grid_ties_case,
    "grid_wide": grid_wide_case,
    "scale_boundaries": scale_boundaries_case,
    "tiny": tiny_case,
    "huge": huge_case,
}

# --------------------------------------------------------------------------------------------
# Specs x edge cases
# --------------------------------------------------------------------------------------------


# every scale format and rule, both roundings, the pre-scale, with and without tensor scale
EDGE_CASE_SPECS = [
    "mxfp4",
    "mxfp4-ceil",
    "mxfp4-sr",
    "mxfp4-sr-prescale0.75",
    "nvfp4",
    "nvfp4-sr",
    "mxfp4-ue5m3",
    "ue4m3-ceil",
    "ue5m3-ceil-ts-sr",
    "mxfp4-away",
    "nvfp4-away",
    "ue5m3-ceil-away",
]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("spec_name", EDGE_CASE_SPECS)
def test_edge_cases_match_reference(spec_name, case):
    x = on_device(CASES[case]())
    check_backends_agree(x, SPECS[spec_name], seed=321)


@pytest.mark.parametrize("case", ["grid_wide", "random_ragged"])
@pytest.mark.parametrize("spec_name", list(BLOCK_SPECS))
def test_block_sizes_match_reference(spec_name, case):
    x = grid_wide_case() if case == "grid_wide" else random_ragged_case()
    check_backends_agree(on_device(x), BLOCK_SPECS[spec_name], seed=7)


TIE_SPECS = ["mxfp4", "mxfp4-ceil", "nvfp4", "mxfp4-ue5m3", "ue4m3-ceil"]
TIE_SPECS += ["mxfp4-away", "nvfp4-away", "ue5m3-ceil-away"]


@pytest.mark.parametrize("spec_name", TIE_SPECS)
def test_ties_by_hand(spec_name):
    """Independent of the reference: with the anchor 6 s, each block's scale is s, so a tie
    t * s comes back as (t rounded to the even code, or away from zero) * s."""
    spec = SPECS[spec_name]
    ties = TIES_AWAY if spec.rounding == "away" else TIES_TO_EVEN
    for scale in (2.0**-3, 1.0, 2.0**4):
        x = torch.cat([torch.tensor([6.0]), E2M1_TIES, -E2M1_TIES]) * scale
        rounded = torch.cat([torch.tensor([6.0]), ties, -ties]) * scale
        rounded = torch.where(rounded == 0, 0.0, rounded)  # -0.25 s rounds to code 0: +0.0
        kernel_values = fake_quantize(on_device(x).unsqueeze(0), spec, backend="triton")
        assert_bits(kernel_values, on_device(rounded).unsqueeze(0), f"ties at block scale {scale}")


@pytest.mark.parametrize("spec_name", ["mxfp4", "mxfp4-ceil", "ue4m3-ceil", "nvfp4", "mxfp4-away"])
def test_saturation_by_hand(spec_name):
    """Values in (6, 8) with amax in (6, 8): the floor rule keeps scale 1 and clips them to 6,
    the ceil rule takes scale 2 (E8M0) or amax / 6 (UE4M3) and never clips."""
    spec = SPECS[spec_name]
    x = on_device(torch.linspace(6.05, 7.95, 32).unsqueeze(0))
    kernel_values = fake_quantize(x, spec, backend="triton")
    assert_bits(kernel_values, fake_quantize(x, spec, backend="torch"))
    if spec.scale_rule == "floor" and not spec.tensor_scale:
        assert (kernel_values == 6.0).all()
    else:
        assert (kernel_values > 6.0).any()


# --------------------------------------------------------------------------------------------
# Non-finite input
# --------------------------------------------------------------------------------------------

NONFINITE_SPECS = ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil-ts-sr", "nvfp4-away"]


@pytest.mark.parametrize("spec_name", NONFINITE_SPECS)
def test_nan_and_inf_poison_only_their_block(spec_name):
    spec = SPECS[spec_name]
    block = int(spec.block)
    clean = seeded_normal((4, 64), 8)
    clean[0, 3] = clean[1, 40] = clean[2, 5] = clean[2, 6] = 0.0  # the places of NaN / Inf
    x = clean.clone()
    x[0, 3], x[1, 40], x[2, 5], x[2, 6] = NAN, INF, -INF, NAN
    poisoned = torch.zeros(4, 64, dtype=torch.bool)
    for row, col in [(0, 3), (1, 40), (2, 5)]:
        poisoned[row, (col // block) * block : (col // block + 1) * block] = True
    reference_values = check_backends_agree(on_device(x), spec, seed=4).cpu()
    assert_bits(reference_values.isnan(), poisoned, "NaN blocks of the reference")
    kernel_values = fake_quantize(on_device(x), spec, seed=4, backend="triton").cpu()
    assert kernel_values[poisoned].isnan().all()
    assert not kernel_values[~poisoned].isnan().any()
    # NaN / Inf do not enter the tensor scale: the other blocks are quantized as without them
    clean_values = fake_quantize(on_device(clean), spec, seed=4, backend="triton").cpu()
    assert_bits(kernel_values[~poisoned], clean_values[~poisoned], "blocks without NaN / Inf")


@pytest.mark.parametrize(
    ("spec_name", "fill"), [("mxfp4", NAN), ("mxfp4-sr", INF), ("nvfp4", NAN), ("nvfp4", -INF)]
)
def test_all_nonfinite_tensor(spec_name, fill):
    spec = SPECS[spec_name]
    x = on_device(torch.full((3, 40), fill))
    check_backends_agree(x, spec, seed=1)
    kernel = quantize(x, spec, seed=1, backend="triton")
    assert kernel.dequantize(backend="triton").isnan().all()
    assert (kernel.scales == spec.scale_format.nan_code).all()
    if spec.tensor_scale:
        assert kernel.tensor_amax.item() == 0.0  # no finite value


# --------------------------------------------------------------------------------------------
# Shapes and axes
# --------------------------------------------------------------------------------------------

SHAPES_AND_AXES = [
    # (shape, axis, spec): ragged shapes, each axis of a 3-D tensor, a single element
    ((3, 37), -1, "mxfp4"),
    ((3, 37), 0, "nvfp4-sr"),
    ((5, 7, 13), 0, "mxfp4"),
    ((5, 7, 13), 1, "nvfp4-sr"),  # a middle axis
    ((5, 7, 13), -1, "mxfp4-sr-prescale0.75"),
    ((1, 1), 0, "nvfp4-sr"),
    ((1, 1), -1, "mxfp4"),
    ((37,), 0, "ue5m3-ceil-ts-sr"),
    ((3, 37), 0, "mxfp4-away"),
    ((5, 7, 13), 1, "nvfp4-away"),
]


@pytest.mark.parametrize(("shape", "axis", "spec_name"), SHAPES_AND_AXES, ids=str)
def test_shapes_and_axes(shape, axis, spec_name):
    spec = SPECS[spec_name]
    x = on_device(seeded_normal(shape, len(shape)) * 3)
    check_backends_agree(x, spec, axis=axis, seed=9)
    kernel = quantize(x, spec, axis=axis, seed=9, backend="triton")
    padded = -(-shape[axis] // int(spec.block)) * int(spec.block)
    others = [n for i, n in enumerate(shape) if i != axis % len(shape)]
    assert kernel.codes.shape == (*others, padded // 2)
    assert kernel.scales.shape == (*others, padded // int(spec.block))
    assert kernel.dequantize(backend="triton").shape == shape


def test_non_contiguous_input():
    base = on_device(seeded_normal((37, 24), 10))
    for x, axis in [(base.T, -1), (base.T, 0), (base[::2], -1), (base[:, ::3], 0)]:
        assert not x.is_contiguous()
        check_backends_agree(x, NVFP4_SR, axis=axis, seed=3)


def test_many_programs_with_the_default_tiles():
    """Tensors over one default tile: 20 lines of 300 and 3 lines of 1100 along the last axis,
    150 x 70 along axis 0 (several tiles along the axis and across the inner size)."""
    check_backends_agree(on_device(seeded_normal((20, 300), 11)), NVFP4_SR, seed=5)
    check_backends_agree(on_device(seeded_normal((3, 1100), 11)), MXFP4_SR, seed=5)
    check_backends_agree(on_device(seeded_normal((150, 70), 12)), MXFP4_SR, axis=0, seed=5)


SMALL_TILES = [
    # (shape, axis, tile, spec, Hadamard size): 2 x 2 programs or more, so that tiles start
    # past line 0 and position 0
    ((3, 37), 1, Tile(2, 32), "mxfp4-sr-prescale0.75", None),  # per-element SR bits (37)
    ((3, 40), 1, Tile(2, 32), "nvfp4-sr", 16),  # grouped SR bits, 48 after the transform
    # a transform of 8 to 32 points along the last axis: a run of it a thread
    ((5, 70), 1, Tile(2, 64), "mxfp4-sr-prescale0.75", 32),  # 96 after the transform
    ((3, 21), 1, Tile(2, 16), "nvfp4", 8),  # 24 after the transform, a block over two runs
    ((40, 6), 0, Tile(4, 32), "nvfp4-sr", 16),  # along axis 0, inner 6: per-element SR bits
    ((2, 40, 8), 1, Tile(4, 32), "mxfp4-sr-prescale0.75", None),  # middle axis, grouped
]


@pytest.mark.parametrize(("shape", "axis", "tile", "spec_name", "hadamard"), SMALL_TILES, ids=str)
def test_small_tiles(shape, axis, tile, spec_name, hadamard):
    """launch.quantize_e2m1 / dequantize_e2m1 / tensor_amax with tiles smaller than the
    tensor: every program's origin, its SR bit indices and its Hadamard signs."""
    spec = SPECS[spec_name]
    x = seeded_normal(shape, 13) * 4
    x.view(-1)[17] = NAN
    x = on_device(x)
    options = dict(axis=axis, seed=99, hadamard=hadamard, hadamard_seed=3)
    reference = quantize(x, spec, backend="torch", **options)
    codes, scales, t_amax, _ = quantize_e2m1(x, spec, axis, 99, hadamard, 3, tile=tile)
    assert_bits(codes, reference.codes, "codes")
    assert_bits(scales, reference.scales, "scale codes")
    if reference.tensor_amax is None:
        assert t_amax is None
    else:
        assert_bits(t_amax, reference.tensor_amax, "tensor amax")
    fake_quantized = quantize_e2m1(
        x, spec, axis, 99, hadamard, 3, values_dtype=torch.float32, tile=tile
    )[3]
    dequantized = reference.dequantize(backend="torch")
    assert_bits(fake_quantized, dequantized, "fake-quantized values")
    from_codes = dequantize_e2m1(
        reference.codes, reference.scales, reference.tensor_amax, spec, reference.shape, axis,
        torch.float32, tile=tile,
    )  # fmt: skip
    assert_bits(from_codes, dequantized, "dequantized codes")
    transformed = rht(x, axis, hadamard, 3) if hadamard else x
    assert_bits(tensor_amax(x, axis, hadamard, 3, tile=tile), finite_amax(transformed), "amax")


def test_tiles_along_the_grid_third_axis(monkeypatch):
    """Rows of more tiles than a grid's second axis holds continue along its third. Under the
    interpreter GRID_Y is made 2 (5 tiles along a row take 2 x 3 programs, the last of them
    empty); a compiled kernel keeps the value it was compiled with, so on the GPU the rows are
    65,540 tiles long instead."""
    import triton.language as tl

    import fp4cli.kernels.quantization.launch as launch
    import fp4cli.kernels.tiles.tile_io as tile_io
    from fp4cli.quant.backend import interpreter_on

    cols = 150
    if interpreter_on():
        monkeypatch.setattr(tile_io, "GRID_Y", tl.constexpr(2))
        monkeypatch.setattr(launch, "GRID_Y", tl.constexpr(2))
    else:
        cols += int(tile_io.GRID_Y) * 32
    x = seeded_normal((3, cols), 16) * 5
    x[1, cols - 3] = NAN
    x = on_device(x)
    tile = Tile(1, 32)
    for spec in (SPECS["nvfp4-sr"], SPECS["mxfp4"]):
        reference = quantize(x, spec, seed=4, backend="torch")
        codes, scales, t_amax, _ = quantize_e2m1(x, spec, 1, 4, tile=tile)
        assert_bits(codes, reference.codes, "codes")
        assert_bits(scales, reference.scales, "scale codes")
        values = quantize_e2m1(x, spec, 1, 4, values_dtype=torch.float32, tile=tile)[3]
        dequantized = reference.dequantize(backend="torch")
        assert_bits(values, dequantized, "fake-quantized values")
        from_codes = dequantize_e2m1(
            reference.codes, reference.scales, reference.tensor_amax, spec, x.shape, 1,
            torch.float32, tile=tile,
        )  # fmt: skip
        assert_bits(from_codes, dequantized, "dequantized codes")
    assert_bits(tensor_amax(x, 1, None, 0, tile=tile), finite_amax(x), "amax")


# --------------------------------------------------------------------------------------------
# Fused random Hadamard transform
# --------------------------------------------------------------------------------------------

HADAMARD_CASES = [
    # (size, length along the axis: no multiple of the size, axis, spec): each size along both
    # axes, once with each rounding
    (16, 40, -1, "mxfp4"),
    (16, 40, 0, "mxfp4-sr-prescale0.75"),
    (32, 40, -1, "mxfp4-sr-prescale0.75"),
    (32, 40, 0, "mxfp4"),
    (64, 100, -1, "mxfp4"),
    (64, 100, 0, "mxfp4-sr-prescale0.75"),
    (128, 100, -1, "mxfp4-sr-prescale0.75"),
    (128, 100, 0, "mxfp4"),
]


@pytest.mark.parametrize(("size", "length", "axis", "spec_name"), HADAMARD_CASES, ids=str)
def test_hadamard(size, length, axis, spec_name):
    spec = SPECS[spec_name]
    # along axis 0 the inner size 6 takes the per-element SR path
    shape = (6, length) if axis == -1 else (length, 6)
    x = on_device(seeded_normal(shape, size) * 2)
    check_backends_agree(x, spec, axis=axis, seed=17, hadamard=size, hadamard_seed=2**40 + 3)
    kernel = quantize(x, spec, axis=axis, seed=17, hadamard=size, backend="triton")
    padded_length = -(-length // size) * size
    assert kernel.shape[axis] == padded_length
    assert kernel.dtype == torch.float32


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("spec_name", ["nvfp4", "nvfp4-sr"])
def test_hadamard_with_tensor_scale(spec_name, axis):
    """NVFP4 + Hadamard 16: the tensor scale comes from the amax of the transformed tensor."""
    spec = SPECS[spec_name]
    x = seeded_normal((45, 8) if axis == 0 else (8, 45), 14) * 100
    x[1, 2] = NAN  # a NaN spreads over its Hadamard block (and its quantization block)
    hadamard_seed = 7 if axis == 0 else 2**63 + 1
    check_backends_agree(
        on_device(x), spec, axis=axis, seed=23, hadamard=16, hadamard_seed=hadamard_seed
    )


def test_hadamard_seed_changes_the_transform():
    x = on_device(seeded_normal((4, 64), 15))
    first = fake_quantize(x, MXFP4, hadamard=32, hadamard_seed=1, backend="triton")
    second = fake_quantize(x, MXFP4, hadamard=32, hadamard_seed=2, backend="triton")
    assert not torch.equal(first, second)


# --------------------------------------------------------------------------------------------
# Two-level scales at the tensor amax's extremes
# --------------------------------------------------------------------------------------------


def amax_extremes() -> dict[str, torch.Tensor]:
    """Tensors whose amax makes the global encode scale G = S * E / A extreme: 0 (G is
    FLT_MAX), subnormal (S * E / A overflows: G saturates at FLT_MAX and every block scale at
    S), the float32 maximum (G tiny: blocks far below it get scale 0 and saturate, blocks near
    it land on subnormal block scales), and one block far above the rest."""
    x = seeded_normal((4, 64), 30)
    huge = x.clone()
    huge[0, :16] = torch.linspace(-1, 1, 16) * FP32_MAX
    huge[1, :16] *= 2.0**118  # block scales around 448 * 2^-10: subnormal UE4M3 scales
    huge[2, 16:32] *= 2.0**100
    outlier = x.clone()
    outlier[3, 5] = 2.0**60
    return {
        "zeros": torch.zeros(4, 64),
        "subnormal": x * 2.0**-140,
        "smallest": torch.full((4, 64), 2.0**-149),
        "float32-max": huge,
        "outlier": outlier,
    }


TWO_LEVEL_SPECS = {
    "nvfp4": SPECS["nvfp4"],
    "nvfp4-ceil": SPECS["nvfp4"].replace(scale_rule="ceil"),
    "nvfp4-sr": SPECS["nvfp4-sr"],
    "mxfp4-ue5m3": SPECS["mxfp4-ue5m3"],
    "ue5m3-ceil-ts-sr": SPECS["ue5m3-ceil-ts-sr"],
}


@pytest.mark.parametrize("case", list(amax_extremes()))
@pytest.mark.parametrize("spec_name", TWO_LEVEL_SPECS)
def test_two_level_amax_extremes(spec_name, case):
    x = on_device(amax_extremes()[case])
    check_backends_agree(x, TWO_LEVEL_SPECS[spec_name], seed=31)
