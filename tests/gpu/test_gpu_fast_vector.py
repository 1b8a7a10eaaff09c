"""On a CUDA GPU: the vector-wise kernels on large bf16 tensors, the vector-wise executor of
wang-fp4 / wang-direct under bf16 autocast, and its training steps replayed from a CUDA graph,
each against its reference bit for bit. `make gpu-test` runs them; CI deselects the gpu marker."""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize
from fp4cli.techniques.outliers import OutlierConfig, clamp_outliers, nearest_ranks
from tests.gpu_gpt import (
    check_executor_gives_the_reference_bits,
    check_graph_steps_equal_eager_steps,
)
from tests.kernel_checks import (
    COMPILED_ON_GPU,
    assert_bits,
    assert_same_up_to_zero_sign,
    bf16_gpu_input,
)

pytestmark = COMPILED_ON_GPU

VECTOR_RECIPES = ["wang-fp4", "wang-direct"]
SPECS = [
    QuantSpec.preset("fp4-row"),
    QuantSpec.preset("fp4-column"),
    QuantSpec.preset("fp8-e4m3-tensor"),
    QuantSpec.preset("fp8-e5m2-tensor"),
    QuantSpec(element="e4m3", block="row"),
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.short())
@pytest.mark.parametrize("shape", [(8192, 768), (1000, 20000)])
def test_vector_kernels_match_the_reference_on_large_bf16_tensors(spec, shape):
    """Both axes, values in bf16 and codes decoded; rows of 20,000 are read in chunks."""
    from fp4cli.kernels.vector.launch import decode_vector, quantize_vector

    x = bf16_gpu_input(*shape, seed=1)
    for axis in (0, 1):
        expected = fake_quantize(x, spec, axis=axis, backend="torch")
        values, _ = quantize_vector(x, spec, axis, torch.bfloat16)
        assert_bits(values, expected, f"{spec.short()} axis {axis}")
        codes, scales = quantize_vector(x, spec, axis, None, scales=True)
        assert scales is not None
        decoded = decode_vector(codes, scales, spec, axis, torch.bfloat16)
        assert_bits(decoded, expected, f"decoded {spec.short()} axis {axis}")


