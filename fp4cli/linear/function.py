"""The quantized linear layer's autograd function: three GEMMs, six operand quantizers.

Forward      Y  = Q1(X) Q2(W)^T        X, W blocked along in_features
grad_input   dX = Q3(dY) Q4(W)         dY, W blocked along out_features
grad_weight  dW = Q5(dY)^T Q6(X)       dY, X blocked along tokens

Each Qi is `fake_quantize` with the operand's spec (identity when None). A GEMM with a Hadamard
config transforms both its operands along its reduction dimension first. Q4 and Q6 read Q2(W) and
Q1(X) under double quantization, else the high-precision W and X. DGE multiplies dW by the
surrogate's derivative on the scaled weight; outlier clamping acts on X before Q1, and with
compensation the residual X - clamp(X) is added to Q1(clamp(X)) in float32, so the forward GEMM
and (under double quantization) the weight-gradient GEMM read Q1(clamp(X)) + residual, as Wang
et al.'s code computes it. With OutControl's channels chosen (`channels`), the forward GEMM
multiplies mixed operands (FP4 values on the FP4 channels, FP8 ones on the FP8 channels) and the
weight-gradient GEMM is two products, one per group of channels
(`fp4cli.techniques.out_control`). The GEMMs use the same aten calls as nn.Linear and its
autograd, so a layer with nothing quantized matches nn.Linear bit for bit.

After a forward Hadamard transform R, double quantization re-quantizes Q1(X R) and Q2(W R), so
the backward GEMMs give dX R and dW R; they are brought back by R^T. QuEST's trust estimator
(`fp4cli.techniques.trust`) masks dX R and dW R with the masks of Q1 and Q2, computed in the
forward pass (without double quantization dX and dW are taken into R's basis for it; without a
transform it masks dX and dW).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.gathered import WeightOperands
from fp4cli.linear.routes import block_product
from fp4cli.linear.stats import operand_stats
from fp4cli.quant import QuantizedTensor, QuantSpec, fake_quantize, quantize
from fp4cli.quant.random_bits import Seed
from fp4cli.techniques.dge import dge_derivative
from fp4cli.techniques.double_quant import backward_source
from fp4cli.techniques.hadamard import FixedSigns, HadamardConfig, inverse_rht, rht
from fp4cli.techniques.outliers import clamp_outliers
from fp4cli.techniques.trust import operand_mask

# Per call, operand k (0..5) draws its stochastic-rounding bits from seed + k and GEMM g (0..2)
# its Hadamard signs from seed + 6 + g; consecutive calls step the seed by SEED_STRIDE. On rank r
# of a distributed run, the activation and gradient operands (X, dY) add r * RANK_SEED_STRIDE:
# each rank rounds its own rows independently, while W and the Hadamard signs (shared by a
# GEMM's two operands) stay the same on every rank, as the weights are.
SEED_STRIDE = 16
RANK_SEED_STRIDE = 1 << 48
_OPERAND_SEED = {
    "forward_x": 0,
    "forward_w": 1,
    "grad_input_dy": 2,
    "grad_input_w": 3,
    "grad_weight_dy": 4,
    "grad_weight_x": 5,
}
_RHT_SEED = {"forward": 6, "grad_input": 7, "grad_weight": 8}
# OutControl's FP8 operands draw from seed + 9..12 (X and dY per rank, as above).
_FP8_SEED = {"forward_x": 9, "forward_w": 10, "grad_weight_dy": 11, "grad_weight_x": 12}


StatsSink = dict[tuple[str, str], torch.Tensor]  # (operand, metric) -> 0-d tensor


def _quantize_operand(
    tensor: torch.Tensor | QuantizedTensor,
    spec: QuantSpec | None,
    axis: int,
    seed: torch.Tensor,
    hadamard: tuple[int, torch.Tensor | FixedSigns] | None,
    compute_dtype: torch.dtype,
    backend: str,
    guide: torch.Tensor | None = None,
    stats: tuple[StatsSink, str] | None = None,
) -> torch.Tensor:
    """The operand as the GEMM reads it: Hadamard-transformed (size, seed or fixed signs) along
    `axis` if asked, then fake-quantized (one fused kernel where the backend allows), in the
    compute dtype; a QuantizedTensor (quantized before the call) decoded."""
    if isinstance(tensor, QuantizedTensor):  # quantized before the call (`gathered.py`)
        return tensor.dequantize(compute_dtype, backend)
    size, rht_seed = hadamard if hadamard is not None else (None, 0)
    if spec is None:
        transformed = rht(tensor, axis, size, rht_seed) if size else tensor
        return transformed.to(compute_dtype)
    quantized = fake_quantize(
        tensor, spec, axis=axis, seed=seed, guide=guide, hadamard=size, hadamard_seed=rht_seed,
        out_dtype=compute_dtype, backend=backend,
    )  # fmt: skip
    if stats is not None:
        _operand_stats(tensor, quantized, spec, axis, seed, (size, rht_seed), backend, stats)
    return quantized


def _block_operand(
    tensor: torch.Tensor | QuantizedTensor,
    spec: QuantSpec,
    axis: int,
    seed: torch.Tensor,
    hadamard: tuple[int, torch.Tensor | FixedSigns] | None,
    compute_dtype: torch.dtype,
    backend: str,
    guide: torch.Tensor | None = None,
    stats: tuple[StatsSink, str] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A two-level operand of a GEMM on the block-scaled route (`routes.gemm_route`),
    quantized as `_quantize_operand` quantizes it: (its block values q * s in the compute
    dtype, its tensor amax)."""
    size, rht_seed = hadamard if hadamard is not None else (None, 0)
    if isinstance(tensor, QuantizedTensor):  # quantized before the call (`gathered.py`)
        quantized = tensor
    else:
        quantized = quantize(
            tensor, spec, axis=axis, seed=seed, guide=guide, hadamard=size,
            hadamard_seed=rht_seed, backend=backend,
        )  # fmt: skip
    assert quantized.tensor_amax is not None
    if stats is not None and not isinstance(tensor, QuantizedTensor):
        values = quantized.dequantize(compute_dtype, backend)
        _operand_stats(tensor, values, spec, axis, seed, (size, rht_seed), backend, stats)
    return quantized.block_values(compute_dtype, backend), quantized.tensor_amax


