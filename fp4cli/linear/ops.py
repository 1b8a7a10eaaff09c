"""The quantized Linear's kernel executors as two torch custom ops, so that torch.compile
traces a model through its quantized layers without a graph break.

`fp4cli::quant_linear` runs the forward of the fast executor (`fast.fast_forward`) or of the
vector-wise one (`fast_vector.vector_forward`) and returns [y, the tensors kept for the
backward pass]; `fp4cli::quant_linear_backward` runs the matching backward on them. The ops
are opaque to the compiler (it neither traces nor fuses the kernels inside), and their fake
implementations are the same Python with `kernels.host.launch`'s launches skipped
(`shapes_only`), so every output's shape comes from the code that allocates it. Their autograd
formula is `CompiledLinear`, an autograd Function the compiler traces: the forward op, then
the backward op on what it kept. Eager layers keep calling the executors' own autograd
Functions (fewer host steps a call); both run the same steps on the same operands, so compiled
and eager layers give the same bits.

The ops are defined through `torch.library.Library` with one kernel each for every device
(`CompositeExplicitAutograd`), wrapped so that the compiler does not trace into it. A compiled
step calls them from its generated code, so their dispatch is host time of every call: the
dispatcher calls the kernel directly, with no Python kernel of its own at the autograd key.

A LinearConfig reaches the ops as its `repr` (ops take strings, not Python objects): `op_key`
registers it; a layer registers its own when it is built.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from fp4cli.linear import fast_function, fast_vector
from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import saved_layouts
from fp4cli.linear.fast_operands import Saved
from fp4cli.linear.fast_vector import vector_plans

_CONFIGS: dict[str, LinearConfig] = {}
EXECUTORS = ("fast", "vector")


def op_key(config: LinearConfig) -> str:
    """The string the ops know `config` by (registered here on first use)."""
    key = repr(config)
    _CONFIGS.setdefault(key, config)
    return key


def _config(key: str) -> LinearConfig:
    config = _CONFIGS.get(key)
    if config is None:
        raise RuntimeError(f"fp4cli::quant_linear: no layer registered config {key!r}")
    return config


def _fresh(outputs: list[torch.Tensor], inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """A custom op's outputs may not alias its inputs: a kept tensor that is an input itself
    (an unquantized operand in its own dtype, DGE's weight) is returned as a copy."""
    return [t.clone() if any(t is i for i in inputs) else t for t in outputs]


def _forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    executor: str,
    config: str,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """[y = x W^T + b, then the tensors the executor keeps for the backward pass]. dtype: the
    compute dtype (autocast's) to which the executor casts x, W and the bias as it reads them;
    None: x's."""
    linear = _config(config)
    if executor == "fast":
        planned = fast_function.planned_forward(
            x, weight, bias, linear, config, call_seed, weight_guide, rank, needs_dx, needs_dw,
            dtype,
        )  # fmt: skip
        y, x_kept, w_kept = planned.y, planned.x_saved, planned.w_saved
        groups: tuple[tuple[torch.Tensor, ...], ...] = (w_kept, x_kept)
    elif executor == "vector":
        y, x_kept, w_kept, dge = fast_vector.planned_forward(
            x, weight, bias, linear, config, needs_dx, needs_dw, dtype
        )
        groups = (dge, w_kept, x_kept)
    else:
        raise RuntimeError(f"fp4cli::quant_linear: no executor {executor!r}")
    # X's group last: the others' sizes follow from the flags alone (`_backward`)
    kept = [tensor for group in groups for tensor in group]
    return _fresh([y, *kept], (x, weight, bias, weight_guide))


_LIBRARY = torch.library.Library("fp4cli", "DEF")


def _define(name: str, kernel: Any) -> Any:
    """The op fp4cli::name of `kernel`'s signature, running it on every device; its overload."""
    schema = torch.library.infer_schema(kernel, mutates_args=())
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, torch._dynamo.disable(kernel), "CompositeExplicitAutograd")
    return getattr(torch.ops.fp4cli, name).default


quant_linear = _define("quant_linear", _forward)


@torch.library.register_fake("fp4cli::quant_linear")
def _quant_linear_fake(*args: Any) -> list[torch.Tensor]:
    from fp4cli.kernels.host.launch import shapes_only

    with shapes_only():
        return _forward(*args)


def _split(saved: list[torch.Tensor], counts: tuple[int, ...]) -> list[tuple[torch.Tensor, ...]]:
    """`saved` cut into groups of these sizes, then the rest."""
    groups, start = [], 0
    for count in counts:
        groups.append(tuple(saved[start : start + count]))
        start += count
    return [*groups, tuple(saved[start:])]


