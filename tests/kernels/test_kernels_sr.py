"""The kernels' stochastic rounding against the reference: the same bits for int and tensor
seeds, on both random-bit paths; reproducible, seeded and unbiased (see test_kernels.py).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from fp4cli.formats import E2M1, grid_interval
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.techniques.hadamard import rht
from tests.kernel_cases import (
    MXFP4_SR,
    MXFP4_SR_PRESCALE,
    NVFP4,
    NVFP4_SR,
    assert_bits,
    assert_same_quantized,
    assert_same_up_to_zero_sign,
    check_backends_agree,
    finite_amax,
    on_device,
    seeded_normal,
    tensor_amax,
)

# numpy warns about the Inf and NaN that non-finite blocks and saturating lanes compute in the
# interpreter, and that the kernels then discard.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


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
    import fp4cli.kernels.host.seeds as launch

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
        "from fp4cli.kernels.tiles.tile_io import seed_of\n\n\n"
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
# Dequantization's division by the pre-scale (kernels/tiles/prescale.py)
# --------------------------------------------------------------------------------------------


def test_prescale_division_becomes_a_multiplication_only_where_exact(monkeypatch):
    """For E8M0 scales and p = 0.75, x * fl(1/p) rounds as x / p for every q * s but 2^-127,
    whose factor gives its quotient; checked here with torch's float32 division, not the
    exact arithmetic that chose the constants. UE5M3 scales, two-level specs and a pre-scale
    whose misses are many keep the division under the interpreter (its fma rounds twice)."""
    from fp4cli.kernels.tiles import prescale
    from fp4cli.kernels.tiles.prescale import prescale_constants

    monkeypatch.setattr(prescale, "interpreter_on", lambda: True)

    constants = prescale_constants(MXFP4_SR_PRESCALE)
    assert constants["PRESCALE_INV"] == torch.tensor(1 / 0.75, dtype=torch.float32).item()
    assert constants["PRESCALE_FIX"] == 2.0**-127
    q = torch.tensor([0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    s = torch.exp2(torch.arange(-127, 128, dtype=torch.float64)).float()
    x = (q[:, None] * s[None, :]).reshape(-1)
    x = torch.cat([x, -x, torch.zeros(1)])
    multiplier = torch.where(
        x.abs() == constants["PRESCALE_FIX"],
        torch.tensor(constants["PRESCALE_FIX_RATIO"]),
        torch.tensor(constants["PRESCALE_INV"]),
    )
    assert_bits(x * multiplier, x / torch.full_like(x, 0.75), "quotients")
    missed = x[x * constants["PRESCALE_INV"] != x / torch.full_like(x, 0.75)]
    assert missed.abs().eq(2.0**-127).all() and len(missed) == 4  # 0.5 * 2^-126, 1 * 2^-127
    for spec in (
        QuantSpec.preset("mxfp4-ue5m3", rounding="sr", sr_prescale=0.75),
        NVFP4_SR.replace(sr_prescale=0.75),
        MXFP4_SR_PRESCALE.replace(sr_prescale=0.93),
    ):
        constants = prescale_constants(spec)
        assert constants["PRESCALE_INV"] == 0.0 and not constants["PRESCALE_REMAINDER"], spec
    assert prescale_constants(MXFP4_SR)["PRESCALE"] == 1.0


def test_the_remainder_step_takes_over_where_the_multiplication_misses(monkeypatch):
    """On a GPU, the specs the multiplication misses take the remainder step with fl(1 / p);
    those it covers, and pre-scales outside the step's range, keep their constants."""
    from fractions import Fraction

    from fp4cli.kernels.tiles import prescale

    monkeypatch.setattr(prescale, "interpreter_on", lambda: False)
    for spec in (
        QuantSpec.preset("mxfp4-ue5m3", rounding="sr", sr_prescale=0.75),
        NVFP4_SR.replace(sr_prescale=0.75),
        QuantSpec.preset("nvfp4-eden"),
    ):
        constants = prescale.prescale_constants(spec)
        inverse = prescale.round_float32(1 / Fraction(prescale.float32(spec.sr_prescale)))
        assert constants["PRESCALE_REMAINDER"], spec.short()
        assert constants["PRESCALE_INV"] == float(inverse)
    assert not prescale.prescale_constants(MXFP4_SR_PRESCALE)["PRESCALE_REMAINDER"]
    assert not prescale.prescale_constants(MXFP4_SR)["PRESCALE_REMAINDER"]
    assert not prescale.prescale_constants(NVFP4_SR.replace(sr_prescale=0.05))["PRESCALE_REMAINDER"]