def _operand_stats(
    tensor: torch.Tensor,
    quantized: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    seed: torch.Tensor,
    hadamard: tuple[int | None, Seed | FixedSigns],
    backend: str,
    stats: tuple[StatsSink, str],
) -> None:
    """One operand's error statistics into the sink, against its (transformed) source."""
    size, rht_seed = hadamard
    sink, operand = stats
    source = rht(tensor, axis, size, rht_seed) if size else tensor
    for metric, value in operand_stats(source, quantized, spec, axis, seed, backend).items():
        sink[(operand, metric)] = value


def gemm_operands(
    a: torch.Tensor,
    b: torch.Tensor | QuantizedTensor,
    dims: tuple[int, int],
    specs: tuple[QuantSpec | None, QuantSpec | None],
    hadamard: HadamardConfig | None,
    seeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    guide_b: torch.Tensor | None = None,
    stats: tuple[StatsSink, str, str] | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both operands of one GEMM, transformed (RHT) and fake-quantized along their reduction
    dims `dims`, in a's dtype (the GEMM's compute dtype), contiguous: the layout the fast
    executors hand cuBLAS, which picks its kernel, and so its float32 summation order, by the
    operands' strides. With `stats` = (sink, operand a's name, operand b's name), each quantized
    operand's error statistics go to sink."""
    rht_args, stats_a, stats_b = _gemm_args(hadamard, seeds, stats)
    a_q = _quantize_operand(a, specs[0], dims[0], seeds[0], rht_args, a.dtype, backend,
                            stats=stats_a)  # fmt: skip
    b_q = _quantize_operand(b, specs[1], dims[1], seeds[1], rht_args, a.dtype, backend, guide_b,
                            stats_b)  # fmt: skip
    return a_q.contiguous(), b_q.contiguous()


