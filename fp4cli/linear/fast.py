"""The quantized Linear's fast executor: the operand plan of `function.py`, run as three fused
pair quantizations (`fp4cli.kernels.quantization.launch_pair`) with packed backward operands saved.

`function.py` is the definition: it fake-quantizes each of the six operands on its own. Here
each of X, W and dY is read once and quantized in both block directions in one launch:

    X   along in_features  -> forward operand (values)  | along tokens -> grad_weight (packed)
    W   along in_features  -> forward operand (values)  | along out    -> grad_input (values)
    dY  along out_features -> grad_input (values)       | along tokens -> grad_weight (values)

with the same specs, seeds, Hadamard transforms and double quantization, so every operand has
the reference's bits and the three GEMMs are the reference's calls on them. The backward
operand of X is saved packed (4.25 bits a value) instead of a 16-bit copy and decoded in the
backward pass.

With `gemm: exact` or `fast`, each GEMM takes the route `gemm_route` gives it: one whose two
operands `mxfp4_matmul` takes gets both packed and multiplies them there, in that mode
("exact" gives the reference's products up to float32 summation order, "fast" flushes what its
mode flushes, `fp4cli.gemm.matmul`); one of two NVFP4 operands gets their block values q * s and
tensor amaxes and multiplies them as Blackwell's block-scaled MMA does (`block_scaled_mm`, the
reference executor's product too). The bias (in the compute dtype, as `F.linear` under
autocast takes it) is added to the float32 sums before their one rounding, in the GEMM's
epilogue; W's grad_input operand is kept in its GEMM's form. The gradients leave in the dtypes
of x, W and the bias as the layer got them (float32 under bfloat16 autocast): widened, and the
bias sums added up from the pair kernel's partial sums and rounded through bfloat16, in one
launch (`in_target_dtypes`) instead of a sum and autograd's casts, with the casts' bits.

`fast_gap(config)` says why a config cannot run here (then the layer runs `function.py`):
every quantized operand must be an E2M1 or E1M2 spec the kernels take (two-level specs included;
2-D weight tiles without a Hadamard transform); no DGE or outlier clamping. Q-EMA's guided
rounding of the forward W runs in the kernel, which forms the guide from the weight average
(`AverageGuide`).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from fp4cli.kernels.host.tiling import ColumnSums
from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast_operands import (
    Request,
    Saved,
    operand_request,
    packed_operand,
    quantize_both,
    quantized_length,
    saved_form,
)
from fp4cli.linear.gathered import (
    WeightOperands,
    decoded,
    operand_form,
)
from fp4cli.linear.operands import GEMM_OPERAND_FIELDS
from fp4cli.linear.recompute import OutputUse, tag
from fp4cli.linear.routes import block_product
from fp4cli.quant import QuantizedTensor
from fp4cli.quant.backend import kernel_gap
from fp4cli.techniques.qema import AverageGuide


def fast_gap(config: LinearConfig) -> str | None:
    """Why the fast executor cannot run `config`, or None when it can."""
    if config.out_control is not None:
        return "OutControl: FP8 channels beside FP4 ones"
    if config.dge is not None:
        return "DGE"
    if config.trust is not None:
        return "the trust estimator (the reference executor masks the gradients)"
    if config.double_quant and config.forward_hadamard is not None:
        return "double quantization after a forward Hadamard transform"
    if config.outliers is not None:
        return "outlier clamping"
    for gemm, operands in GEMM_OPERAND_FIELDS.items():
        for name in operands:
            spec = config.spec(name)
            if spec is None:
                continue
            gap = kernel_gap(spec.replace(tile2d=False), torch.float32)
            if gap is None and spec.tile2d:
                gap = _square_tile_gap(config, gemm)
            if gap is not None:
                return f"{name}: {gap}"
    return None


def _square_tile_gap(config: LinearConfig, gemm: str) -> str | None:
    """2-D tiles (weights only, kept as values) cannot be Hadamard-transformed here."""
    if config.hadamard(gemm) is not None:
        return "2-D tiles with a Hadamard transform"
    return None


def _product(
    a: tuple[torch.Tensor, ...],
    b: QuantizedTensor,
    request: Request,
    lines: int,
    mode: str,
    dtype: torch.dtype,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """mxfp4_matmul of `a` (a direction's packed result for `request`, `lines` lines of b's
    length) and b, in `mode`, plus the bias, rounded to `dtype`."""
    from fp4cli.gemm import mxfp4_matmul

    assert request.spec is not None
    a_operand = packed_operand(a, request.spec, lines, b.shape[1], dtype)
    return mxfp4_matmul(a_operand, b, out_dtype=dtype, mode=mode, backend="triton", bias=bias)


def saved_layouts(
    config: LinearConfig,
    call_seed: torch.Tensor,
    rank: int,
    x_shape: torch.Size | tuple[int, ...],
    w_shape: torch.Size | tuple[int, ...],
    dtype: torch.dtype,
) -> tuple[Request, Request, Saved, Saved]:
    """The backward operands the forward pass keeps: X's grad_weight operand packed (the
    activation memory), W's grad_input operand as values in the compute dtype (a weight-sized
    buffer, decoded once instead of every backward pass; packed, or block values, as its GEMM's
    route reads it); their requests and layouts."""
    x_for_dw = operand_request(config, "grad_weight", 1, call_seed, rank, keep_packed=True)
    w_for_dx = operand_request(config, "grad_input", 1, call_seed, rank)
    return (
        x_for_dw,
        w_for_dx,
        saved_form(x_for_dw, x_shape, dtype),
        saved_form(w_for_dx, w_shape, dtype),
    )


def fast_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: LinearConfig,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | AverageGuide | None,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
    dtype: torch.dtype | None = None,
    recompute: OutputUse | None = None,
    given: WeightOperands | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...], tuple[Saved, Saved]]:
    """y = x W^T + b, the backward operands of X and W, each () where its gradient is not
    needed, and how to read them (`saved_layouts`). dtype: the compute dtype (default x's), to
    which x and W are cast as autocast casts them (`read_as_rounded`). weight_guide: Q-EMA's,
    formed or (an AverageGuide) formed where W is read. recompute: X's forward operand is
    quantized packed and y tagged with the product that recomputes it and this OutputUse
    (`recompute.tag`). given: W's operands quantized already (`gathered.py`); W is not read."""
    dtype = dtype or x.dtype
    x, weight = x.contiguous(), weight.contiguous()
    bias = None if bias is None else bias.to(dtype)  # as F.linear under autocast
    x_for_dw, w_for_dx, *layouts = saved_layouts(
        config, call_seed, rank, x.shape, weight.shape, dtype
    )
    keep = recompute is not None
    x_request = operand_request(config, "forward", 0, call_seed, rank, keep_packed=keep)
    x_wanted = x_for_dw if needs_dw else None
    x, x_read_as = read_as_rounded(x, dtype, x_request, x_wanted)
    x_q, x_saved = quantize_both(
        x, x_request, x_wanted, dtype, config.double_quant, read_as=x_read_as
    )
    w_request = operand_request(config, "forward", 1, call_seed, rank)
    w_wanted = w_for_dx if needs_dx else None
    if given is not None:
        w_q, w_saved = _given_operands(given, weight, w_request, w_wanted, dtype)
    else:
        as_given = weight
        weight, w_read_as = read_as_rounded(weight, dtype, w_request, w_wanted)
        if isinstance(weight_guide, AverageGuide) and weight is not as_given:  # W cast: a copy
            weight_guide = weight_guide.values(as_given)
        w_q, w_saved = quantize_both(
            weight, w_request, w_wanted, dtype, config.double_quant, weight_guide,
            read_as=w_read_as,
        )  # fmt: skip
    saved = x_saved, w_saved, (layouts[0], layouts[1])
    length = quantized_length(weight.shape[1], w_request)  # X's and W's alike
    shapes = (x.shape[0], length), (weight.shape[0], length)
    operands = x_q, w_q, (x_request, w_request), shapes, config, dtype, bias
    y = _forward_product(*operands)
    if recompute is not None:
        tag(y, recompute, _forward_product, *operands)
    return y, *saved


def _given_operands(
    given: WeightOperands,
    weight: torch.Tensor,
    w_request: Request,
    w_wanted: Request | None,
    dtype: torch.dtype,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """W's forward operand and (when `w_wanted`) its grad_input operand from operands quantized
    already, in the forms `quantize_both` writes; under double quantization the grad_input
    operand re-quantizes the forward values here, as `quantize_both` does. `weight` holds the
    forward values (`gathered.py`): read as they are where the compute dtype is theirs."""
    values = weight if weight.dtype == dtype else None

    def form(operand: QuantizedTensor, request: Request) -> tuple[torch.Tensor, ...]:
        as_values = not request.packed and not request.block
        if values is not None and as_values and operand is given.forward:
            return (values,)
        return operand_form(operand, request, dtype)

    w_q = form(given.forward, w_request)
    if w_wanted is None:
        return w_q, ()
    if given.grad_input is not None:
        return w_q, form(given.grad_input, w_wanted)
    source = values if values is not None else decoded(given.forward, dtype)
    return w_q, quantize_both(source, None, w_wanted, dtype)[1]


def _forward_product(
    x_q: tuple[torch.Tensor, ...],
    w_q: tuple[torch.Tensor, ...],
    requests: tuple[Request, Request],
    shapes: tuple[tuple[int, int], tuple[int, int]],
    config: LinearConfig,
    dtype: torch.dtype,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """y = X W^T + b from the forward operands as the pair kernels gave them (X's packed where
    its request asked: then decoded for a GEMM on values), on the forward GEMM's route."""
    (x_request, w_request), (x_shape, w_shape) = requests, shapes
    route = config.routes["forward"]
    if route == "mxfp4":
        w_operand = Saved(w_request.spec, w_shape, dtype, axis=1).operand(w_q)
        return _product(x_q, w_operand, x_request, x_shape[0], config.gemm, dtype, bias)
    block = route == "block"
    x_values = x_q[0]
    if x_request.packed:
        x_values = Saved(x_request.spec, x_shape, dtype, axis=1, block=block).values(x_q)
    if block:
        return block_product(x_values, w_q[0].t(), (x_q[-1], w_q[1]), config, "forward", dtype,
                             bias)  # fmt: skip
    return F.linear(x_values, w_q[0], bias)


def read_as_rounded(
    tensor: torch.Tensor, dtype: torch.dtype, *requests: Request | None
) -> tuple[torch.Tensor, torch.dtype | None]:
    """(the tensor to quantize, the dtype the pair kernel rounds it to as it reads it) for a
    tensor that the compute dtype casts: a float32 X or W under bfloat16 autocast (a
    LayerNorm's output, the parameters) is rounded in the kernels, without a cast pass, when
    every operand drawn from it is quantized there (the bits of `tensor.to(dtype)`,
    `launch_pair.rounds_as_read`; a two-level spec's amax pass rounds it alike); otherwise it
    is cast here."""
    from fp4cli.kernels.quantization.launch_pair import rounds_as_read

    if tensor.dtype == dtype:
        return tensor, None
    quantized = all(r.spec is not None for r in requests if r is not None)
    if quantized and rounds_as_read(tensor.dtype, dtype):
        return tensor, dtype
    return tensor.to(dtype), None


def fast_backward(
    grad_y: torch.Tensor,
    x_tensors: tuple[torch.Tensor, ...],
    w_tensors: tuple[torch.Tensor, ...],
    config: LinearConfig,
    call_seed: torch.Tensor,
    rank: int,
    layouts: tuple[Saved, Saved],
    needs: tuple[bool, bool, bool],
    targets: tuple[torch.dtype | None, ...] = (None, None, None),
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_w, grad_b) from dY and the forward's saved operands (`layouts`: X's and
    W's); `needs` says which of the three to compute. targets: the dtypes of x, W and the bias
    as the layer was given them (float32 under bfloat16 autocast): each gradient is returned
    in it, with the bits of autocast's casts (`in_target_dtypes`); None: dY's dtype."""
    needs_dx, needs_dw, needs_db = needs
    bias_sums = ColumnSums(grad_y.shape[1]) if needs_db else None
    dy_for_dx = operand_request(config, "grad_input", 0, call_seed, rank)
    dy_for_dw = operand_request(config, "grad_weight", 0, call_seed, rank)
    dtype, (tokens, features) = grad_y.dtype, grad_y.shape
    grad_y = grad_y.contiguous()
    # a quantized bias gradient sums grad_input's dY operand, in the same launch, but where the
    # launch writes block values (without the tensor scale): then from a launch of its own
    quantized_bias = needs_db and config.bias_gradient == "quantized"
    own_launch = quantized_bias and dy_for_dx.block
    summed_rows = quantized_bias and not own_launch
    dy_rows, dy_cols = quantize_both(
        grad_y,
        dy_for_dx if needs_dx or summed_rows else None,
        dy_for_dw if needs_dw else None,
        dtype,
        column_sums=None if own_launch else bias_sums,
        sum_row_values=summed_rows,
    )
    if own_launch:
        assert bias_sums is not None
        as_values = dataclasses.replace(dy_for_dx, packed=False, block=False)
        bias_sums.sum_columns(quantize_both(grad_y, as_values, None, dtype)[0][0])
    grad_x = grad_w = None
    if needs_dx:
        grad_x = _backward_product(
            "grad_input", dy_rows, dy_for_dx, tokens, (layouts[1], w_tensors), config, dtype
        )
    if needs_dw:
        grad_w = _backward_product(
            "grad_weight", dy_cols, dy_for_dw, features, (layouts[0], x_tensors), config, dtype
        )
    return in_target_dtypes((grad_x, grad_w), bias_sums, grad_y.dtype, targets)


def given_dtypes(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
) -> tuple[torch.dtype | None, ...]:
    """The dtypes x, W and the bias reach a layer's autograd Function in: the `targets` of its
    gradients (`in_target_dtypes`)."""
    return x.dtype, weight.dtype, bias.dtype if bias is not None else None


def in_target_dtypes(
    grads: tuple[torch.Tensor | None, torch.Tensor | None],
    bias_sums: ColumnSums | None,
    dtype: torch.dtype,
    targets: tuple[torch.dtype | None, ...],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """(grad_x, grad_w, grad_b): the GEMMs' gradients (in the compute dtype `dtype`) and the
    bias gradient, dY's column sums (float32: grad_y.sum(0) in another order) rounded to
    `dtype`, each in its target dtype. One launch (`kernels.gradients`) adds up the bias sums'
    partials, rounds them where a float32 bias computes in bfloat16, and widens each bfloat16
    gradient of a float32 tensor, instead of a sum and autograd's casts: the same bits."""
    from fp4cli.kernels.elementwise.gradients import widen_gradients

    wide = [t == torch.float32 and dtype == torch.bfloat16 for t in targets]
    widened = widen_gradients(
        [g if w else None for g, w in zip(grads, wide[:2], strict=True)],
        bias_sums,
        round_sums=wide[2],
    )
    grad_x, grad_w = (
        n if w else g for g, n, w in zip(grads, widened.gradients, wide[:2], strict=True)
    )
    grad_b = widened.sums
    if grad_b is not None and not wide[2]:
        grad_b = grad_b.to(dtype)
    return grad_x, grad_w, grad_b


def _backward_product(
    gemm: str,
    dy: tuple[torch.Tensor, ...],
    dy_request: Request,
    lines: int,
    kept: tuple[Saved, tuple[torch.Tensor, ...]],
    config: LinearConfig,
    dtype: torch.dtype,
) -> torch.Tensor:
    """grad_input (dY W) or grad_weight (dY^T X) from dY's operand (`lines` lines of it, as
    `dy_request` asked) and the forward's kept one, on the GEMM's route."""
    layout, tensors = kept
    route = config.routes[gemm]
    if route == "mxfp4":
        return _product(dy, layout.operand(tensors), dy_request, lines, config.gemm, dtype)
    dy_values = dy[0] if gemm == "grad_input" else dy[0].t()
    if route == "block":
        amaxes = (dy[1], layout.amax(tensors))
        return block_product(dy_values, layout.values(tensors), amaxes, config, gemm, dtype)
    return dy_values.mm(layout.values(tensors))