def test_remainder_misses_counts_what_torch_counts():
    """The exhaustive check over every significand in [1, 2): the multiplication alone misses
    exactly the significands torch's float32 division says it misses (a fifth at Quartet II's
    p, two thirds at 0.93); the remainder step, recomputed here in exact rationals on a sample
    (the fma's single rounding as `round_float32`), misses none of them."""
    from fractions import Fraction

    from fp4cli.kernels.tiles.prescale import remainder_misses, round_float32

    x = (torch.arange(1 << 23, dtype=torch.int32) + (127 << 23)).view(torch.float32)
    for p in (16 / (17 * 0.93), 0.93):
        p32 = torch.tensor(p, dtype=torch.float32)
        inverse = float(round_float32(1 / Fraction(p32.item())))
        missed = int((x * inverse != x / p32).sum())
        assert missed > 2**20 and remainder_misses(p, corrected=False) == missed
        assert remainder_misses(p) == 0
        sample = x[torch.randperm(1 << 23, generator=torch.Generator().manual_seed(1))[:400]]
        q, inv = Fraction(p32.item()), Fraction(inverse)
        for value in sample.tolist():
            y = round_float32(Fraction(value) * inv)
            r = round_float32(y * q - Fraction(value))
            assert round_float32(y - r * inv) == round_float32(Fraction(value) / q), value


def test_round_float32_is_the_nearest_float32():
    """The exact rounding the pre-scale check uses, against numpy's (correctly rounded) double
    to float32 conversion: normals, subnormals, ties of both parities, and overflow."""
    from fractions import Fraction

    import numpy as np

    from fp4cli.kernels.tiles.prescale import round_float32

    generator = np.random.default_rng(0)
    doubles = generator.standard_normal(3000) * 10.0 ** generator.integers(-46, 39, 3000)
    ties = [1 + 2.0**-24, 1 + 3 * 2.0**-24, 2.0**-149 * 1.5, 2.0**-149 * 2.5, 2.0**-150]
    for value in [*doubles.tolist(), *ties, 0.0, -(2.0**-149)]:
        want = (
            float(np.float32(value))
            if abs(value) < 3.4028235678e38
            else math.copysign(2.0**128, value)
        )
        assert float(round_float32(Fraction(value))) == want, value


def test_prescaled_dequantization_of_every_code_and_scale():
    """Every E2M1 code (both signs) under every E8M0 scale code, NaN's included, dequantized
    with the 0.75 pre-scale by the kernel and by the reference: the same bits (2^-127's
    quotient, subnormal, included)."""
    spec = MXFP4_SR_PRESCALE
    template = quantize(on_device(torch.zeros(256, 32)), spec, axis=-1, seed=0, backend="torch")
    nibbles = torch.arange(16, dtype=torch.uint8)
    codes = (nibbles[0::2] | (nibbles[1::2] << 4)).repeat(256, 2)  # 16 codes twice a row
    scales = torch.arange(256, dtype=torch.uint8)[:, None]
    import dataclasses

    quantized = dataclasses.replace(template, codes=on_device(codes), scales=on_device(scales))
    assert_bits(
        quantized.dequantize(torch.float32, backend="triton"),
        quantized.dequantize(torch.float32, backend="torch"),
        "prescaled values",
    )