def block_operands(
    a: torch.Tensor,
    b: torch.Tensor | QuantizedTensor,
    dims: tuple[int, int],
    specs: tuple[QuantSpec | None, QuantSpec | None],
    hadamard: HadamardConfig | None,
    seeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    guide_b: torch.Tensor | None = None,
    stats: tuple[StatsSink, str, str] | None = None,
    backend: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """`gemm_operands` for a GEMM on the block-scaled route: both operands' block values
    (contiguous, in a's dtype) and their tensor amaxes."""
    assert specs[0] is not None and specs[1] is not None
    rht_args, stats_a, stats_b = _gemm_args(hadamard, seeds, stats)
    a_q, a_amax = _block_operand(a, specs[0], dims[0], seeds[0], rht_args, a.dtype, backend,
                                 stats=stats_a)  # fmt: skip
    b_q, b_amax = _block_operand(b, specs[1], dims[1], seeds[1], rht_args, a.dtype, backend,
                                 guide_b, stats_b)  # fmt: skip
    return a_q.contiguous(), b_q.contiguous(), (a_amax, b_amax)


def _gemm_args(
    hadamard: HadamardConfig | None,
    seeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    stats: tuple[StatsSink, str, str] | None,
) -> tuple[Any, tuple[StatsSink, str] | None, tuple[StatsSink, str] | None]:
    """A GEMM's (Hadamard (size, seed or None), operand a's stats sink, operand b's)."""
    rht_args: tuple[int, torch.Tensor | FixedSigns] | None = None
    if hadamard is not None:
        rht_args = (hadamard.size, hadamard.sign_source(seeds[2]))
    if stats is None:
        return rht_args, None, None
    return rht_args, (stats[0], stats[1]), (stats[0], stats[2])


def seed_offsets(gemm: str, operands: tuple[str, str], rank: int = 0) -> tuple[int, int, int]:
    """What one GEMM adds to a call's seed: (operand a's SR, operand b's SR, the Hadamard)."""

    def operand_offset(name: str) -> int:
        per_rank = 0 if name.endswith("_w") else rank * RANK_SEED_STRIDE
        return _OPERAND_SEED[name] + per_rank

    return operand_offset(operands[0]), operand_offset(operands[1]), _RHT_SEED[gemm]


def _seeds(call_seed: torch.Tensor, gemm: str, operands: tuple[str, str], rank: int = 0):
    """(SR seed of operand a, of operand b, Hadamard seed) of one GEMM in one call."""
    a, b, hadamard = seed_offsets(gemm, operands, rank)
    return call_seed + a, call_seed + b, call_seed + hadamard


class QuantLinearFunction(torch.autograd.Function):
    """y = x W^T + b for 2-D x (tokens, in_features) under a LinearConfig."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        config: LinearConfig,
        call_seed: torch.Tensor,
        weight_guide: torch.Tensor | None,
        stats: StatsSink | None = None,
        backend: str = "auto",
        rank: int = 0,
        channels: tuple[torch.Tensor, torch.Tensor] | None = None,
        given: WeightOperands | None = None,
    ) -> torch.Tensor:
        x_clamped, residual = x, None
        if config.outliers is not None:
            x_clamped, residual = clamp_outliers(x, config.outliers)
        seeds = _seeds(call_seed, "forward", ("forward_x", "forward_w"), rank)
        w_operand = weight if given is None else given.forward
        operands = (x_clamped, w_operand, (1, 1), (config.forward_x, config.forward_w),
                    config.forward_hadamard, seeds, weight_guide, _names(stats, "forward_x",
                    "forward_w"), backend)  # fmt: skip
        if channels is not None:  # OutControl: no clamping, the forward route on values
            x_q, w_q = _mixed_operands(operands, config, channels, call_seed, rank)
            y = F.linear(x_q, w_q, bias)
            x_source = backward_source(x, x_q, config.double_quant)
            w_source = backward_source(weight, w_q, config.double_quant)
        elif config.routes["forward"] == "block":  # no double quantization, no clamping
            x_b, w_b, amaxes = block_operands(*operands)
            bias_b = None if bias is None else bias.to(x_b.dtype)
            y = block_product(x_b, w_b.t(), amaxes, config, "forward", x_b.dtype, bias_b)
            x_source, w_source = x, weight
        else:
            x_q, w_q = gemm_operands(*operands)
            compensate = config.outliers is not None and config.outliers.compensate
            if residual is not None and compensate:  # the sparse residual back
                x_q = (x_q.float() + residual.float()).to(x_q.dtype)
            y = F.linear(x_q, w_q, bias)
            x_source = backward_source(x, x_q, config.double_quant)
            w_source = backward_source(weight, w_q, config.double_quant)
        w_saved: torch.Tensor | None = w_source
        ctx.given_w = None
        if given is not None and given.grad_input is not None:
            ctx.given_w, w_saved = given.grad_input, None  # not a tensor autograd keeps
        ctx.save_for_backward(x_source, w_saved, weight if config.dge is not None else None)
        ctx.config = config
        ctx.call_seed = call_seed
        ctx.has_bias = bias is not None
        ctx.stats = stats
        ctx.backend = backend
        ctx.rank = rank
        ctx.channels = channels
        ctx.trust_masks = (None, None)
        if config.trust is not None and any(ctx.needs_input_grad[:2]):
            ctx.trust_masks = _trust_masks(x_clamped, weight, config, seeds, weight_guide, backend)
        ctx.in_features = x.shape[1]
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        x_source, w_source, weight = ctx.saved_tensors
        if ctx.given_w is not None:
            w_source = ctx.given_w
        config: LinearConfig = ctx.config
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            seeds = _seeds(ctx.call_seed, "grad_input", ("grad_input_dy", "grad_input_w"), ctx.rank)
            stats = _names(ctx.stats, "grad_input_dy", "grad_input_w")
            operands = (grad_y, w_source, (1, 0), (config.grad_input_dy, config.grad_input_w),
                        config.grad_input_hadamard, seeds, None, stats, ctx.backend)  # fmt: skip
            grad_x = _backward_product("grad_input", operands, config)
            grad_x = _operand_gradient(grad_x, ctx, 0)
        if ctx.needs_input_grad[1]:
            seeds = _seeds(
                ctx.call_seed, "grad_weight", ("grad_weight_dy", "grad_weight_x"), ctx.rank
            )
            stats = _names(ctx.stats, "grad_weight_dy", "grad_weight_x")
            specs = (config.grad_weight_dy, config.grad_weight_x)
            operands = (grad_y, x_source, (0, 0), specs, config.grad_weight_hadamard, seeds,
                        None, stats, ctx.backend)  # fmt: skip
            if ctx.channels is not None:
                grad_w = _split_grad_weight(operands, config, ctx.channels, ctx.call_seed, ctx.rank)
            else:
                grad_w = _backward_product("grad_weight", operands, config)
            grad_w = _operand_gradient(grad_w, ctx, 1)
            if config.dge is not None:
                grad_w = grad_w * _dge_factor(weight, config, ctx.backend).to(grad_w.dtype)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = _bias_gradient(grad_y, config, ctx.call_seed, ctx.rank, ctx.backend)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None, None, None


def _mixed_operands(
    operands: tuple[Any, ...],
    config: LinearConfig,
    channels: tuple[torch.Tensor, torch.Tensor],
    call_seed: torch.Tensor,
    rank: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OutControl's forward operands from `gemm_operands`' arguments: X and W with their FP4
    channels quantized by forward.x / .w (in the channels' order, so the blocks run along it)
    and their FP8 channels by the format, each put back in its column."""
    x, weight, dims, specs, hadamard, seeds, guide, stats, backend = operands
    fp8, fp4 = channels
    x_q, w_q = torch.empty_like(x), torch.empty_like(weight, dtype=x.dtype)
    if fp4.numel():
        guide_4 = None if guide is None else guide[:, fp4]
        x_q[:, fp4], w_q[:, fp4] = gemm_operands(
            x[:, fp4], weight[:, fp4], dims, specs, hadamard, seeds, guide_4, stats, backend
        )
    assert config.out_control is not None
    fmt, fp8_backend = config.out_control.format, _fp8_backend(backend)
    for target, source, name in ((x_q, x, "forward_x"), (w_q, weight, "forward_w")):
        seed = call_seed + _fp8_seed(name, rank)
        target[:, fp8] = _quantize_operand(source[:, fp8], fmt, 1, seed, None, x.dtype,
                                           fp8_backend)  # fmt: skip
    return x_q, w_q


def _split_grad_weight(
    operands: tuple[Any, ...],
    config: LinearConfig,
    channels: tuple[torch.Tensor, torch.Tensor],
    call_seed: torch.Tensor,
    rank: int,
) -> torch.Tensor:
    """OutControl's dW from `gemm_operands`' arguments: the FP4 channels' columns as without
    OutControl, the FP8 channels' from dY and X quantized by the format along the tokens."""
    grad_y, x_source, dims, specs, hadamard, seeds, guide, stats, backend = operands
    fp8, fp4 = channels
    grad_w = grad_y.new_empty(grad_y.shape[1], x_source.shape[1])
    if fp4.numel():
        fp4_operands = (grad_y, x_source[:, fp4], dims, specs, hadamard, seeds, guide, stats,
                        backend)  # fmt: skip
        grad_w[:, fp4] = _backward_product("grad_weight", fp4_operands, config)
    assert config.out_control is not None
    fmt, fp8_backend = config.out_control.format, _fp8_backend(backend)
    dy_seed, x_seed = (call_seed + _fp8_seed(n, rank) for n in ("grad_weight_dy", "grad_weight_x"))
    dy = _quantize_operand(grad_y, fmt, 0, dy_seed, None, grad_y.dtype, fp8_backend)
    x = _quantize_operand(x_source[:, fp8], fmt, 0, x_seed, None, grad_y.dtype, fp8_backend)
    grad_w[:, fp8] = dy.t().mm(x)
    return grad_w


def _fp8_seed(name: str, rank: int) -> int:
    return _FP8_SEED[name] + (0 if name.endswith("_w") else rank * RANK_SEED_STRIDE)


def _fp8_backend(backend: str) -> str:
    """The FP8 format's quantizer backend: the kernels take E2M1 and E1M2 elements only."""
    return "torch" if backend == "torch" else "auto"


def _trust_masks(
    x: torch.Tensor,
    weight: torch.Tensor,
    config: LinearConfig,
    seeds: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    weight_guide: torch.Tensor | None,
    backend: str,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The trust estimator's masks of the forward X and W (None where an operand is not
    quantized), in the forward Hadamard transform's basis."""
    assert config.trust is not None
    transform = config.forward_hadamard
    rht_args = None if transform is None else (transform.size, transform.sign_source(seeds[2]))
    masks = []
    for tensor, spec, seed, guide in (
        (x, config.forward_x, seeds[0], None),
        (weight, config.forward_w, seeds[1], weight_guide),
    ):
        mask = None
        if spec is not None:
            mask = operand_mask(tensor.detach(), spec, 1, seed, rht_args, config.trust, guide,
                                backend)  # fmt: skip
        masks.append(mask)
    return masks[0], masks[1]


def _operand_gradient(grad: torch.Tensor, ctx: Any, operand: int) -> torch.Tensor:
    """The gradient of forward operand `operand` (0: X, 1: W; tokens or out_features by
    in_features) from its backward GEMM's: masked by the trust estimator and, after a forward
    Hadamard transform, taken back to the operand's own basis. Under double quantization the
    GEMM read the transformed operands, so it gave the gradient in the transform's basis;
    without, the gradient is taken into that basis for the mask only."""
    config: LinearConfig = ctx.config
    mask = ctx.trust_masks[operand]
    transform = config.forward_hadamard
    if transform is None:
        return grad if mask is None else torch.where(mask, grad, torch.zeros_like(grad))
    if mask is None and not config.double_quant:
        return grad
    rht_seed = _seeds(ctx.call_seed, "forward", ("forward_x", "forward_w"), ctx.rank)[2]
    signs = transform.sign_source(rht_seed)
    rotated = grad if config.double_quant else rht(grad, 1, transform.size, signs)
    if mask is not None:
        rotated = torch.where(mask, rotated, torch.zeros_like(rotated))
    return inverse_rht(rotated, 1, transform.size, signs, ctx.in_features).to(grad.dtype)


def _bias_gradient(
    grad_y: torch.Tensor, config: LinearConfig, call_seed: torch.Tensor, rank: int, backend: str
) -> torch.Tensor:
    """The bias's gradient: dY summed over the tokens, or with `bias_gradient: quantized` the
    grad_input GEMM's dY operand (the same quantization, seed included) summed in float32."""
    if config.bias_gradient == "dy":
        return grad_y.sum(0)
    seed = _seeds(call_seed, "grad_input", ("grad_input_dy", "grad_input_w"), rank)[0]
    dy = _quantize_operand(grad_y, config.grad_input_dy, 1, seed, None, grad_y.dtype, backend)
    return dy.sum(0, dtype=torch.float32).to(grad_y.dtype)


def _backward_product(gemm: str, operands: tuple[Any, ...], config: LinearConfig) -> torch.Tensor:
    """grad_input (dY W) or grad_weight (dY^T X; (out, in) contiguous: autograd keeps it, no
    copy) from `gemm_operands`' arguments, on the GEMM's route."""
    if config.routes[gemm] == "block":
        dy, other, amaxes = block_operands(*operands)
        dy = dy if gemm == "grad_input" else dy.t()
        return block_product(dy, other, amaxes, config, gemm, dy.dtype)
    dy, other = gemm_operands(*operands)
    return (dy if gemm == "grad_input" else dy.t()).mm(other)


def _names(sink: StatsSink | None, a: str, b: str) -> tuple[StatsSink, str, str] | None:
    return (sink, a, b) if sink is not None else None


def _dge_factor(weight: torch.Tensor, config: LinearConfig, backend: str) -> torch.Tensor:
    """DGE's derivative on the forward weight quantizer's scaled weight."""
    assert config.dge is not None and config.forward_w is not None
    spec = config.forward_w
    quantized = quantize(weight.detach(), spec, axis=-1, seed=0, backend=backend)
    units = quantized.grid_units(weight.detach())
    return dge_derivative(units, spec.element_format, config.dge)
