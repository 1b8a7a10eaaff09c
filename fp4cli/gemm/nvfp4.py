"""nvfp4_matmul: the NVFP4 GEMM as Blackwell computes it, on any GPU with bf16 tensor cores.

The contract (`fp4cli.gemm.reference.nvfp4_matmul_reference` is its definition):

    D[m, n] = out( fl32( alpha * sum_k (q_a s_a)[m, k] (q_b s_b)[n, k] ) )
    alpha   = fl32( fl32(amax_a * amax_b) / fl32((S_a E) (S_b E)) )    (6 * 448 = 2688 for nvfp4)

Each product of block-scaled elements is exact in float32, the sum is a float32 accumulation
(any order), the two tensors' decode scales are applied once in the epilogue. q s has at most
6 significant bits between 2^-10 and 2688, so it is exactly a bfloat16 number: the kernels
decode both operands to bfloat16 and run the bf16 tensor cores with float32 accumulation.

Implementations (`impl`):

- "fused": one launch; tiles of packed E2M1 codes and E4M3 scale codes are decoded to q s in
  registers and fed to `tl.dot`; alpha is computed in the kernel from the two amax tensors (no
  host synchronisation).
- "decoded": each operand decoded once to a bfloat16 tensor of q s (one elementwise launch
  each), cuBLAS's bf16 GEMM with a float32 output, and one launch multiplying by alpha and
  rounding to the output dtype.

Paths (`nvfp4_path`): "reference" (backend "torch", or where the kernels cannot run: a CPU
without TRITON_INTERPRET=1) or the impl's name.
"""

from __future__ import annotations

import math

import torch

from fp4cli.gemm.operands import GemmError, check_out
from fp4cli.gemm.reference import block_scaled_alpha, nvfp4_matmul_reference
from fp4cli.quant import QuantizedTensor, QuantSpec
from fp4cli.quant.backend import check_backend, interpreter_on, triton_available

NVFP4_IMPLS = ("fused", "decoded")
NVFP4_BLOCK = 16


def nvfp4_matmul(
    a: QuantizedTensor,
    b: QuantizedTensor,
    out_dtype: torch.dtype = torch.bfloat16,
    backend: str = "auto",
    out: torch.Tensor | None = None,
    impl: str = "decoded",
) -> torch.Tensor:
    """out(fl32(alpha * sum_k (q_a s_a)(q_b s_b))), shape (*, N), for a (*, K) and b (N, K)
    quantized with a one-dimensional two-level E2M1 spec (nvfp4: E4M3 scales per 16 values and
    a tensor amax) along K, their last axis. See the module for the contract.

    Rows of a (rows of b) holding a NaN block give NaN. backend: "torch" (the float64
    reference), "triton" (the kernels; an error where they cannot run) or "auto". out: an
    optional output tensor of the result's shape and `out_dtype`. impl: "decoded" (decode once
    to bf16, then cuBLAS: the faster on an H100) or "fused" (decoding in registers, one launch,
    no bf16 copies of the operands).
    """
    check_backend(backend)
    if impl not in NVFP4_IMPLS:
        raise GemmError(f"impl must be one of {', '.join(NVFP4_IMPLS)} (got {impl!r})")
    n = check_nvfp4_inputs(a, b)
    lead = tuple(a.shape[:-1])
    device = b.codes.device
    check_out(out, (*lead, n), out_dtype, device)
    if nvfp4_path(a, b, backend, impl) == "reference":
        result = nvfp4_matmul_reference(a, b, out_dtype)
        return out.copy_(result) if out is not None else result
    target = out if out is not None else torch.empty((*lead, n), dtype=out_dtype, device=device)
    if target.numel() == 0:
        return target
    rows = math.prod(lead)
    flat = target if target.dim() == 2 else target.view(rows, n) if target.is_contiguous() else None
    written = flat if flat is not None else torch.empty((rows, n), dtype=out_dtype, device=device)
    _run(impl, a, b, written)
    if flat is None:
        target.copy_(written.reshape(target.shape))
    return target


BLOCK_SCALED_ELEMENTS = ("e2m1", "e1m2")  # 2 or 3 significant bits
BLOCK_SCALED_SCALES = ("ue4m3", "ue5m3")  # 4 significant bits: q * s has at most 7, BF16 holds 8


def block_scaled_gap(name: str, spec: QuantSpec) -> str | None:
    """Why tensors of this spec (called `name`) cannot multiply as block-scaled operands
    (`block_scaled_mm`), or None: a two-level spec (one tensor scale) of E2M1 or E1M2 elements
    with UE4M3 or UE5M3 block scales (any block size, 1-D or 2-D tiles), no SR pre-scale, whose
    block values q * s are exact in bfloat16. NVFP4 is the one Blackwell multiplies natively."""
    if not spec.tensor_scale or spec.outer_block:
        return f"{name}'s {spec.short()} (block-scaled products take one tensor scale)"
    if spec.element not in BLOCK_SCALED_ELEMENTS or spec.scale not in BLOCK_SCALED_SCALES:
        return (
            f"{name}'s {spec.element}/{spec.scale} (block-scaled products take "
            f"{' or '.join(BLOCK_SCALED_ELEMENTS)} with {' or '.join(BLOCK_SCALED_SCALES)})"
        )
    if spec.sr_prescale != 1.0:
        return f"{name}'s sr_prescale {spec.sr_prescale:g} (q * s is not the value over it)"
    return None


