"""The quantized Linear's vector-wise executor: the operand plan of `function.py` for the configs
whose operands have one power-of-two scale per row, per column or per tensor (Wang et al.'s
`wang-fp4` and `wang-direct`: FP4 forward, FP8 backward), run on the kernels of
`fp4cli.kernels.vector.launch`.

    X   forward operand: per-row clamp (exact order statistics) + quantize, one program per
        rows, values; backward operand (double quantization: of those values, whose amax the
        same pass reduces): codes, one byte a value, saved instead of a 16-bit copy of X
    W   forward operand: per-column amax (atomics) + quantize, values; backward operand
        (per-tensor FP8 of those values, amax again from the same pass): values
    dY  one per-tensor FP8 quantization (amax + quantize) shared by both backward GEMMs when
        their specs give the same operand, as Wang et al.'s code shares it; the amax pass also
        sums dY's columns, the bias gradient (the same sums as `grad_y.sum(0)`, another order)

Each operand has the reference's bits; the GEMMs are the reference's calls on them, and DGE's
factor (`fp4cli.techniques.dge.dge_derivative` on the weight over the forward scales the W pass
wrote) is multiplied into the weight gradient by `dge_scale_gradient`: two kernels around
torch's `pow`, the same bits. No value is read back to the host.

`vector_gap(config)` says why a config cannot run here (then the layer runs `function.py`):
every quantized operand an E2M1 / E4M3 / E5M2 spec with block row, column or tensor, E8M0
scales and RNE; no Hadamard transform or Q-EMA; outlier clamping by the "nearest" method on a
forward X with one scale per row (with or without compensation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fp4cli.kernels.host.tiling import ColumnSums
from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import given_dtypes, in_target_dtypes
from fp4cli.linear.operands import GEMM_OPERAND_FIELDS, GEMMS, OPERANDS
from fp4cli.linear.plans import run_planned
from fp4cli.linear.recompute import OutputUse, tag
from fp4cli.quant import QuantSpec
from fp4cli.quant.backend import scale_rule_gap
from fp4cli.techniques.outliers import nearest_ranks


def vector_gap(config: LinearConfig) -> str | None:
    """Why the vector-wise executor cannot run `config`, or None when it can."""
    from fp4cli.kernels.vector.launch import scaled_by, vector_spec_gap

    if config.out_control is not None:
        return "OutControl"

    for gemm in GEMMS:
        if config.hadamard(gemm) is not None:
            return f"{gemm}: a Hadamard transform"
    if config.qema is not None:
        return "Q-EMA"
    if config.trust is not None:
        return "the trust estimator"
    if config.bias_gradient != "dy":
        return "a bias gradient from the quantized dY"
    for name in OPERANDS:
        spec = config.spec(name)
        gap = (scale_rule_gap(spec) or vector_spec_gap(spec)) if spec is not None else None
        if gap is not None:
            return f"{name}: {gap}"
    outliers = config.outliers
    if outliers is not None:
        if outliers.method != "nearest":
            return f"outlier clamping by the {outliers.method!r} method"
        assert config.forward_x is not None  # LinearConfig requires it with outliers
        if scaled_by(config.forward_x, 1) != "row":
            return "outlier clamping of a forward_x without one scale per row"
    return None


@dataclass(frozen=True)
class Kept:
    """A backward operand kept between the passes: codes and scales (decoded with `spec` along
    `axis`) or, with spec None, the values themselves. (On the FP8 route the kept codes are the
    operand's transpose's, which `fp8_mm` reads as they are.)"""

    spec: QuantSpec | None
    axis: int
    dtype: torch.dtype

    def values(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.spec is None:
            return tensors[0]
        from fp4cli.kernels.vector.launch import decode_vector

        codes, scales = tensors
        return decode_vector(codes, scales, self.spec, self.axis, self.dtype)


class _Workspace:
    """Zeroed int32 amax slots for one pass of the layer, from one allocation."""

    def __init__(self, sizes: list[int], device: torch.device) -> None:
        self.parts: list[torch.Tensor | None] = [None] * len(sizes)
        if not any(sizes):
            return
        buffer = torch.zeros(sum(sizes), dtype=torch.int32, device=device)
        wanted = [index for index, size in enumerate(sizes) if size]
        # the parts as views from one call: one host step of a replayed program, not one a part
        parts = (
            (buffer,) if len(wanted) == 1 else buffer.split_with_sizes([sizes[i] for i in wanted])
        )
        for index, part in zip(wanted, parts, strict=True):
            self.parts[index] = part


def _slots(spec: QuantSpec | None, axis: int, shape: torch.Size, needed: bool = True) -> int:
    """Amax slots a quantization needs (none for per-row scales, reduced in one program)."""
    from fp4cli.kernels.vector.launch import scale_count, scaled_by

    if spec is None or not needed or scaled_by(spec, axis) == "row":
        return 0
    return scale_count(spec, axis, tuple(shape))


@dataclass(frozen=True)
class SourcePlan:
    """What is made of one source tensor (X or W, (rows, features)): its forward operand along
    the features, and its backward operand along the rows when `backward_needed`."""

    forward: QuantSpec | None
    backward: QuantSpec | None
    backward_needed: bool
    double: bool
    keep_codes: bool  # keep the backward operand as codes and scales (else values)
    forward_scales: bool = False  # also return the forward operand's scales (DGE)
    transposed: bool = False  # the kept codes are the backward operand's transpose's (FP8 route)
    forward_codes: bool = False  # the forward operand as codes and scales (FP8 route)

    @property
    def kept_count(self) -> int:
        """How many tensors hold the kept backward operand."""
        if not self.backward_needed:
            return 0
        return 2 if self.keep_codes and self.backward is not None else 1

    def kept(self, dtype: torch.dtype) -> Kept:
        """How to read the kept backward operand."""
        return Kept(self.backward if self.keep_codes else None, 0, dtype)

    @property
    def fused_amax(self) -> bool:
        """The backward operand is a per-tensor quantization of the forward values: their
        amax is reduced by the forward pass itself."""
        from fp4cli.kernels.vector.launch import scaled_by

        return (
            self.backward_needed
            and self.double
            and self.forward is not None
            and self.backward is not None
            and scaled_by(self.backward, 0) == "tensor"
        )

    def slot_sizes(self, shape: torch.Size) -> list[int]:
        """[fused amax, forward amax lines, backward amax lines] slots."""
        backward_lines = 0 if self.fused_amax else _slots(self.backward, 0, shape)
        return [
            int(self.fused_amax),
            _slots(self.forward, 1, shape),
            backward_lines if self.backward_needed else 0,
        ]


def _source_operands(
    tensor: torch.Tensor,
    plan: SourcePlan,
    dtype: torch.dtype,
    slots: list[torch.Tensor | None],
    clamp: Any = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor | None]:
    """(forward operand: values, or codes with `plan.forward_codes`; the kept backward
    operand's tensors (read as `plan.kept`); the forward scales when asked or with codes)."""
    from fp4cli.kernels.vector.launch import quantize_codes, quantize_vector

    fused, forward_lines, backward_lines = slots
    forward, scales = tensor, None
    if plan.forward is not None:
        forward, scales = quantize_vector(
            tensor, plan.forward, 1, None if plan.forward_codes else dtype, clamp=clamp,
            scales=plan.forward_scales or plan.forward_codes, amax_out=fused,
            workspace=forward_lines,
        )  # fmt: skip
    if not plan.backward_needed:
        return forward, (), scales
    source = forward if plan.double else tensor
    if plan.backward is None:
        return forward, (source,), scales
    if plan.transposed:
        _, codes_t, backward_scales = quantize_codes(
            source, plan.backward, 0, rows_out=False, transposed=True, amax=fused,
            workspace=backward_lines,
        )  # fmt: skip
        assert codes_t is not None
        return forward, (codes_t, backward_scales), scales
    backward = quantize_vector(
        source, plan.backward, 0, None if plan.keep_codes else dtype, scales=plan.keep_codes,
        amax=fused, workspace=backward_lines,
    )  # fmt: skip
    tensors = backward if plan.keep_codes else backward[:1]
    return forward, tuple(t for t in tensors if t is not None), scales


def _clamp(config: LinearConfig, features: int) -> Any:
    from fp4cli.kernels.vector.launch import Clamp

    if config.outliers is None:
        return None
    low, high = nearest_ranks(features, config.outliers.quantile)
    return Clamp(low, high, config.outliers.compensate)


Operand = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # values, or (codes, scales)


def _gradient_operands(
    grad_y: torch.Tensor,
    specs: tuple[QuantSpec | None, QuantSpec | None],
    needed: tuple[bool, bool],
    fp8: tuple[bool, bool],
    bias_sums: ColumnSums | None = None,
) -> tuple[Operand | None, Operand | None]:
    """dY's grad_input operand (along out_features) and grad_weight operand (along tokens):
    values, or for a GEMM on the FP8 route (`fp8`) codes and scales, the grad_weight one as
    dY^T's codes; one quantization serves both when their specs scale alike (per tensor, say).
    bias_sums: given dY's column sums (the bias gradient), as partial sums of the first amax
    pass over dY where one runs, else complete by torch."""
    from fp4cli.kernels.vector.launch import scaled_by

    (spec_dx, spec_dw), (need_dx, need_dw) = specs, needed
    shared = (
        need_dx
        and need_dw
        and spec_dx is not None
        and spec_dx == spec_dw
        and scaled_by(spec_dx, 1) == scaled_by(spec_dx, 0)
        and fp8[0] == fp8[1]
    )
    sizes = [
        _slots(spec_dx, 1, grad_y.shape, need_dx),
        0 if shared else _slots(spec_dw, 0, grad_y.shape, need_dw),
    ]
    slots = _Workspace(sizes, grad_y.device).parts
    # the sums go to the first quantization of dY that reduces an amax (column or tensor scales)
    dx_sums = bias_sums if sizes[0] else None
    dw_sums = bias_sums if sizes[1] and dx_sums is None else None
    if bias_sums is not None and dx_sums is None and dw_sums is None:
        bias_sums.sum_columns(grad_y)
    if shared:
        return _dy_operands(grad_y, spec_dx, 1, fp8[0], (slots[0], dx_sums), (True, True))
    rows = cols = None
    if need_dx:
        rows = _dy_operands(grad_y, spec_dx, 1, fp8[0], (slots[0], dx_sums), (True, False))[0]
    if need_dw:
        cols = _dy_operands(grad_y, spec_dw, 0, fp8[1], (slots[1], dw_sums), (False, True))[1]
    return rows, cols


def _dy_operands(
    grad_y: torch.Tensor,
    spec: QuantSpec | None,
    axis: int,
    codes: bool,
    lines: tuple[torch.Tensor | None, ColumnSums | None],
    wanted: tuple[bool, bool],
) -> tuple[Operand | None, Operand | None]:
    """dY quantized along `axis`, as the (grad_input, grad_weight) operands `wanted`: the same
    values for both, or codes in dY's layout and in dY^T's (one launch writes both). lines:
    (amax workspace, column sums) for the amax pass."""
    from fp4cli.kernels.vector.launch import quantize_codes, quantize_vector

    if spec is None:
        return grad_y, grad_y
    slot, sums = lines
    if not codes:
        values = quantize_vector(
            grad_y, spec, axis, grad_y.dtype, workspace=slot, column_sums=sums
        )[0]
        return values, values
    rows_out, codes_t, scales = quantize_codes(
        grad_y, spec, axis, rows_out=wanted[0], transposed=wanted[1], workspace=slot,
        column_sums=sums,
    )  # fmt: skip
    return (
        (rows_out, scales) if rows_out is not None else None,
        (codes_t, scales) if codes_t is not None else None,
    )


def vector_plans(
    config: LinearConfig, needs_dx: bool, needs_dw: bool
) -> tuple[SourcePlan, SourcePlan]:
    """What is made of X (its backward operand kept as codes) and of W (as values, with its
    forward scales when DGE needs them)."""
    dge = config.dge is not None and needs_dw
    routes = config.routes
    fp8 = {gemm: routes[gemm] == "fp8" for gemm in GEMMS}
    x_plan = SourcePlan(
        config.forward_x, config.grad_weight_x, needs_dw, config.double_quant, True,
        transposed=fp8["grad_weight"], forward_codes=fp8["forward"],
    )  # fmt: skip
    w_plan = SourcePlan(
        config.forward_w, config.grad_input_w, needs_dx, config.double_quant, fp8["grad_input"],
        dge, transposed=fp8["grad_input"], forward_codes=fp8["forward"],
    )  # fmt: skip
    return x_plan, w_plan


def _pair(kept: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    codes, scales = kept
    return codes, scales


def _product(
    a: Operand,
    b: Operand,
    config: LinearConfig,
    gemm: str,
    dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """`gemm`'s a @ b: of codes on the FP8 route (`fp8_mm`; b given as its transpose's codes,
    the bias, on that route only, in its epilogue), else of values."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        return a.mm(b)
    from fp4cli.gemm.fp8 import fp8_mm

    assert isinstance(b, tuple)
    a_spec, b_spec = (config.spec(name) for name in GEMM_OPERAND_FIELDS[gemm])
    assert a_spec is not None and b_spec is not None
    return fp8_mm(a, b, (a_spec, b_spec), dtype, bias)


def _forward_product(
    x: tuple[torch.Tensor, torch.Tensor | None],
    w: tuple[torch.Tensor, torch.Tensor | None],
    config: LinearConfig,
    dtype: torch.dtype,
    bias: torch.Tensor | None,
    codes: bool,
) -> torch.Tensor:
    """y = X W^T + b from the forward operands (operand, its scales): codes on the FP8 route
    (W's codes are (out, in), b's transpose's), else values."""
    if codes:
        assert x[1] is not None and w[1] is not None
        bias = None if bias is None else bias.to(dtype)  # as F.linear under autocast
        return _product((x[0], x[1]), (w[0], w[1]), config, "forward", dtype, bias)
    return F.linear(x[0], w[0], bias)


def vector_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: LinearConfig,
    needs_dx: bool,
    needs_dw: bool,
    recompute: OutputUse | None = None,
) -> tuple[
    torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]
]:
    """y = x W^T + b, X's and W's kept backward operands (`SourcePlan.kept_count` tensors each),
    and DGE's (weight, forward scales) where `vector_plans` asks for the forward scales.
    recompute: y is tagged with its product and the forward operands (`recompute.tag`)."""
    x, weight, dtype = x.contiguous(), weight.contiguous(), x.dtype
    x_plan, w_plan = vector_plans(config, needs_dx, needs_dw)
    x_sizes, w_sizes = x_plan.slot_sizes(x.shape), w_plan.slot_sizes(weight.shape)
    slots = _Workspace(x_sizes + w_sizes, x.device).parts
    x_q, x_kept, x_scales = _source_operands(
        x, x_plan, dtype, slots[:3], _clamp(config, x.shape[1])
    )
    w_q, w_kept, w_scales = _source_operands(weight, w_plan, dtype, slots[3:])
    operands = (x_q, x_scales), (w_q, w_scales), config, dtype, bias, x_plan.forward_codes
    y = _forward_product(*operands)
    if recompute is not None:
        tag(y, recompute, _forward_product, *operands)
    dge_tensors = (weight, w_scales) if w_plan.forward_scales and w_scales is not None else ()
    return y, x_kept, w_kept, dge_tensors


def vector_backward(
    grad_y: torch.Tensor,
    kept: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]],
    config: LinearConfig,
    dtype: torch.dtype,
    needs: tuple[bool, bool, bool],
    targets: tuple[torch.dtype | None, ...] = (None, None, None),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_w, grad_b) from dY and `vector_forward`'s kept tensors (X's, W's, DGE's);
    `needs` says which of the three to compute, dtype is the forward's compute dtype. targets:
    the dtypes x, W and the bias came in, as for `fast.fast_backward`."""
    from fp4cli.kernels.vector.launch import dge_scale_gradient

    needs_dx, needs_dw, needs_db = needs
    x_kept, w_kept, dge_tensors = kept
    x_plan, w_plan = vector_plans(config, needs_dx, needs_dw)
    grad_y = grad_y.contiguous()
    bias_sums = ColumnSums(grad_y.shape[1]) if needs_db else None
    dy_rows, dy_cols = _gradient_operands(
        grad_y,
        (config.grad_input_dy, config.grad_weight_dy),
        (needs_dx, needs_dw),
        (w_plan.transposed, x_plan.transposed),
        bias_sums,
    )
    grad_x = grad_w = None
    if needs_dx:
        assert dy_rows is not None
        w_operand = _pair(w_kept) if w_plan.transposed else w_plan.kept(dtype).values(w_kept)
        grad_x = _product(dy_rows, w_operand, config, "grad_input", dtype)
    if needs_dw:
        assert dy_cols is not None
        a = dy_cols if isinstance(dy_cols, tuple) else dy_cols.t()
        x_operand = _pair(x_kept) if x_plan.transposed else x_plan.kept(dtype).values(x_kept)
        grad_w = _product(a, x_operand, config, "grad_weight", dtype)
        if dge_tensors:
            weight, scales = dge_tensors
            assert config.forward_w is not None and config.dge is not None
            grad_w = dge_scale_gradient(grad_w, weight, scales, config.forward_w, config.dge)
    return in_target_dtypes((grad_x, grad_w), bias_sums, grad_y.dtype, targets)


def planned_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: LinearConfig,
    key: str,
    needs_dx: bool,
    needs_dw: bool,
    dtype: torch.dtype | None,
) -> tuple[
    torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]
]:
    """`vector_forward` without recomputation, on x, W and the bias cast to `dtype` (None:
    as they are), replayed from the layer programs (`fp4cli.linear.plans`); `key` is the
    config's `ops.op_key`."""

    def call(x, weight, bias):
        x, weight, bias = in_compute_dtype(x, weight, bias, dtype)
        return vector_forward(x, weight, bias, config, needs_dx, needs_dw)

    return run_planned(("vector_forward", key, needs_dx, needs_dw, dtype), call, (x, weight, bias))


