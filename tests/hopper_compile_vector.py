"""The vector-wise kernels' launches compiled for Hopper (sm_90) without a GPU
(`tests.hopper_compile.compile_launches`): `python -m tests.hopper_compile_vector` (without
TRITON_INTERPRET) compiles the launches of the wang-fp4 layer (DGE's factor and the FP8
route's transposed codes too) and the other scale kinds, and prints how many."""

from __future__ import annotations

import torch


def vector_wise_launches() -> None:
    """Every kind of launch the vector-wise executor makes, on small CPU tensors (never run)."""
    import fp4cli.kernels.vector.launch as launch_vector
    from fp4cli.kernels.vector.launch import (
        Clamp,
        decode_vector,
        dge_scale_gradient,
        quantize_codes,
        quantize_vector,
    )
    from fp4cli.quant import QuantSpec
    from fp4cli.techniques.dge import DGEConfig

    bf16 = torch.bfloat16
    x, w = torch.randn(64, 96).to(bf16), torch.randn(48, 96).to(bf16)
    amax = torch.zeros(1, dtype=torch.int32)
    fp4_row, fp4_col = QuantSpec.preset("fp4-row"), QuantSpec.preset("fp4-column")
    e4m3, e5m2 = QuantSpec.preset("fp8-e4m3-tensor"), QuantSpec.preset("fp8-e5m2-tensor")
    # wang-fp4's X (ties toward +inf): clamped rows in one chunk with the fused amax, then its
    # FP8 codes
    ties_row, ties_col = (spec.replace(rounding="ties_up") for spec in (fp4_row, fp4_col))
    x_q, _ = quantize_vector(x, ties_row, 1, bf16, clamp=Clamp(0, 94), amax_out=amax)
    codes, scales = quantize_vector(x_q, e4m3, 0, None, scales=True, amax=amax)
    # W: per-column amax and values with scales (DGE) and the fused amax; its FP8 values
    w_q, w_scales = quantize_vector(w, ties_col, 1, bf16, scales=True, amax_out=amax)
    quantize_vector(w_q, e4m3, 0, bf16, amax=amax)
    # dY: the per-tensor amax (with the bias gradient's column sums) and cast; X's codes decoded
    quantize_vector(x, e5m2, 1, bf16)
    quantize_vector(x, e5m2, 1, bf16, column_sums=torch.empty(96))
    assert codes is not None and scales is not None
    decode_vector(codes, scales, e4m3, 0, bf16)
    # compensation; rows in chunks, with and without clamping; codes by row and column
    quantize_vector(x, fp4_row, 1, bf16, clamp=Clamp(0, 94, residual=True))
    chunk = launch_vector.ROW_CHUNK
    launch_vector.ROW_CHUNK = 32
    try:
        quantize_vector(x, fp4_row, 1, bf16, clamp=Clamp(0, 94))
        row_codes, row_scales = quantize_vector(x, fp4_row, 1, None, scales=True)
    finally:
        launch_vector.ROW_CHUNK = chunk
    assert row_scales is not None
    decode_vector(row_codes, row_scales, fp4_row, 1, bf16)
    col_codes, col_scales = quantize_vector(x, fp4_col, 1, None, scales=True)
    assert col_scales is not None
    decode_vector(col_codes, col_scales, fp4_col, 1, bf16)
    # the FP8 route: dY's codes in both layouts, X's and W's of the transpose only
    quantize_codes(x, e5m2, 1, rows_out=True, transposed=True, column_sums=torch.empty(96))
    quantize_codes(x_q, e4m3, 0, rows_out=False, transposed=True, amax=amax)
    # MS-AMP's bfloat16 scales (scale_bf16): clamped rows, columns with DGE's scales
    quantize_vector(x, ties_row.replace(scale_bf16=True), 1, bf16, clamp=Clamp(0, 94))
    quantize_vector(w, ties_col.replace(scale_bf16=True), 1, bf16, scales=True, amax_out=amax)
    # DGE's factor into the (transposed) bf16 weight gradient
    assert w_scales is not None
    grad_w = torch.randn(96, 48).to(bf16).t()
    dge_scale_gradient(grad_w, w.float(), w_scales, fp4_col, DGEConfig())


if __name__ == "__main__":
    import fp4cli.kernels.vector.launch as launch_vector
    from tests.hopper_compile import compile_launches

    kernels = [
        (launch_vector, "rows_kernel"),
        (launch_vector, "amax_kernel"),
        (launch_vector, "scaled_kernel"),
        (launch_vector, "decode_kernel"),
        (launch_vector, "dge_position_kernel"),
        (launch_vector, "dge_apply_kernel"),
    ]
    print(compile_launches(vector_wise_launches, kernels))
