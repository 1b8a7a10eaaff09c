"""The fast executor as two torch custom ops, so that torch.compile traces a model through its
quantized layers without a graph break.

`fp4cli::fast_linear` runs `fast.fast_forward` and returns [y, X's saved operand tensors, W's];
`fp4cli::fast_linear_backward` runs `fast.fast_backward` on them. The ops are opaque to the
compiler (it neither traces nor fuses the kernels inside), their autograd formula is the
backward op, and their fake implementations are the same Python with `kernels.launch`'s
launches skipped (`shapes_only`), so every output's shape comes from the code that allocates
it. The eager layer keeps calling `FastQuantLinearFunction` (fewer host steps a call); both run
the same steps on the same operands, so compiled and eager give the same bits.

A LinearConfig reaches the ops as its `repr` (ops take strings, not Python objects): `op_key`
registers it.
"""

from __future__ import annotations

from typing import Any

import torch

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import fast_backward, fast_forward, saved_count, saved_layouts

_CONFIGS: dict[str, LinearConfig] = {}


def op_key(config: LinearConfig) -> str:
    """The string the ops know `config` by (registered here on first use)."""
    key = repr(config)
    _CONFIGS.setdefault(key, config)
    return key


def _config(key: str) -> LinearConfig:
    config = _CONFIGS.get(key)
    if config is None:
        raise RuntimeError(f"fp4cli::fast_linear: no layer registered config {key!r}")
    return config


def _fresh(outputs: list[torch.Tensor], inputs: tuple[Any, ...]) -> list[torch.Tensor]:
    """A custom op's outputs may not alias its inputs: a saved operand that is an input itself
    (an unquantized, untransformed operand in its own dtype) is returned as a copy."""
    return [t.clone() if any(t is i for i in inputs) else t for t in outputs]


def _forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    config: str,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
) -> list[torch.Tensor]:
    y, x_saved, w_saved = fast_forward(
        x, weight, bias, _config(config), call_seed, weight_guide, rank, needs_dx, needs_dw
    )
    return _fresh([y, *x_saved, *w_saved], (x, weight, bias, weight_guide))


@torch.library.custom_op("fp4cli::fast_linear", mutates_args=())
def fast_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    config: str,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
) -> list[torch.Tensor]:
    """[y = x W^T + b, X's saved operand tensors, W's] (`fast.fast_forward`)."""
    return _forward(x, weight, bias, call_seed, weight_guide, config, rank, needs_dx, needs_dw)


@fast_linear.register_fake
def _fast_linear_fake(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    config: str,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
) -> list[torch.Tensor]:
    from fp4cli.kernels.launch import shapes_only

    with shapes_only():
        return _forward(x, weight, bias, call_seed, weight_guide, config, rank, needs_dx, needs_dw)


def _backward(
    grad_y: torch.Tensor,
    saved: list[torch.Tensor],
    call_seed: torch.Tensor,
    config: str,
    rank: int,
    shapes: list[int],
    dtype: torch.dtype,
    needs: list[bool],
) -> list[torch.Tensor]:
    linear = _config(config)
    x_shape, w_shape = tuple(shapes[:2]), tuple(shapes[2:])
    layouts = saved_layouts(linear, call_seed, rank, x_shape, w_shape, dtype)[2:]
    split = saved_count(layouts[0], needs[1])
    grads = fast_backward(
        grad_y,
        tuple(saved[:split]),
        tuple(saved[split:]),
        linear,
        call_seed,
        rank,
        layouts,
        (needs[0], needs[1], needs[2]),
    )
    return [g for g in grads if g is not None]


@torch.library.custom_op("fp4cli::fast_linear_backward", mutates_args=())
def fast_linear_backward(
    grad_y: torch.Tensor,
    saved: list[torch.Tensor],
    call_seed: torch.Tensor,
    config: str,
    rank: int,
    shapes: list[int],
    dtype: torch.dtype,
    needs: list[bool],
) -> list[torch.Tensor]:
    """[grad_x, grad_w, grad_b], each only where `needs` (dx, dw, db) asks for it.
    shapes: X's (rows, cols) then W's; dtype: the forward's compute dtype."""
    return _backward(grad_y, saved, call_seed, config, rank, shapes, dtype, needs)


@fast_linear_backward.register_fake
def _fast_linear_backward_fake(
    grad_y: torch.Tensor,
    saved: list[torch.Tensor],
    call_seed: torch.Tensor,
    config: str,
    rank: int,
    shapes: list[int],
    dtype: torch.dtype,
    needs: list[bool],
) -> list[torch.Tensor]:
    from fp4cli.kernels.launch import shapes_only

    with shapes_only():
        return _backward(grad_y, saved, call_seed, config, rank, shapes, dtype, needs)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: list[torch.Tensor]) -> None:
    x, weight, bias, call_seed, _, config, rank, needs_dx, needs_dw = inputs
    ctx.save_for_backward(call_seed, *output[1:])
    ctx.config, ctx.rank, ctx.needs = config, rank, (needs_dx, needs_dw)
    ctx.shapes = [*x.shape, *weight.shape]
    ctx.dtype, ctx.has_bias = x.dtype, bias is not None


def _autograd_backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
    grad_y = grads[0][0] if isinstance(grads[0], (list, tuple)) else grads[0]
    call_seed, *saved = ctx.saved_tensors
    needs_dx, needs_dw = ctx.needs
    needs = [needs_dx, needs_dw, bool(ctx.has_bias and ctx.needs_input_grad[2])]
    computed = iter(
        fast_linear_backward(
            grad_y.contiguous(), saved, call_seed, ctx.config, ctx.rank, ctx.shapes, ctx.dtype,
            needs,
        )
    )  # fmt: skip
    grad_x, grad_w, grad_b = (next(computed) if need else None for need in needs)
    return grad_x, grad_w, grad_b, None, None, None, None, None, None


fast_linear.register_autograd(_autograd_backward, setup_context=_setup_context)


def fast_linear_y(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    key: str,
    call_seed: torch.Tensor,
    weight_guide: torch.Tensor | None,
    rank: int,
) -> torch.Tensor:
    """The fast executor's y through the custom ops (what a compiled model traces); `key`:
    the layer's `op_key`."""
    grad = torch.is_grad_enabled()
    needs_dx, needs_dw = grad and x.requires_grad, grad and weight.requires_grad
    return fast_linear(x, weight, bias, call_seed, weight_guide, key, rank, needs_dx, needs_dw)[0]