def planned_backward(
    grad_y: torch.Tensor,
    kept: tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]],
    config: LinearConfig,
    key: str,
    dtype: torch.dtype,
    needs: tuple[bool, bool, bool],
    targets: tuple[torch.dtype | None, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """`vector_backward`, replayed from the layer programs."""
    first, second = len(kept[0]), len(kept[0]) + len(kept[1])

    def call(grad_y, *saved):
        groups = (saved[:first], saved[first:second], saved[second:])
        return vector_backward(grad_y, groups, config, dtype, needs, targets)

    signature = ("vector_backward", key, dtype, needs, targets, first, second)
    return run_planned(signature, call, (grad_y, *kept[0], *kept[1], *kept[2]))


def in_compute_dtype(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """x, W and the bias cast to the compute dtype as autocast casts them (None: unchanged)."""
    if dtype is None:
        return x, weight, bias
    return x.to(dtype), weight.to(dtype), bias.to(dtype) if bias is not None else None


class VectorQuantLinearFunction(torch.autograd.Function):
    """y = x W^T + b for 2-D x (tokens, in_features) under a LinearConfig that `vector_gap`
    accepts: the same operands and GEMMs as QuantLinearFunction, fewer passes and bytes.
    (Under torch.compile the layer calls the same steps as custom ops: `ops.py`.) Both passes
    replay the layer programs unless the output is tagged for recomputation."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        config: LinearConfig,
        key: str,
        dtype: torch.dtype | None = None,
        recompute: OutputUse | None = None,
    ) -> torch.Tensor:
        """dtype: the compute dtype x, W and the bias are cast to (autocast's), if not theirs;
        recompute: `vector_forward`'s."""
        needs_dx, needs_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        ctx.targets = given_dtypes(x, weight, bias)
        if recompute is None:
            y, x_kept, w_kept, dge_tensors = planned_forward(
                x, weight, bias, config, key, needs_dx, needs_dw, dtype
            )
        else:
            x, weight, bias = in_compute_dtype(x, weight, bias, dtype)
            y, x_kept, w_kept, dge_tensors = vector_forward(
                x, weight, bias, config, needs_dx, needs_dw, recompute
            )
        ctx.save_for_backward(*x_kept, *w_kept, *dge_tensors)
        ctx.split = (len(x_kept), len(x_kept) + len(w_kept))
        ctx.config, ctx.key, ctx.has_bias = config, key, bias is not None
        ctx.dtype = dtype or x.dtype
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        saved = ctx.saved_tensors
        first, second = ctx.split
        needs = ctx.needs_input_grad
        grads = planned_backward(
            grad_y,
            (saved[:first], saved[first:second], saved[second:]),
            ctx.config,
            ctx.key,
            ctx.dtype,
            (needs[0], needs[1], ctx.has_bias and needs[2]),
            ctx.targets,
        )
        return *grads, None, None, None, None
