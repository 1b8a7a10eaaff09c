"""On a CUDA GPU: cuBLASLt's GEMM with alpha read from the device (`gemm.cublaslt.alpha_matmul`)
against fl32(alpha * sum) rounded once, on operands whose float32 sums are exact in any order:
both 16-bit dtypes, their own and float32 outputs, row- and column-major operands, ragged
shapes, a bias added after the scaling, an output holding NaN beforehand (beta = 0 must not
read it), a CUDA graph replayed with a new alpha, and the NVFP4 GEMM's decoded implementation
taking this route."""

from __future__ import annotations

import pytest
import torch

from fp4cli.kernels.gemm.cublaslt import alpha_matmul
from tests.kernel_checks import COMPILED_ON_GPU

pytestmark = COMPILED_ON_GPU
ALPHA = 0.3  # not a power of two: the product with each sum rounds
bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32


def integer_matrix(rows: int, cols: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Integers in [-7, 7]: exact in 16 bits, every product and sum of 1,024 exact in float32."""
    generator = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(-7, 8, (rows, cols), generator=generator, device="cuda").to(dtype)


def expected(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor, dtype: torch.dtype):
    sums = (a.double() @ b.double().T).float()  # exact
    return (alpha * sums).to(dtype)  # one float32 product, then the output's rounding


def layout(t: torch.Tensor, column_major: bool) -> torch.Tensor:
    return t.T.contiguous().T if column_major else t


@pytest.mark.parametrize("shape", [(256, 512, 1024), (300, 270, 96), (8, 16, 32), (6, 5, 64)])
@pytest.mark.parametrize("dtype, out_dtype", [(bf16, bf16), (bf16, f32), (f16, f16), (f16, f32)])
@pytest.mark.parametrize("a_cols, b_cols", [(False, False), (True, False), (False, True)])
def test_alpha_times_exact_sums_rounded_once(shape, dtype, out_dtype, a_cols, b_cols) -> None:
    m, n, k = shape
    a = layout(integer_matrix(m, k, 1, dtype), a_cols)
    b = layout(integer_matrix(n, k, 2, dtype), b_cols)
    alpha = torch.tensor([ALPHA], device="cuda")
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    if alpha_matmul(a, b, alpha, out):
        assert torch.equal(out, expected(a, b, alpha, out_dtype))
    else:  # no tiled algorithm for a problem this small: left to the caller, untouched
        assert m * n < 1024 and out.isnan().all()


SMALL = [(1, 1, 16), (5, 70, 208), (9, 10, 16), (6, 5, 64), (40, 33, 16)]


@pytest.mark.parametrize("m, n, k", SMALL)
def test_small_problems_exact_or_left_to_the_caller(m: int, n: int, k: int) -> None:
    a, b = integer_matrix(m, k, m + k, bf16), integer_matrix(n, k, n, bf16)
    for alpha_value in (ALPHA, 1 / 3, 6.055e-7):
        alpha = torch.tensor([alpha_value], device="cuda")
        out = torch.full((m, n), float("nan"), device="cuda")
        if alpha_matmul(a, b, alpha, out):
            assert torch.equal(out, expected(a, b, alpha, f32)), alpha_value


@pytest.mark.parametrize("out_dtype, bias_dtype", [(bf16, bf16), (f32, f32), (f32, bf16)])
def test_bias_added_in_float32_after_the_scaling(out_dtype, bias_dtype) -> None:
    """fl32(fl32(alpha * sum) + bias), then the output's rounding: two float32 roundings, not
    one fused multiply-add (the data make the two differ, checked below)."""
    m, n, k = 512, 384, 1024
    a, b = integer_matrix(m, k, 11, bf16), integer_matrix(n, k, 12, bf16)
    generator = torch.Generator(device="cuda").manual_seed(13)
    bias = (torch.randn(n, generator=generator, device="cuda") * 50).to(bias_dtype)
    alpha = torch.tensor([ALPHA], device="cuda")
    out = torch.full((m, n), float("nan"), dtype=out_dtype, device="cuda")
    assert alpha_matmul(a, b, alpha, out, bias)
    sums = (a.double() @ b.double().T).float()
    scaled = alpha * sums
    assert torch.equal(out, (scaled + bias.float()).to(out_dtype))
    fused = (alpha.double() * sums.double() + bias.double()).float()
    assert out_dtype != f32 or (fused != scaled + bias.float()).any()


def test_graph_replay_reads_the_new_alpha() -> None:
    a, b = integer_matrix(128, 256, 3, torch.bfloat16), integer_matrix(192, 256, 4, torch.bfloat16)
    alpha = torch.tensor([ALPHA], device="cuda")
    out = torch.empty(128, 192, dtype=torch.bfloat16, device="cuda")
    assert alpha_matmul(a, b, alpha, out)  # the plan and the library, before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        alpha_matmul(a, b, alpha, out)
    alpha.fill_(-1.7)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, expected(a, b, alpha, torch.bfloat16))


def test_what_it_does_not_take_is_left_to_the_caller() -> None:
    a, b = integer_matrix(64, 64, 5, torch.bfloat16), integer_matrix(64, 64, 6, torch.bfloat16)
    alpha, out = torch.tensor([ALPHA], device="cuda"), torch.zeros(64, 64, device="cuda")
    assert not alpha_matmul(a.float(), b.float(), alpha, out)  # float32 operands
    assert not alpha_matmul(a[:, ::2], b[:, ::2], alpha, out[:, :32].contiguous())  # strided
    assert not alpha_matmul(a, b, alpha, out.T)  # an output that is not contiguous
    assert not alpha_matmul(a, b, alpha.double(), out)
    assert not alpha_matmul(a, b, alpha, out.half())  # an output of a third dtype
    assert not alpha_matmul(a, b, alpha, out, torch.zeros(63, device="cuda"))  # bias length
    assert not alpha_matmul(a, b, alpha, out.bfloat16(), torch.zeros(64, device="cuda"))
    assert torch.equal(out, torch.zeros_like(out))  # untouched


def test_nvfp4_decoded_takes_the_route(monkeypatch) -> None:
    from fp4cli.gemm import nvfp4_matmul, nvfp4_matmul_reference
    from fp4cli.kernels.gemm import nvfp4_launch
    from tests.kernels.test_gemm_nvfp4 import assert_exact_sums, assert_matches, random_operand

    taken: list[bool] = []

    def recorded(*args):
        taken.append(alpha_matmul(*args))
        return taken[-1]

    monkeypatch.setattr(nvfp4_launch, "alpha_matmul", recorded)
    a = random_operand(256, 512, seed=7, device="cuda")
    b = random_operand(384, 512, seed=8, device="cuda")
    assert_exact_sums(a, b)
    got = nvfp4_matmul(a, b, torch.bfloat16, backend="triton", impl="decoded")
    assert taken == [True]
    assert_matches(got, nvfp4_matmul_reference(a, b, torch.bfloat16))


def scaled_product(a: torch.Tensor, b: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device="cuda")
    assert alpha_matmul(a, b, alpha, out)
    return out


@pytest.mark.parametrize("mode", ["off", "always"])
def test_replays_launch_the_recorded_plan_at_any_alignment(mode) -> None:
    """A recorded program replays the call's plan (`_BoundMatmul`), or from a CUDA graph that
    holds it: the bits of a direct call, also for operands of another pointer alignment
    (32 bytes past a 256-byte boundary: the same program signature, another plan)."""
    from fp4cli.replay import ProgramCache, graphs

    cache = ProgramCache()
    storage = integer_matrix(2, 160 * 256 + 16, 21, bf16)[0]
    b = integer_matrix(96, 256, 22, bf16)
    with graphs(mode):
        for call, offset in enumerate([0, 0, 0, 0, 0, 16, 0]):
            a = storage[offset : offset + 160 * 256].view(160, 256)
            alpha = torch.tensor([ALPHA + call], device="cuda")
            got = cache.run("alpha", scaled_product, (a, b, alpha))
            assert torch.equal(got, expected(a, b, alpha, bf16)), (call, offset)
    assert len(cache.programs()) == 1 and cache.refusals() == []
    assert len(cache.graphs()) == (mode == "always") and cache.graph_refusals() == []
