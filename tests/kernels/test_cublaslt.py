"""The cuBLASLt route of the block-scaled GEMMs (`gemm.cublaslt`) on a machine without a GPU:
it leaves CPU tensors to its caller, and its descriptors, layouts and preferences are built
(host-side calls) with every attribute's size and every function's argument types checked.
tests/gpu/test_cublaslt_gpu.py checks what it computes."""

from __future__ import annotations

import ctypes

import pytest
import torch


def test_cublaslt_route_leaves_cpu_tensors_to_the_caller() -> None:
    from fp4cli.kernels.gemm.cublaslt import alpha_matmul

    a = torch.ones(16, 32, dtype=torch.bfloat16)
    out = torch.zeros(16, 16, dtype=torch.bfloat16)
    assert not alpha_matmul(a, a[:16], torch.ones(1), out)
    assert torch.equal(out, torch.zeros_like(out))


def test_cublaslt_descriptors_take_every_attribute_as_typed() -> None:
    """The descriptors of the cuBLASLt route are built on the host: every attribute's size and
    every function's argument types are checked here, where no GPU runs the GEMM itself."""
    from fp4cli.kernels.gemm import cublaslt

    lib = cublaslt._library()
    if lib is None:
        pytest.skip("no cuBLASLt library beside torch")
    for bias_alignment in (0, 16, 256):
        assert cublaslt.descriptor(cublaslt.OP_T, cublaslt.OP_N, bias_alignment).value
    for dtype in cublaslt.DATA_TYPES:
        assert cublaslt.layout(dtype, 768, 8192, 768).value
    prefs = cublaslt.preference((256, 256, 16, 16))
    assert prefs.value
    lib.cublasLtMatmulPreferenceDestroy(prefs)
    with pytest.raises(RuntimeError, match="cuBLASLt setting attribute"):
        cublaslt._set(
            lib.cublasLtMatmulDescSetAttribute,
            cublaslt.descriptor(cublaslt.OP_T, cublaslt.OP_N, 0),
            cublaslt.DESC_TRANSA,
            ctypes.c_int8(1),  # the wrong size: cuBLASLt refuses it
        )


def test_a_replay_launches_the_recorded_plan_only_at_the_recorded_alignments(monkeypatch) -> None:
    """`_BoundMatmul`: the plan was looked up by the pointers' alignments, so a replay whose
    pointers have others runs the whole function (which looks up the plan of theirs)."""
    from fp4cli.kernels.gemm import cublaslt

    launched, direct = [], []
    monkeypatch.setattr(cublaslt, "_launch", lambda route, *args: launched.append(args) or True)
    monkeypatch.setattr(cublaslt, "_direct_alpha_matmul", lambda *args: direct.append(args) or 1)
    storage = torch.zeros(4096, dtype=torch.bfloat16)
    a, b, out = storage[:512].view(16, 32), storage[1024:1536].view(16, 32), torch.empty(16, 16)
    alpha = torch.ones(1)
    route = cublaslt._Route((), 0, cublaslt._alignments(a, b, out, None))
    bound = cublaslt._BoundMatmul(route, convert_bias=False)
    assert bound(a, b, alpha, out) is True and len(launched) == 1 and not direct
    shifted = storage[8:520].view(16, 32)  # 16 bytes past a: another alignment
    assert bound(shifted, b, alpha, out) == 1 and len(direct) == 1 and len(launched) == 1
    route_with_bias = cublaslt._Route((), 0, (256, 256, 256, 256))
    monkeypatch.setattr(cublaslt, "_alignments", lambda *args: (256, 256, 256, 256))
    cublaslt._BoundMatmul(route_with_bias, convert_bias=True)(
        a, b, alpha, out, torch.zeros(16, dtype=torch.bfloat16)
    )
    assert launched[-1][-1].dtype == out.dtype  # the bias widened as the recorded call's was


def test_a_launch_hands_cublaslt_the_plans_objects_in_its_order(monkeypatch) -> None:
    """`_launch`'s call of cublasLtMatmul, with a stand-in library: D = alpha op(B') op(A') +
    beta C, C and D the output, beta the device's zero, the plan's descriptor, layouts and
    algorithm, no workspace, the current stream; the bias pointer set on the descriptor."""
    from fp4cli.kernels.gemm import cublaslt

    calls = {}

    class Library:
        def cublasLtMatmul(self, *args):
            calls["matmul"] = args
            return 0

        def cublasLtMatmulDescSetAttribute(self, desc, attribute, value, size):
            calls["bias"] = (desc, attribute)
            return 0

    zero = torch.zeros(1)
    monkeypatch.setattr(cublaslt, "_library", lambda: Library())
    monkeypatch.setattr(cublaslt, "_device_state", lambda index: ("handle", zero))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 77, raising=False)
    found = cublaslt._Heuristic()
    plan = cublaslt._Plan("desc", "first", "second", "result", found)
    a, b, out, alpha, bias = (torch.zeros(4, 4) for _ in range(5))
    route = cublaslt._Route(plan, 0, cublaslt._alignments(a, b, out, bias))
    assert cublaslt._launch(route, a, b, alpha, out, bias)
    args = calls["matmul"]
    assert args[:2] == ("handle", "desc") and args[2] == alpha.data_ptr()
    assert args[3:7] == (b.data_ptr(), "first", a.data_ptr(), "second")
    assert args[7:12] == (zero.data_ptr(), out.data_ptr(), "result", out.data_ptr(), "result")
    assert args[13:] == (None, cublaslt.WORKSPACE_BYTES, 77)
    assert calls["bias"] == ("desc", cublaslt.DESC_BIAS_POINTER)
