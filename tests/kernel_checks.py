"""Checks shared by the kernel tests (tests/kernels/test_kernels.py on the CPU interpreter or a GPU,
tests/gpu/test_gpu_kernels.py on a GPU): the Triton backend against the PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from fp4cli.formats import decode
from fp4cli.quant import QuantizedTensor, QuantSpec, fake_quantize, quantize, two_level
from fp4cli.quant.backend import interpreter_on, triton_available

# The marks of a test module that runs the compiled kernels on a GPU (`make gpu-test`).
COMPILED_ON_GPU = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not triton_available(), reason="needs triton"),
    pytest.mark.skipif(
        interpreter_on(), reason="TRITON_INTERPRET is set: the kernels would not be compiled"
    ),
]


def bf16_gpu_input(rows: int, cols: int, seed: int) -> torch.Tensor:
    """A bf16 CUDA tensor (rows >= 101) whose rows span many binades, with a NaN, an Inf and a
    zero, for the GPU tests of the executors' kernels."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(rows, cols, generator=generator, device="cuda")
    scales = torch.exp2(torch.randn(rows, 1, generator=generator, device="cuda") * 8)
    x = (x * scales).to(torch.bfloat16)
    x[5, 7], x[100, 33], x[-1, -1] = float("nan"), float("inf"), 0.0
    return x


_SAME_WIDTH_INT = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
}


def assert_bits(actual: torch.Tensor, expected: torch.Tensor, what: str = "values") -> None:
    """Identical bits: same dtype, shape and device; NaN exactly where `expected` has NaN (any
    payload); every other element the same bit pattern, the sign of zero included."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.device == expected.device, f"{what}: device {actual.device} != {expected.device}"
    if not actual.is_floating_point():
        mismatch = actual != expected
    else:
        expected_nan = expected.isnan()
        wrong_nan = actual.isnan() != expected_nan
        assert not wrong_nan.any(), (
            f"{what}: NaN in different places, first at {wrong_nan.nonzero()[:5].tolist()}"
        )
        int_dtype = _SAME_WIDTH_INT[actual.dtype]
        actual_bits = actual.masked_fill(expected_nan, 0).contiguous().view(int_dtype)
        expected_bits = expected.masked_fill(expected_nan, 0).contiguous().view(int_dtype)
        mismatch = actual_bits != expected_bits
    if mismatch.any():
        where = mismatch.nonzero()[:5]
        pairs = [
            (tuple(i.tolist()), actual[tuple(i)].item(), expected[tuple(i)].item()) for i in where
        ]
        raise AssertionError(
            f"{what}: {int(mismatch.sum())} of {mismatch.numel()} elements differ; "
            f"(index, actual, expected): {pairs}"
        )


def assert_same_sum(actual: torch.Tensor, expected: torch.Tensor, what: str = "sums") -> None:
    """The same sums added in another order: equal up to one unit in the last place of the
    dtype, or 1e-5 of the largest sum where terms cancel (float32 sums of up to ~10^4 terms)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    largest = float(expected.abs().max()) if expected.numel() else 0.0
    eps = torch.finfo(expected.dtype).eps
    torch.testing.assert_close(actual, expected, rtol=eps, atol=1e-5 * largest, msg=what)


