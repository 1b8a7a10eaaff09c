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