def block_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    amaxes: tuple[torch.Tensor, torch.Tensor],
    factor: float,
    out_dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """out_dtype(fl32(alpha * (a @ b)) (+ bias (N,), added in float32 before the rounding, as
    Blackwell's GEMM epilogue adds it)) for matrices a (M, K) and b (K, N) of block values
    (`QuantizedTensor.block_values`: q * s, exact in their dtype) of two two-level tensors (NVFP4,
    or any `block_scaled_gap` takes) with these tensor amaxes, alpha = fl32(fl32(amax_a *
    amax_b) / factor) (`nvfp4_factor`): the contract of `nvfp4_matmul` on operands already
    decoded, as the quantized Linear holds them.
    The products are exact and summed in float32: where the kernels run, `nvfp4_matmul`'s
    decoded implementation from its GEMM on (cuBLASLt's bf16 GEMM with alpha and the bias in its
    epilogue, or cuBLAS's with a float32 output and one alpha epilogue launch), else in
    torch."""
    device = a.device
    if b.dtype == a.dtype and triton_available() and (device.type == "cuda" or interpreter_on()):
        from fp4cli.kernels.gemm.nvfp4_launch import block_values_matmul

        amax_a, amax_b = (t.to(torch.float32).reshape(1) for t in amaxes)
        out = torch.empty((a.shape[0], b.shape[1]), dtype=out_dtype, device=device)
        return block_values_matmul(a, b.t(), (amax_a, amax_b), factor, out, bias)
    sums = torch.mm(a.to(torch.float32), b.to(torch.float32))
    scaled = sums * block_scaled_alpha(*amaxes, factor)
    return (scaled if bias is None else scaled + bias.to(torch.float32)).to(out_dtype)


def nvfp4_path(
    a: QuantizedTensor, b: QuantizedTensor, backend: str = "auto", impl: str = "decoded"
) -> str:
    """Which implementation `nvfp4_matmul` runs for this pair: "reference" or `impl`."""
    check_backend(backend)
    if backend == "torch":
        return "reference"
    device = b.codes.device
    runnable = triton_available() and (device.type == "cuda" or interpreter_on())
    if runnable:
        return impl
    if backend == "triton":
        raise GemmError(
            "backend 'triton' needs triton and CUDA tensors (or TRITON_INTERPRET=1 on the CPU)"
        )
    return "reference"


def check_nvfp4_inputs(a: QuantizedTensor, b: QuantizedTensor) -> int:
    """N of a valid pair, or GemmError in one line."""
    for name, q in (("a", a), ("b", b)):
        if not isinstance(q, QuantizedTensor):
            raise GemmError(f"{name} must be a QuantizedTensor (got {type(q).__name__})")
        _check_spec(name, q)
        if q.axis != len(q.shape) - 1:
            raise GemmError(
                f"{name} is quantized along axis {q.axis}; the GEMM needs its blocks along K, "
                "the last axis (quantize with axis=-1)"
            )
        if q.tensor_amax is None or q.tensor_amax.numel() != 1:
            raise GemmError(f"{name} has no tensor amax (a two-level tensor carries one)")
    if len(b.shape) != 2:
        raise GemmError(f"b must be 2-D (N, K) (got shape {tuple(b.shape)})")
    if a.shape[-1] != b.shape[-1]:
        raise GemmError(
            f"a has K = {a.shape[-1]} but b has K = {b.shape[-1]} (a is (*, K), b is (N, K))"
        )
    if a.codes.device != b.codes.device:
        raise GemmError(f"a is on {a.codes.device} but b on {b.codes.device}")
    return int(b.shape[0])


def _check_spec(name: str, q: QuantizedTensor) -> None:
    spec = q.spec
    what = (
        f"{name}'s spec {spec.short()}: the NVFP4 GEMM takes e2m1 elements, ue4m3 scales per "
        f"{NVFP4_BLOCK} values and a tensor scale"
    )
    if spec.element != "e2m1" or spec.scale != "ue4m3" or spec.block != NVFP4_BLOCK:
        raise GemmError(what + " (quantize with QuantSpec.preset('nvfp4'))")
    if not spec.tensor_scale:
        raise GemmError(what + " (this one has no tensor scale)")
    if spec.tile2d:
        raise GemmError(f"{name}'s spec has 16x16 tiles; the NVFP4 GEMM takes 1-D blocks along K")
    if spec.outer_block:
        raise GemmError(
            f"{name}'s spec has a second-level scale per {spec.outer_block} values; the NVFP4 "
            "GEMM takes one per tensor"
        )
    if spec.sr_prescale != 1.0:
        raise GemmError(
            f"{name}'s spec has sr_prescale {spec.sr_prescale:g}; the NVFP4 GEMM takes "
            "operands that decode as q * s * tensor scale"
        )


def _run(impl: str, a: QuantizedTensor, b: QuantizedTensor, out: torch.Tensor) -> None:
    from fp4cli.gemm.reference import nvfp4_factor
    from fp4cli.kernels.gemm import nvfp4_launch as launch

    a_operand, b_operand = launch.operand(a), launch.operand(b)
    factor = nvfp4_factor(a, b)
    if impl == "fused":
        launch.fused_matmul(a_operand, b_operand, factor, out)
    else:
        launch.decoded_matmul(a_operand, b_operand, factor, out)
