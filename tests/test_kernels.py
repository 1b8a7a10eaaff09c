"""The Triton kernels (fp4cli.kernels) against the PyTorch reference (fp4cli.quant), bit for bit.

Runs on the CPU under TRITON_INTERPRET=1 (`make test` sets it), or on a CUDA GPU without it.
Shapes are small: the interpreter runs each program's tile through numpy, so a test costs about
its number of programs, whatever the elements. Float32 inputs only (bf16 in the interpreter is
not what the GPU computes: tests/test_gpu_kernels.py covers bf16 on a GPU).

Every comparison is kernel against reference on the same input (tests/kernel_checks.py):
codes, scale codes and tensor scale identical, dequantize() identical bit for bit (the sign of
zero included), fake_quantize identical up to the sign of zero (the reference's fake_quantize
returns -0.0 where a negative value rounds to zero; its own codes, and the kernels, give +0.0).
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.formats import E2M1, grid_interval
from fp4cli.linear.config import OPERANDS
from fp4cli.quant import QuantSpec, SpecError, fake_quantize, quantize
from fp4cli.quant.backend import interpreter_on, kernel_gap, triton_available
from fp4cli.techniques.hadamard import rht

if not triton_available() or not (interpreter_on() or torch.cuda.is_available()):
    pytest.skip(
        "the Triton kernels run only under TRITON_INTERPRET=1 (CPU) or on a CUDA GPU, "
        "with triton installed",
        allow_module_level=True,
    )

try:  # run as `python -m pytest` from the repository root, or with tests/ on sys.path
    from tests.kernel_checks import (
        assert_bits,
        assert_same_quantized,
        assert_same_up_to_zero_sign,
        check_backends_agree,
    )
except ImportError:  # pragma: no cover
    from kernel_checks import (  # type: ignore[no-redef]
        assert_bits,
        assert_same_quantized,
        assert_same_up_to_zero_sign,
        check_backends_agree,
    )

from fp4cli.kernels.launch import Tile, dequantize_e2m1, quantize_e2m1, tensor_amax  # noqa: E402

# numpy warns about the Inf and NaN that non-finite blocks and saturating lanes compute in the
# interpreter, and that the kernels then discard.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
# The interpreter runs CPU tensors; without it the kernels need CUDA tensors.
DEVICE = torch.device("cpu") if interpreter_on() else torch.device("cuda")
NAN, INF = float("nan"), float("inf")
FP32_MAX = torch.finfo(torch.float32).max

MXFP4 = QuantSpec.preset("mxfp4")
MXFP4_SR = QuantSpec.preset("mxfp4-sr")
MXFP4_SR_PRESCALE = QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75)
NVFP4 = QuantSpec.preset("nvfp4")
NVFP4_SR = QuantSpec.preset("nvfp4", rounding="sr")

SPECS = {
    "mxfp4": MXFP4,
    "mxfp4-ceil": QuantSpec.preset("mxfp4-ceil"),
    "mxfp4-sr": MXFP4_SR,
    "mxfp4-sr-prescale0.75": MXFP4_SR_PRESCALE,
    "nvfp4": NVFP4,
    "nvfp4-sr": NVFP4_SR,
    "mxfp4-ue5m3": QuantSpec.preset("mxfp4-ue5m3"),
    "ue4m3-ceil": QuantSpec(scale="ue4m3", scale_rule="ceil"),
    "ue5m3-ceil": QuantSpec(scale="ue5m3", scale_rule="ceil"),
    "ue5m3-ceil-ts-sr": QuantSpec(
        scale="ue5m3", scale_rule="ceil", rounding="sr", tensor_scale=True
    ),
}
# The other block sizes the kernels take (32 and 16 are above).
BLOCK_SPECS = {
    "mxfp4-block8": MXFP4.replace(block=8),
    "mxfp4-ceil-block16": QuantSpec.preset("mxfp4-ceil", block=16),
    "mxfp4-sr-block64": MXFP4_SR.replace(block=64),
    "nvfp4-block128": NVFP4.replace(block=128),
    "ue5m3-ceil-sr-block256": QuantSpec(scale="ue5m3", scale_rule="ceil", rounding="sr", block=256),
}


def on_device(values: torch.Tensor) -> torch.Tensor:
    return values.to(DEVICE)


def seeded_normal(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
E2M1_TIES = (E2M1_GRID[1:] + E2M1_GRID[:-1]) / 2  # 0.25, 0.75, ..., 5
TIES_TO_EVEN = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])  # each tie, rounded
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


@pytest.mark.parametrize("spec_name", ["mxfp4", "mxfp4-ceil", "nvfp4", "mxfp4-ue5m3", "ue4m3-ceil"])
def test_ties_round_to_even_by_hand(spec_name):
    """Independent of the reference: with the anchor 6 s, each block's scale is s, so a tie
    t * s comes back as (t rounded to the even code) * s."""
    spec = SPECS[spec_name]
    for scale in (2.0**-3, 1.0, 2.0**4):
        x = torch.cat([torch.tensor([6.0]), E2M1_TIES, -E2M1_TIES]) * scale
        rounded = torch.cat([torch.tensor([6.0]), TIES_TO_EVEN, -TIES_TO_EVEN]) * scale
        rounded = torch.where(rounded == 0, 0.0, rounded)  # -0.25 s rounds to code 0: +0.0
        kernel_values = fake_quantize(on_device(x).unsqueeze(0), spec, backend="triton")
        assert_bits(kernel_values, on_device(rounded).unsqueeze(0), f"ties at block scale {scale}")


@pytest.mark.parametrize("spec_name", ["mxfp4", "mxfp4-ceil", "ue4m3-ceil", "nvfp4"])
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

NONFINITE_SPECS = ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil-ts-sr"]


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
        assert kernel.tensor_scale.item() == 1.0  # no finite value: the scale is 1


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
    codes, scales, tensor_scale, _ = quantize_e2m1(x, spec, axis, 99, hadamard, 3, tile=tile)
    assert_bits(codes, reference.codes, "codes")
    assert_bits(scales, reference.scales, "scale codes")
    if reference.tensor_scale is None:
        assert tensor_scale is None
    else:
        assert_bits(tensor_scale, reference.tensor_scale, "tensor scale")
    fake_quantized = quantize_e2m1(
        x, spec, axis, 99, hadamard, 3, values_dtype=torch.float32, tile=tile
    )[3]
    dequantized = reference.dequantize(backend="torch")
    assert_bits(fake_quantized, dequantized, "fake-quantized values")
    from_codes = dequantize_e2m1(
        reference.codes, reference.scales, reference.tensor_scale, spec, reference.shape, axis,
        torch.float32, tile=tile,
    )  # fmt: skip
    assert_bits(from_codes, dequantized, "dequantized codes")
    transformed = rht(x, axis, hadamard, 3) if hadamard else x
    assert_bits(tensor_amax(x, axis, hadamard, 3, tile=tile), finite_amax(transformed), "amax")


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
# Stochastic rounding bits
# --------------------------------------------------------------------------------------------

INT_SEEDS = [0, 12345, 2**40 + 7, 2**63 + 5]
SR_PATHS = {
    # the kernels draw one Philox call per 4 elements when the contiguous extent (the axis
    # length along the last axis, the inner size otherwise) is a multiple of 4, else one per
    # element
    "last-axis-37-per-element": ((3, 37), -1),
    "last-axis-40-grouped": ((3, 40), -1),
    "axis0-inner6-per-element": ((37, 6), 0),
    "axis0-inner8-grouped": ((37, 8), 0),
}


def assert_sr_backends_agree(x: torch.Tensor, spec: QuantSpec, axis: int, seed) -> None:
    reference = quantize(x, spec, axis=axis, seed=seed, backend="torch")
    assert_same_quantized(quantize(x, spec, axis=axis, seed=seed, backend="triton"), reference)
    assert_same_up_to_zero_sign(
        fake_quantize(x, spec, axis=axis, seed=seed, backend="triton"),
        fake_quantize(x, spec, axis=axis, seed=seed, backend="torch"),
        f"fake_quantize with seed {seed}",
    )


@pytest.mark.parametrize("path", list(SR_PATHS))
def test_sr_bits_match_for_int_seeds(path):
    shape, axis = SR_PATHS[path]
    x = on_device(seeded_normal(shape, 16) * 5)
    for seed in INT_SEEDS:
        assert_sr_backends_agree(x, MXFP4_SR_PRESCALE, axis, seed)


# Tensor seeds (QuantLinear passes 0-d int64 tensors) reach the kernels through a pointer. The
# interpreter does not type-check, so the last test below also compiles seed_of for a CUDA target.


@pytest.mark.parametrize("path", list(SR_PATHS))
def test_sr_bits_match_for_tensor_seeds(path):
    """A 0-d int64 tensor seed (as QuantLinear passes it) draws the bits of the same int."""
    shape, axis = SR_PATHS[path]
    x = on_device(seeded_normal(shape, 17) * 5)
    for seed in (12345, -(2**62) - 3):
        tensor_seed = on_device(torch.tensor(seed, dtype=torch.int64))
        reference = quantize(x, NVFP4_SR, axis=axis, seed=seed % 2**64, backend="torch")
        kernel = quantize(x, NVFP4_SR, axis=axis, seed=tensor_seed, backend="triton")
        assert_same_quantized(kernel, reference)
        assert_bits(
            fake_quantize(x, NVFP4_SR, axis=axis, seed=tensor_seed, backend="triton"),
            reference.dequantize(backend="torch"),
            f"fake_quantize with tensor seed {seed}",
        )


@pytest.mark.parametrize("axis", [-1, 0])
def test_hadamard_tensor_seeds(axis):
    """0-d tensor Hadamard seeds, in the quantize kernel and (two-level) the amax kernel."""
    x = on_device(seeded_normal((45, 8) if axis == 0 else (8, 45), 26) * 100)
    hadamard_seed = on_device(torch.tensor(2**50 + 1))
    for spec in (MXFP4_SR_PRESCALE, NVFP4):
        check_backends_agree(x, spec, axis=axis, seed=23, hadamard=16, hadamard_seed=hadamard_seed)
    transformed = rht(x, axis % 2, 64, hadamard_seed)
    assert_bits(tensor_amax(x, axis % 2, 64, hadamard_seed), finite_amax(transformed), "amax")


def test_seed_of_compiles_for_cuda_with_a_tensor_seed(tmp_path):
    """Compile (for an sm_90 target, no GPU needed) a kernel that reads its seed as the
    quantize and amax kernels do for a 0-d tensor seed: seed_of(pointer, the value launch
    passes beside it, FROM_PTR=True): both branches must give one type."""
    import fp4cli.kernels.launch as launch

    _, seed_value, from_ptr = launch._seed_args(torch.tensor(5), torch.device("cpu"))
    assert from_ptr
    value_type = "i32" if -(2**31) <= seed_value < 2**31 else "i64"  # as Triton types an int
    probe = tmp_path / "seed_probe.py"
    probe.write_text(
        "import sys\n"
        "import triton\n"
        "import triton.language as tl\n"
        "from triton.backends.compiler import GPUTarget\n"
        "from triton.compiler import ASTSource\n"
        "from fp4cli.kernels.tile_io import seed_of\n\n\n"
        "@triton.jit\n"
        "def probe(seed_ptr, seed_value, out_ptr, FROM_PTR: tl.constexpr):\n"
        "    seed = seed_of(seed_ptr, seed_value, FROM_PTR)\n"
        "    offsets = tl.arange(0, 4)\n"
        "    tl.store(out_ptr + offsets, tl.randint(seed, offsets.to(tl.int64)))\n\n\n"
        "def build(from_ptr):\n"
        f"    signature = {{'seed_ptr': '*i64', 'seed_value': '{value_type}',\n"
        "                 'out_ptr': '*u32', 'FROM_PTR': 'constexpr'}\n"
        "    source = ASTSource(probe, signature, constexprs={'FROM_PTR': from_ptr})\n"
        "    triton.compile(source, target=GPUTarget('cuda', 90, 32))\n\n\n"
        "try:\n"
        "    build(False)  # an int seed: compiles wherever triton can compile for CUDA\n"
        "except Exception:\n"
        "    sys.exit(3)\n"
        "build(True)\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    environment["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    compiled = subprocess.run(
        [sys.executable, str(probe)], env=environment, capture_output=True, text=True
    )
    if compiled.returncode == 3:  # pragma: no cover
        pytest.skip("this triton cannot compile for a CUDA target here")
    errors = [line for line in compiled.stderr.splitlines() if "Error" in line]
    assert compiled.returncode == 0, "\n".join(errors)


def test_sr_reproducible_and_seeded():
    x = on_device(seeded_normal((8, 40), 18) * 3)
    first = fake_quantize(x, MXFP4_SR, seed=5, backend="triton")
    assert_bits(fake_quantize(x, MXFP4_SR, seed=5, backend="triton"), first)
    assert_bits(quantize(x, MXFP4_SR, seed=5, backend="triton").dequantize(), first)
    assert not torch.equal(fake_quantize(x, MXFP4_SR, seed=6, backend="triton"), first)
    torch.manual_seed(0)  # no seed: one is drawn from torch's random state, as the reference
    drawn = fake_quantize(x, MXFP4_SR, backend="triton")
    torch.manual_seed(0)
    assert_same_up_to_zero_sign(drawn, fake_quantize(x, MXFP4_SR, backend="torch"), "drawn")


UNBIASED_SPECS = {
    # (spec, anchor): the anchor fixes every block's scale at 1 and, two-level, the tensor
    # scale at 448 (with block scale 448), so the grid units are the values themselves
    "mxfp4-sr": (MXFP4_SR, 6.0),
    "nvfp4-sr": (NVFP4_SR, 6.0),
    # floor rule and the 3/4 pre-scale: amax 7.9 keeps scale 1, and 7.9 * 0.75 < 6 never clips
    "mxfp4-sr-prescale0.75": (MXFP4_SR_PRESCALE, 7.9),
}


@pytest.mark.parametrize("spec_name", list(UNBIASED_SPECS))
def test_sr_is_unbiased(spec_name):
    """The mean of N = rows x seeds stochastic roundings of a value v approaches v.

    Each rounding is lower + spacing * Bernoulli(p) (spacing: the grid step around v, in the
    output's units), so the mean's standard deviation is spacing * sqrt(p (1 - p) / N) <=
    spacing / (2 sqrt N). Allowing 5 of those per value, a correct kernel fails with
    probability below 31 * 6e-7 (and the test is deterministic: fixed seeds); a rounding that
    always goes down (or up) is off by the distance to that grid point, spacing / 2 on average,
    6 times the tolerance at N = 1024.
    """
    spec, anchor = UNBIASED_SPECS[spec_name]
    rows, seeds = 256, 4
    values = torch.linspace(-anchor * 0.97, anchor * 0.99, 31)
    x = torch.cat([torch.full((rows, 1), anchor), values.expand(rows, -1)], dim=1)
    total = torch.zeros(31, dtype=torch.float64)
    for seed in range(seeds):
        rounded = fake_quantize(on_device(x), spec, seed=seed, backend="triton").cpu()
        total += rounded[:, 1:].double().sum(dim=0)
    mean = total / (rows * seeds)
    units = values * spec.sr_prescale
    lower, upper = grid_interval(units, E2M1)
    spacing = (upper - lower).double() / spec.sr_prescale
    tolerance = 5 * spacing / (2 * math.sqrt(rows * seeds))
    error = (mean - values.double()).abs()
    assert (error <= tolerance).all(), (
        f"biased at {values[error > tolerance].tolist()}: means {mean[error > tolerance].tolist()}"
    )


# --------------------------------------------------------------------------------------------
# The dequantize kernel on the reference's codes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize(
    "spec_name", ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil-ts-sr", "ue4m3-ceil"]
)
def test_dequantize_kernel_on_reference_codes(spec_name, axis):
    spec = SPECS[spec_name]
    x = seeded_normal((37, 45), 19) * 10.0 ** torch.linspace(-3, 3, 45)
    x[3, 4], x[10, 40] = NAN, -INF  # NaN blocks
    reference = quantize(on_device(x), spec, axis=axis, seed=2, backend="torch")
    for dtype in (None, torch.float32, torch.float16):
        assert_bits(
            reference.dequantize(dtype, backend="triton"),
            reference.dequantize(dtype, backend="torch"),
            f"dequantize({dtype})",
        )
    assert reference.dequantize(backend="triton").isnan().any()


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("spec_name", ["mxfp4", "mxfp4-sr-prescale0.75", "nvfp4", "ue5m3-ceil"])
def test_dequantize_kernel_every_code(spec_name, axis):
    """Every E2M1 code under every scale code (NaN codes and codes no quantizer writes
    included), against the reference's decoding, up to the sign of zero: code 8 (-0, which no
    quantizer writes) decodes to -0.0 in the reference and the interpreter, but to +0.0 compiled
    on a GPU (Triton lowers unary minus to 0 - x there)."""
    spec = SPECS[spec_name]
    block = int(spec.block)
    lines, length = 256, 64
    shape = (lines, length) if axis == -1 else (length, lines)
    template = quantize(on_device(torch.ones(shape)), spec, axis=axis, backend="torch")
    line = torch.arange(lines).unsqueeze(1)
    # 32 bytes per line; over 8 lines they run through all 256 bytes, so each block holds all
    # 16 codes in its low nibbles
    codes = ((torch.arange(length // 2) + 32 * line) % 256).to(torch.uint8)
    blocks = torch.arange(length // block)
    scales = ((line + 128 * blocks) % 256).to(torch.uint8)  # block 0 of line c: scale code c
    crafted = dataclasses.replace(template, codes=on_device(codes), scales=on_device(scales))
    assert_same_up_to_zero_sign(
        crafted.dequantize(backend="triton"), crafted.dequantize(backend="torch"), "all codes"
    )


# --------------------------------------------------------------------------------------------
# tensor_amax
# --------------------------------------------------------------------------------------------


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    magnitude = x.abs()
    return torch.where(magnitude.isfinite(), magnitude, 0.0).amax().reshape(1)


@pytest.mark.parametrize(("shape", "axis"), [((5, 70), 1), ((70, 5), 0), ((3, 40, 6), 1)], ids=str)
def test_tensor_amax_ignores_nan_and_inf(shape, axis):
    x = seeded_normal(shape, 20) * 1e3
    x.view(-1)[[1, 50, 99]] = torch.tensor([NAN, INF, -INF])
    x.view(-1)[123] = -5e4  # the largest finite magnitude, negative
    x = on_device(x)
    amax = tensor_amax(x, axis, None, 0)
    assert amax.item() == 5e4
    assert_bits(amax, finite_amax(x), "amax")
    assert tensor_amax(on_device(torch.full(shape, NAN)), axis, None, 0).item() == 0.0


@pytest.mark.parametrize("size", [16, 64, 128])
@pytest.mark.parametrize(("shape", "axis"), [((5, 70), 1), ((70, 5), 0)], ids=str)
def test_tensor_amax_of_the_hadamard_transform(shape, axis, size):
    x = seeded_normal(shape, 21)
    x[2, 3] = NAN
    x = on_device(x)
    for hadamard_seed in (0, 2**63 + 1):  # tensor seeds: test_hadamard_tensor_seeds
        transformed = rht(x, axis, size, hadamard_seed)
        assert_bits(tensor_amax(x, axis, size, hadamard_seed), finite_amax(transformed))


# --------------------------------------------------------------------------------------------
# Backend dispatch
# --------------------------------------------------------------------------------------------


def test_unknown_backend_is_an_error():
    x = on_device(torch.ones(2, 32))
    for call in (
        lambda: quantize(x, MXFP4, backend="cuda"),
        lambda: fake_quantize(x, MXFP4, backend="Triton"),
        lambda: quantize(x, MXFP4, backend="torch").dequantize(backend="numpy"),
        lambda: fp4cli.QuantLinear(32, 8, config=fp4cli.LinearConfig(MXFP4), backend="gpu"),
    ):
        with pytest.raises(SpecError, match="backend"):
            call()


UNCOVERED = [
    # (spec, guided, words the error names)
    (QuantSpec(element="int4"), False, "element 'int4'"),
    (QuantSpec.preset("nvfp4-2d"), False, "tile2d"),
    (QuantSpec(block="row"), False, "block 'row'"),
    (QuantSpec(block="tensor", scale_rule="ceil"), False, "block 'tensor'"),
    (QuantSpec(scale="fp32"), False, "scale 'fp32'"),
    (QuantSpec(rounding="away"), False, "rounding 'away'"),
    (MXFP4, True, "guided"),
]


@pytest.mark.parametrize(("spec", "guided", "named"), UNCOVERED, ids=[u[2] for u in UNCOVERED])
def test_triton_backend_refuses_what_it_does_not_cover(spec, guided, named):
    x = on_device(seeded_normal((16, 32), 22))
    guide = x.clone() if guided else None
    with pytest.raises(SpecError, match=named):
        quantize(x, spec, guide=guide, backend="triton")
    with pytest.raises(SpecError, match=named):
        fake_quantize(x, spec, guide=guide, backend="triton")
    # auto falls back to the reference for it
    assert_bits(
        fake_quantize(x, spec, guide=guide, backend="auto"),
        fake_quantize(x, spec, guide=guide, backend="torch"),
    )


def test_triton_backend_refuses_float64_input():
    with pytest.raises(SpecError, match="dtype"):
        fake_quantize(on_device(torch.ones(2, 32, dtype=torch.float64)), MXFP4, backend="triton")


def test_auto_backend_runs_the_reference_on_a_cpu_tensor(monkeypatch):
    import fp4cli.kernels.launch as launch

    def no_kernel(*args, **kwargs):
        raise RuntimeError("a kernel was launched")

    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the kernels could run: auto must not choose them
    monkeypatch.setattr(launch, "quantize_e2m1", no_kernel)
    monkeypatch.setattr(launch, "dequantize_e2m1", no_kernel)
    x = seeded_normal((4, 40), 23)
    for spec in (MXFP4, NVFP4_SR):
        auto = quantize(x, spec, seed=1, backend="auto")
        assert_same_quantized(auto, quantize(x, spec, seed=1, backend="torch"))
        assert_bits(auto.dequantize(backend="auto"), auto.dequantize(backend="torch"))
        assert_bits(
            fake_quantize(x, spec, seed=1, hadamard=16, backend="auto"),
            fake_quantize(x, spec, seed=1, hadamard=16, backend="torch"),
        )
    with pytest.raises(RuntimeError, match="a kernel was launched"):  # the patch is in place
        quantize(x, MXFP4, backend="triton")


@pytest.mark.parametrize("interpret", [None, "0", ""])
def test_triton_backend_on_cpu_needs_the_interpreter(monkeypatch, interpret):
    if interpret is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", interpret)
    x = seeded_normal((4, 32), 24)
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        quantize(x, MXFP4, backend="triton")
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        fake_quantize(x, MXFP4, backend="triton")
    with pytest.raises(SpecError, match="TRITON_INTERPRET"):
        quantize(x, MXFP4, backend="torch").dequantize(backend="triton")
    assert_bits(fake_quantize(x, MXFP4, backend="auto"), fake_quantize(x, MXFP4, backend="torch"))


def test_float16_input_and_output():
    """float16 in and out (the interpreter computes float16 as the GPU does; bfloat16 not)."""
    x = seeded_normal((6, 45), 25) * 100
    x[0, 0] = NAN
    check_backends_agree(on_device(x.half()), NVFP4_SR, seed=3)
    check_backends_agree(on_device(x), MXFP4_SR_PRESCALE, seed=3, out_dtype=torch.float16)


# --------------------------------------------------------------------------------------------
# QuantLinear and quantize_model
# --------------------------------------------------------------------------------------------


def recipe_kernel_gaps(name: str) -> list[str]:
    """Why the kernels cannot run some operand of a shipped recipe (empty: they run all)."""
    config = fp4cli.load_recipe(name).linear
    gaps = []
    for operand in OPERANDS:
        spec = config.spec(operand)
        if spec is None:
            continue
        guided = operand == "forward_w" and config.qema is not None  # Q-EMA guides it
        gap = kernel_gap(spec, torch.float32, guided=guided)
        if gap is not None:
            gaps.append(f"{operand}: {gap}")
    return gaps


QUANTIZED_RECIPES = [
    name for name in fp4cli.list_recipes() if not fp4cli.load_recipe(name).linear.is_high_precision
]
COVERED_RECIPES = [name for name in QUANTIZED_RECIPES if not recipe_kernel_gaps(name)]
UNCOVERED_RECIPES = [name for name in QUANTIZED_RECIPES if recipe_kernel_gaps(name)]


def test_recipe_coverage_is_what_the_kernels_cover():
    """COVERED_RECIPES / UNCOVERED_RECIPES come from kernel_gap; pin the recipes that must be
    on each side, so that neither parametrization can quietly lose them."""
    assert {"mxfp4", "tseng-rht-sr", "tetrajet", "ue5m3-hadamard-sr"} <= set(COVERED_RECIPES)
    assert {"nvfp4", "wang-fp4", "tetrajet-qema"} <= set(UNCOVERED_RECIPES)


def training_step(recipe: str, backend: str) -> list[torch.Tensor]:
    """Output, input grad and parameter grads of one forward/backward pass of a linear layer
    under `recipe` (all three GEMMs, six operands); 48 in, 26 out, 36 tokens: padded blocks,
    0-d tensor seeds (the layer's seed buffer), and per-element SR bits along the tokens for
    the 26-wide dY."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(48, 26)).to(DEVICE)
    fp4cli.quantize_model(model, recipe, seed=11, skip=(), backend=backend)
    assert isinstance(model[0], fp4cli.QuantLinear)
    x = torch.randn(36, 48, device=DEVICE, requires_grad=True)
    y = model(x)
    y.backward(torch.randn(36, 26, device=DEVICE))
    return [y.detach(), x.grad, *(parameter.grad for parameter in model.parameters())]


@pytest.mark.parametrize("recipe", COVERED_RECIPES)
def test_quant_linear_triton_equals_torch(recipe, monkeypatch):
    import fp4cli.kernels.launch as launch

    kernel_calls = []
    real_quantize = launch.quantize_e2m1

    def counting_quantize(*args, **kwargs):
        kernel_calls.append(args[1])
        return real_quantize(*args, **kwargs)

    monkeypatch.setattr(launch, "quantize_e2m1", counting_quantize)
    reference_results = training_step(recipe, "torch")
    assert not kernel_calls
    kernel_results = training_step(recipe, "triton")
    assert kernel_calls, "backend='triton' launched no kernel"
    names = ["y", "x.grad", "weight.grad", "bias.grad"]
    for name, kernel_result, reference_result in zip(
        names, kernel_results, reference_results, strict=True
    ):
        assert_bits(kernel_result, reference_result, f"{recipe}: {name}")


@pytest.mark.parametrize("recipe", UNCOVERED_RECIPES)
def test_quant_linear_triton_refuses_an_uncovered_recipe(recipe):
    with pytest.raises(SpecError, match="backend 'triton' does not cover"):
        training_step(recipe, "triton")
