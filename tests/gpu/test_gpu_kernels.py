"""On a CUDA GPU: the compiled Triton kernels give the reference's bits on large bf16 tensors.

Every test compares backend="triton" with backend="torch", both on the GPU (the reference is
device-independent: tests/gpu/test_gpu_reference.py). Inputs are large and adversarial: magnitudes
from 10^-30 to 10^30, NaN and Inf, exact ties, all-zero and subnormal blocks, near the bf16
maximum. `make gpu-test` runs them; CI deselects the gpu marker.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.techniques.hadamard import rht
from tests.kernel_checks import (
    COMPILED_ON_GPU,
    assert_bits,
    assert_same_sum,
    check_backends_agree,
)

pytestmark = COMPILED_ON_GPU

NAN, INF = float("nan"), float("inf")
MXFP4 = QuantSpec.preset("mxfp4")
MXFP4_SR_PRESCALE = QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75)
NVFP4 = QuantSpec.preset("nvfp4")
MXFP4_UE5M3 = QuantSpec.preset("mxfp4-ue5m3")

# (spec, Hadamard size): the kernels' paths that the recipes use
LARGE_CASES = {
    "mxfp4": (MXFP4, None),
    "mxfp4-rht32-sr-prescale0.75": (MXFP4_SR_PRESCALE, 32),
    "nvfp4": (NVFP4, None),
    "mxfp4-ue5m3": (MXFP4_UE5M3, None),
    "mxfp4-away": (MXFP4.replace(rounding="away"), None),  # tseng-baseline's backward
    "nvfp4-away": (NVFP4.replace(rounding="away"), None),
}
LARGE_SHAPES = [(4096, 4096), (8192, 1024)]

E2M1_TIES = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def adversarial_bf16(shape: tuple[int, int], seed: int) -> torch.Tensor:
    """A bf16 CUDA tensor: Gaussian values whose scale is 10^u per 32 x 32 tile, u uniform in
    [-30, 30], with two decades of spread per element; then rows of special blocks (exact ties
    with their anchor, all-zero, subnormal, near the bf16 maximum, spread over all 60 decades)
    and scattered NaN, +Inf and -Inf (1 in 10^5 each)."""
    rows, cols = shape
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def uniform(*size: int) -> torch.Tensor:
        return torch.rand(size, generator=generator, device="cuda")

    tile_decades = (uniform(rows // 32, cols // 32) * 60 - 30).repeat_interleave(32, 0)
    decades = tile_decades.repeat_interleave(32, 1) + uniform(rows, cols) * 2 - 1
    x = torch.randn(shape, generator=generator, device="cuda") * 10.0**decades
    # ties: in each group of 8, the anchor 6 s then seven ties times s (both signs by row)
    ties = torch.tensor([6.0, *E2M1_TIES], device="cuda").repeat(cols // 8)
    scales = 2.0 ** torch.arange(-20, 21, 4, device="cuda", dtype=torch.float32)
    for i, scale in enumerate(scales):
        x[i] = ties * scale * (1 if i % 2 else -1)
    base = len(scales)
    x[base] = 0.0  # all-zero blocks
    x[base + 1] = -0.0
    x[base + 2] = torch.randn(cols, generator=generator, device="cuda") * 1e-39  # subnormal
    x[base + 3] = torch.randn(cols, generator=generator, device="cuda") * 1e38  # near bf16 max
    x[base + 3, ::64] = 3.3e38
    x[base + 4] = torch.randn(cols, generator=generator, device="cuda") * 10.0 ** (
        uniform(cols) * 60 - 30
    )  # every magnitude within one block
    for value in (NAN, INF, -INF):
        x.view(-1)[uniform(x.numel()) < 1e-5] = value
    return x.to(torch.bfloat16)


@pytest.fixture(scope="module", params=LARGE_SHAPES, ids=str)
def large_input(request) -> torch.Tensor:
    return adversarial_bf16(request.param, seed=sum(request.param))


@pytest.mark.parametrize("axis", [-1, 0])
@pytest.mark.parametrize("case", list(LARGE_CASES))
def test_large_bf16_matches_reference(large_input, case, axis):
    """Codes, scales and tensor scale identical; dequantize to bf16 and fake_quantize with
    out_dtype bf16 identical (tests/kernel_checks.check_backends_agree)."""
    spec, hadamard = LARGE_CASES[case]
    assert large_input.isnan().any() and large_input.isinf().any()
    check_backends_agree(
        large_input,
        spec,
        axis=axis,
        seed=2**40 + 7,
        hadamard=hadamard,
        hadamard_seed=12345,
        out_dtype=torch.bfloat16,
    )


@pytest.mark.parametrize("axis", [-1, 0])
def test_large_float16_and_float32(axis):
    x = adversarial_bf16((2048, 1024), seed=3).float()
    x_half = x.clamp(-60000.0, 60000.0).half()  # past 65504 float16 has only Inf
    for spec in (MXFP4_SR_PRESCALE, NVFP4):
        check_backends_agree(x_half, spec, axis=axis, seed=5)
        check_backends_agree(x, spec, axis=axis, seed=5, hadamard=64)


@pytest.mark.parametrize("axis", [-1, 0])
def test_large_ragged_shapes(axis):
    """Lengths that are no multiple of a block or a Hadamard size, along both axes; inner
    sizes not a multiple of 4 (per-element SR bits)."""
    x = adversarial_bf16((1024, 1024), seed=4)[:1001, :999]
    check_backends_agree(x, MXFP4_SR_PRESCALE, axis=axis, seed=6, hadamard=128)
    check_backends_agree(x, NVFP4.replace(rounding="sr"), axis=axis, seed=6, hadamard=16)


def test_sr_reproducible_on_gpu():
    x = adversarial_bf16((2048, 2048), seed=5)
    first = fake_quantize(x, MXFP4_SR_PRESCALE, seed=9, hadamard=32, backend="triton")
    again = fake_quantize(x, MXFP4_SR_PRESCALE, seed=9, hadamard=32, backend="triton")
    assert_bits(again, first, "same seed")
    other = fake_quantize(x, MXFP4_SR_PRESCALE, seed=10, hadamard=32, backend="triton")
    assert not torch.equal(other.nan_to_num(), first.nan_to_num())
    for seed in (0, 2**63 + 5):
        check_backends_agree(x, MXFP4_SR_PRESCALE, seed=seed, hadamard=32, hadamard_seed=seed)


# QuantLinear passes its seeds as 0-d tensors on the GPU: they must compile and draw the bits of
# the same integers.
def test_tensor_seeds_on_gpu():
    x = adversarial_bf16((2048, 2048), seed=7)
    tensor_seed = torch.tensor(9, device="cuda")
    from_int = fake_quantize(x, MXFP4_SR_PRESCALE, seed=9, hadamard=32, backend="triton")
    from_tensor = fake_quantize(
        x, MXFP4_SR_PRESCALE, seed=tensor_seed, hadamard=32, backend="triton"
    )
    assert_bits(from_tensor, from_int, "0-d tensor seed vs int seed")
    check_backends_agree(x, NVFP4.replace(rounding="sr"), seed=tensor_seed, hadamard=16,
                         hadamard_seed=tensor_seed + 1)  # fmt: skip


def test_tensor_amax_on_gpu():
    from fp4cli.kernels.quantization.launch import tensor_amax

    x = adversarial_bf16((4096, 4096), seed=6)
    magnitude = x.float().abs()
    expected = torch.where(magnitude.isfinite(), magnitude, 0.0).amax().reshape(1)
    for axis in (0, 1):
        assert_bits(tensor_amax(x, axis, None, 0), expected, f"amax along {axis}")
    y = torch.randn(3000, 1000, device="cuda") * 100  # finite, so the transform is too
    y[5, 5] = NAN
    for axis, size in [(1, 32), (0, 64), (1, 256)]:
        transformed = rht(y, axis, size, 77).abs()
        expected = torch.where(transformed.isfinite(), transformed, 0.0).amax().reshape(1)
        assert_bits(tensor_amax(y, axis, size, 77), expected, f"amax of RHT-{size}, axis {axis}")


def test_auto_backend_uses_the_kernels_on_cuda(monkeypatch):
    import fp4cli.kernels.quantization.launch as launch

    calls = []
    real_quantize = launch.quantize_e2m1

    def counting_quantize(*args, **kwargs):
        calls.append(args[1])
        return real_quantize(*args, **kwargs)

    monkeypatch.setattr(launch, "quantize_e2m1", counting_quantize)
    x = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
    auto = fake_quantize(x, NVFP4, backend="auto")
    assert calls == [NVFP4]
    assert_bits(auto, fake_quantize(x, NVFP4, backend="triton"))
    quantize(x, QuantSpec.preset("nvfp4-2d"), backend="auto")  # not covered: the reference
    assert calls == [NVFP4, NVFP4]


def training_step_bf16(recipe: str, backend: str) -> list[torch.Tensor]:
    """Output, input grad and parameter grads of one forward/backward pass of an MLP under bf16
    autocast (the operands reach the quantizers in bf16)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1000)).cuda()
    fp4cli.quantize_model(model, recipe, seed=3, skip=(), backend=backend)
    x = torch.randn(2000, 1024, device="cuda", requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    y.float().square().mean().backward()
    return [y.detach(), x.grad, *(parameter.grad for parameter in model.parameters())]


@pytest.mark.parametrize("recipe", ["mxfp4", "tseng-rht-sr", "nvfp4"])
def test_quant_linear_bf16_autocast_triton_equals_torch(recipe):
    reference = training_step_bf16(recipe, "torch")
    kernel = training_step_bf16(recipe, "triton")
    assert reference[0].dtype == torch.bfloat16
    names = ["y", "x.grad", "w1.grad", "b1.grad", "w2.grad", "b2.grad"]
    for name, got, expected in zip(names, kernel, reference, strict=True):
        if name.startswith("b"):  # dY's column sums, added in the fast executor's order
            assert_same_sum(got, expected, f"{recipe}: {name}")
        else:
            assert_bits(got, expected, f"{recipe}: {name}")


@pytest.mark.parametrize("spec", [MXFP4, NVFP4], ids=["mxfp4", "nvfp4"])
def test_code_of_negative_zero_decodes_to_negative_zero(spec):
    """E2M1 code 8 (the sign bit over magnitude 0, as a hand-made or foreign code) decodes to
    -0.0, as the reference decodes it: the kernels set signs on the bits."""
    import dataclasses

    x = torch.randn(64, 256, device="cuda")
    q = quantize(x, spec, axis=-1, backend="torch")
    codes = q.codes.clone()
    codes[::3] = 0x88  # both nibbles of every third row's bytes: code 8
    q = dataclasses.replace(q, codes=codes)
    expected = q.dequantize(torch.float32, backend="torch")
    got = q.dequantize(torch.float32, backend="triton")
    assert torch.signbit(expected[::3]).all() and (expected[::3] == 0).all()
    assert_bits(got, expected, f"{spec.short()} code 8")