@pytest.mark.parametrize("shape", [(8192, 768), (512, 3072), (256, 11008), (256, 20000)])
def test_fused_clamp_matches_the_reference_quantiles(shape):
    from fp4cli.kernels.vector.launch import Clamp, quantize_vector

    spec, config = QuantSpec.preset("fp4-row"), OutlierConfig(0.99, compensate=True)
    x = bf16_gpu_input(*shape, seed=2)
    x[200, :] = 0.0
    x[201, : shape[1] // 2] = 3.0  # ties
    x[100:200, ::97] *= 40  # outlier channels: the search's bounds far apart
    x[202, 3] = 3e30
    x[203] = -x[203].abs()  # one sign: both ranks below zero
    clamped, residual = clamp_outliers(x, config)
    quantized = fake_quantize(clamped, spec, axis=1, backend="torch")
    low, high = nearest_ranks(shape[1], 0.99)
    for compensate in (False, True):
        expected = quantized
        if compensate:
            expected = (quantized.float() + residual.float()).to(torch.bfloat16)
        got, _ = quantize_vector(x, spec, 1, torch.bfloat16, clamp=Clamp(low, high, compensate))
        assert_same_up_to_zero_sign(got, expected, f"clamp {shape} compensate {compensate}")


@pytest.mark.parametrize("recipe", VECTOR_RECIPES)
def test_vector_executor_equals_reference_under_autocast(recipe):
    """A GPT's forward and backward under bf16 autocast: every gradient the same bits."""
    check_executor_gives_the_reference_bits(recipe, "auto", "vector")


@pytest.mark.parametrize("recipe", VECTOR_RECIPES)
def test_cuda_graph_steps_equal_eager_steps(recipe):
    check_graph_steps_equal_eager_steps(recipe)


@pytest.mark.parametrize("shape", [(768, 3072), (3072, 768)])
def test_dge_factor_matches_the_reference_on_bf16_gradients(shape):
    """DGE's kernels around torch's pow, on the GPU: the weight gradient (a transposed bf16
    view, as the executor's) times the reference's derivative, every bit."""
    from fp4cli.techniques.dge import DGEConfig
    from tests.kernels.test_dge_kernel import check_dge_gradient, dge_weight

    spec = QuantSpec.preset("fp4-column")
    weight = dge_weight(*shape, spec, "cuda", seed=3)
    weight[8:] = torch.randn(shape[0] - 8, shape[1], device="cuda") * 0.02
    grad = torch.randn(shape[1], shape[0], device="cuda").to(torch.bfloat16).t()
    for config in (DGEConfig(), DGEConfig(k=3.0), DGEConfig(k=2.0, cap=1.0)):
        check_dge_gradient(weight, grad, spec, config)


@pytest.mark.parametrize("spec", SPECS[2:4], ids=lambda spec: spec.short())
@pytest.mark.parametrize("shape", [(8192, 768), (1000, 3000)])
def test_transposed_codes_on_large_bf16_tensors(spec, shape):
    """`quantize_codes` (the FP8 route's layouts) writes `quantize_vector`'s codes and their
    transpose, in one launch."""
    from fp4cli.kernels.vector.launch import quantize_codes, quantize_vector

    x = bf16_gpu_input(*shape, seed=4)
    for axis in (0, 1):
        codes, scales = quantize_vector(x, spec, axis, None, scales=True)
        rows, transposed, both_scales = quantize_codes(
            x, spec, axis, rows_out=True, transposed=True
        )
        assert torch.equal(rows, codes) and torch.equal(transposed, codes.t())
        assert_bits(both_scales, scales, "scales")


@pytest.mark.parametrize("shape", [(8192, 768, 3072), (3072, 8192, 768), (48, 40, 32)])
def test_fp8_mm_sums_the_exact_products(shape):
    """cuBLAS's FP8 GEMM on E5M2 x E4M3 codes (the shapes of GPT-2 small's backward GEMMs; a
    ragged one, multiplied as values): within 2^-11 of the largest output of the float32 sum
    of the decoded values' products, and the bf16 result within its rounding of that."""
    from fp4cli.gemm.fp8 import fp8_mm
    from fp4cli.kernels.vector.launch import decode_vector, quantize_codes

    m, k, n = shape
    e5m2, e4m3 = SPECS[3], SPECS[2]
    generator = torch.Generator(device="cuda").manual_seed(5)
    a, b = (torch.randn(rows, k, generator=generator, device="cuda") for rows in (m, n))
    a_codes, _, a_scale = quantize_codes(a, e5m2, 1, rows_out=True, transposed=False)
    b_codes, _, b_scale = quantize_codes(b, e4m3, 1, rows_out=True, transposed=False)
    a_values = decode_vector(a_codes, a_scale, e5m2, 1, torch.float32)
    b_values = decode_vector(b_codes, b_scale, e4m3, 1, torch.float32)
    exact = a_values.double().mm(b_values.double().t())
    largest = float(exact.abs().max())
    for dtype, rtol in ((torch.float32, 0.0), (torch.bfloat16, 2**-8)):
        got = fp8_mm((a_codes, a_scale), (b_codes, b_scale), (e5m2, e4m3), dtype).double()
        torch.testing.assert_close(got, exact, rtol=rtol, atol=2**-11 * largest)


def _fp8_recipe(tmp_path, base: str) -> str:
    path = tmp_path / f"{base}-fast.yaml"
    path.write_text(f"base: {base}\nlinear: {{gemm: fast}}\n")
    return str(path)


@pytest.mark.parametrize("recipe", VECTOR_RECIPES)
def test_fp8_route_layer_is_the_reference_to_the_bf16_rounding(recipe):
    """GPT-2 small's MLP-up layer on 2048 tokens under bf16 autocast with `gemm: fast` (the
    backward GEMMs on the FP8 tensor cores): the output is the reference executor's bits and
    each gradient the reference's (cuBLAS on the values) to two bf16 roundings (the product's,
    then DGE's factor's; 2.5% of the values a unit in the last place apart, measured) and the
    tensor cores' sums (1e-4 of the largest output; up to 3 times that after DGE's factor)."""
    import dataclasses

    from fp4cli.recipes import load_recipe
    from tests.linear_runs import linear_inputs, seeded_layer, training_passes

    config = dataclasses.replace(load_recipe(recipe).linear, gemm="fast")
    layers = [seeded_layer(config, backend, 768, 3072) for backend in ("triton", "torch")]
    assert layers[0].executor() == ("vector", "")
    x, grad_y = linear_inputs((2048, 768), 3072, seed=3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, want = (training_passes(layer, x, grad_y, calls=1)[0] for layer in layers)
    assert_bits(got[0], want[0], "output")
    for index, (tensor, expected) in enumerate(zip(got[1:], want[1:], strict=True)):
        largest = float(expected.float().abs().max())
        torch.testing.assert_close(
            tensor.float(), expected.float(), rtol=2**-6, atol=2**-10 * largest,
            msg=f"{recipe} gradient {index}",
        )  # fmt: skip


@pytest.mark.parametrize("recipe", VECTOR_RECIPES)
def test_fp8_route_gpt_compiles_and_replays_with_the_eager_bits(tmp_path, recipe):
    """wang-fp4 / wang-direct with `gemm: fast`: the tiny GPT compiled in one graph gives the
    eager gradients bit for bit under bf16 autocast, and its steps replayed from a CUDA graph
    the eager steps' losses and parameters."""
    from tests.gpu_gpt import autocast_gradients

    path = tmp_path / f"{recipe}-fast.yaml"
    path.write_text(f"base: {recipe}\nlinear: {{gemm: fast}}\n")
    eager = autocast_gradients(str(path), "auto", "vector")
    compiled = autocast_gradients(str(path), "auto", "vector", "aot_eager")
    for name, tensor in compiled.items():
        assert_bits(tensor, eager[name], f"compiled {name}")
    check_graph_steps_equal_eager_steps(str(path))