def _backward(
    grad_y: torch.Tensor,
    saved: list[torch.Tensor],
    call_seed: torch.Tensor,
    executor: str,
    config: str,
    rank: int,
    shapes: list[int],
    dtype: torch.dtype,
    needs: list[bool],
    x_dtype: torch.dtype,
    w_dtype: torch.dtype,
    bias_dtype: torch.dtype,
) -> list[torch.Tensor]:
    """[grad_x, grad_w, grad_b], each only where `needs` (dx, dw, db) asks for it. saved: what
    `quant_linear` kept; shapes: X's (rows, cols) then W's; dtype: the forward's compute dtype;
    x_dtype, w_dtype, bias_dtype: the dtypes of x, W and the bias as the op was given them,
    each gradient's."""
    linear = _config(config)
    wanted = (needs[0], needs[1], needs[2])
    given = (x_dtype, w_dtype, bias_dtype)
    if executor == "fast":
        x_shape, w_shape = torch.Size(shapes[:2]), torch.Size(shapes[2:])
        if all(type(size) is int for size in shapes):
            layouts = _fast_layouts(config, rank, x_shape, w_shape, dtype)
        else:  # symbolic sizes (a fake implementation under dynamic shapes)
            layouts = saved_layouts(linear, call_seed, rank, x_shape, w_shape, dtype)[2:]
        w_kept, x_kept = _split(saved, (layouts[1].count if needs[0] else 0,))
        grads = fast_function.planned_backward(
            grad_y, x_kept, w_kept, linear, config, call_seed, rank, layouts, wanted, given,
            (x_shape, w_shape, dtype),
        )  # fmt: skip
    else:
        w_plan = vector_plans(linear, needs[0], needs[1])[1]
        dge_count = 2 if w_plan.forward_scales else 0
        w_count = w_plan.kept_count
        dge, w_kept, x_kept = _split(saved, (dge_count, w_count))
        grads = fast_vector.planned_backward(
            grad_y, (x_kept, w_kept, dge), linear, config, dtype, wanted, given
        )
    return [g for g in grads if g is not None]


@functools.lru_cache(maxsize=256)
def _fast_layouts(
    key: str, rank: int, x_shape: torch.Size, w_shape: torch.Size, dtype: torch.dtype
) -> tuple[Saved, Saved]:
    """`fast.saved_layouts` of a config (by its key) and the forward's shapes and dtype: the
    same on every call of the layer."""
    seed = torch.zeros((), dtype=torch.int64)  # the layouts hold no seed
    return saved_layouts(_config(key), seed, rank, x_shape, w_shape, dtype)[2:]


quant_linear_backward = _define("quant_linear_backward", _backward)


@torch.library.register_fake("fp4cli::quant_linear_backward")
def _quant_linear_backward_fake(*args: Any) -> list[torch.Tensor]:
    from fp4cli.kernels.host.launch import shapes_only

    with shapes_only():
        return _backward(*args)


class CompiledLinear(torch.autograd.Function):
    """y through `quant_linear`, its gradients through `quant_linear_backward` on what the
    forward op kept (arguments: `quant_linear`'s)."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        call_seed: torch.Tensor,
        weight_guide: torch.Tensor | None,
        executor: str,
        config: str,
        rank: int,
        needs_dx: bool,
        needs_dw: bool,
        dtype: torch.dtype | None,
    ) -> torch.Tensor:
        output = quant_linear(
            x, weight, bias, call_seed, weight_guide, executor, config, rank, needs_dx, needs_dw,
            dtype,
        )  # fmt: skip
        ctx.save_for_backward(call_seed, *output[1:])
        ctx.executor, ctx.config, ctx.rank = executor, config, rank
        ctx.needs = (needs_dx, needs_dw)
        ctx.shapes = [*x.shape, *weight.shape]
        ctx.dtype, ctx.has_bias = dtype or x.dtype, bias is not None
        # each gradient in its tensor's dtype (a bias-free layer's third is never computed)
        ctx.targets = (x.dtype, weight.dtype, bias.dtype if bias is not None else x.dtype)
        return output[0]

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        call_seed, *saved = ctx.saved_tensors
        needs = [*ctx.needs, bool(ctx.has_bias and ctx.needs_input_grad[2])]
        computed = iter(
            quant_linear_backward(
                grad_y.contiguous(), saved, call_seed, ctx.executor, ctx.config, ctx.rank,
                ctx.shapes, ctx.dtype, needs, *ctx.targets,
            )
        )  # fmt: skip
        grad_x, grad_w, grad_b = (next(computed) if need else None for need in needs)
        return grad_x, grad_w, grad_b, *([None] * 8)


def compiled_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    executor: str,
    key: str,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    rank: int,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """y through the custom ops (what a compiled model traces): `executor` "fast" or "vector",
    `key` the layer's `op_key`, `dtype` the compute dtype (autocast's; None: x's). What is not
    in it (W and the bias, float32 parameters) the executor casts as it reads, and each
    gradient leaves in its tensor's dtype, as in an eager call."""
    grad = torch.is_grad_enabled()
    needs_dx, needs_dw = grad and x.requires_grad, grad and weight.requires_grad
    y: torch.Tensor = CompiledLinear.apply(
        x, weight, bias, call_seed, weight_guide, executor, key, rank, needs_dx, needs_dw, dtype
    )
    return y