def assert_within(
    actual: torch.Tensor, expected: torch.Tensor, bound: torch.Tensor, what: str
) -> None:
    """|actual - expected| <= bound, element by element (the same dtype and shape)."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, what
    excess = (actual - expected).abs() - bound.to(actual.device, actual.dtype)
    assert bool((excess <= 0).all()), f"{what}: beyond the bound by up to {excess.max().item()}"


def assert_same_up_to_zero_sign(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """As assert_bits, except that 0.0 and -0.0 count as equal (as test_quantize's assert_same:
    the reference's fake_quantize keeps the sign of a value that rounds to zero, its codes and
    the kernels do not)."""
    assert_bits(
        torch.where(actual == 0, 0.0, actual), torch.where(expected == 0, 0.0, expected), what
    )


def assert_same_quantized(kernel: QuantizedTensor, reference: QuantizedTensor) -> None:
    """Codes, scale codes, tensor scale and metadata identical."""
    assert_bits(kernel.codes, reference.codes, "codes")
    assert_bits(kernel.scales, reference.scales, "scale codes")
    if reference.tensor_amax is None:
        assert kernel.tensor_amax is None, "the kernel made a tensor amax the spec has not"
    else:
        assert kernel.tensor_amax is not None, "the kernel made no tensor amax"
        assert_bits(kernel.tensor_amax, reference.tensor_amax, "tensor amax")
    assert (kernel.shape, kernel.axis, kernel.dtype) == (
        reference.shape,
        reference.axis,
        reference.dtype,
    )
    assert kernel.layout == reference.layout


def check_backends_agree(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    seed: int | torch.Tensor | None = 0,
    hadamard: int | None = None,
    hadamard_seed: int | torch.Tensor = 0,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """backend="triton" against backend="torch": quantize (codes, scales, tensor scale), each
    one's dequantize() on its own backend, and fake_quantize. Returns the reference's
    fake-quantized values."""
    options = dict(axis=axis, seed=seed, hadamard=hadamard, hadamard_seed=hadamard_seed)
    reference = quantize(x, spec, backend="torch", **options)
    kernel = quantize(x, spec, backend="triton", **options)
    assert_same_quantized(kernel, reference)
    dequantized = reference.dequantize(out_dtype, backend="torch")
    assert_bits(kernel.dequantize(out_dtype, backend="triton"), dequantized, "dequantize()")
    fake_reference = fake_quantize(x, spec, out_dtype=out_dtype, backend="torch", **options)
    fake_kernel = fake_quantize(x, spec, out_dtype=out_dtype, backend="triton", **options)
    # The kernel's fake quantization is bit for bit the dequantization of the codes ...
    assert_bits(fake_kernel, dequantized, "fake_quantize (kernel) vs dequantize()")
    # ... and the reference's, up to the sign of zero.
    assert_same_up_to_zero_sign(fake_kernel, fake_reference, "fake_quantize")
    return fake_reference


def reference_encode_table(tensor_amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """`fp4cli.quant.two_level`'s encode multiplier of every code of spec's scale format, then
    G * fl(1 / E): what a kernel's encode table holds where it is read (float32, CPU)."""
    fmt = spec.scale_format.minifloat
    assert fmt is not None
    tensor_amax = tensor_amax.reshape(()).to("cpu", torch.float32)
    values = decode(torch.arange(fmt.max_code + 1, dtype=torch.uint8), fmt).to(torch.float32)
    multipliers = two_level.encode_multipliers(values, tensor_amax, spec)
    g = two_level.global_encode_scale(tensor_amax, spec)
    block_encode = g * torch.tensor(two_level.constants(spec)[1], dtype=torch.float32)
    four_encode = g * torch.tensor(0.25, dtype=torch.float32)
    return torch.cat([multipliers, block_encode.reshape(1), four_encode.reshape(1)])


def assert_encode_table(table: torch.Tensor, tensor_amax: torch.Tensor, spec: QuantSpec) -> None:
    """A kernel's encode table (ENCODE_TABLE float32 values) holds the reference's entries for
    a tensor of amax `tensor_amax` (`reference_encode_table`), bit for bit, and only finite
    values."""
    from fp4cli.kernels.tiles.two_level import BLOCK_ENCODE_SLOT

    fmt = spec.scale_format.minifloat
    assert fmt is not None
    table = table.cpu()
    read = torch.cat([table[: fmt.max_code + 1], table[BLOCK_ENCODE_SLOT.value :]])
    what = f"encode table of amax {tensor_amax.item()!r}"
    assert_bits(read, reference_encode_table(tensor_amax, spec), what)
    assert table.isfinite().all(), f"{what}: a non-finite entry"
