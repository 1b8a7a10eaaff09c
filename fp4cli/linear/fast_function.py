"""The fast executor's passes as a layer calls them: replayed from the layer programs
(`fp4cli.linear.plans`), and the autograd Function that runs them eagerly. The executor itself,
the definition of each step, is `fast.py`; under torch.compile the same passes run as custom ops
(`ops.py`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from fp4cli.linear.config import LinearConfig
from fp4cli.linear.fast import fast_backward, fast_forward, given_dtypes
from fp4cli.linear.fast_operands import Saved
from fp4cli.linear.gathered import WeightOperands, operand_tensors, operands_key, with_tensors
from fp4cli.linear.plans import run_planned
from fp4cli.linear.recompute import OutputUse
from fp4cli.linear.seeds import CallCounter, start_call_launched
from fp4cli.techniques.qema import AverageGuide


class PlannedForward(NamedTuple):
    """What `planned_forward` returns: `fast_forward`'s four results and the call's seed."""

    y: torch.Tensor
    x_saved: tuple[torch.Tensor, ...]
    w_saved: tuple[torch.Tensor, ...]
    layouts: tuple[Saved, Saved]
    call_seed: torch.Tensor


def planned_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    config: LinearConfig,
    key: str,
    call_seed: torch.Tensor | CallCounter,
    weight_guide: torch.Tensor | AverageGuide | None,
    rank: int,
    needs_dx: bool,
    needs_dw: bool,
    dtype: torch.dtype | None = None,
    given: WeightOperands | None = None,
) -> PlannedForward:
    """`fast_forward` without recomputation, replayed from the layer programs
    (`fp4cli.linear.plans`); `key` is the config's `ops.op_key`. call_seed: the call's, or the
    layer's CallCounter, from which the program draws it. W's operands `given` are inputs of
    the program like x."""
    average = updates = guide = None
    warmup = -1
    if isinstance(weight_guide, AverageGuide):
        average, updates, warmup = weight_guide.average, weight_guide.updates, weight_guide.warmup
    else:
        guide = weight_guide
    given_inputs = operand_tensors(given) if given is not None else ()
    seed, calls, counts = call_seed, None, None
    if isinstance(call_seed, CallCounter):
        seed, calls, counts = call_seed.rng_seed, call_seed.calls, call_seed.counts
    assert isinstance(seed, torch.Tensor)

    def call(x, weight, bias, seed, calls, average, updates, guide, *given_inputs):
        if calls is not None:  # the launch drawing the seed rounds a float32 bias under bf16
            seed, bias = start_call_launched(seed, calls, bool(counts), bias, dtype)
        if average is not None:
            guide = AverageGuide(average, updates, warmup)
        operands = with_tensors(given, given_inputs) if given is not None else None
        y, x_saved, w_saved, layouts = fast_forward(
            x, weight, bias, config, seed, guide, rank, needs_dx, needs_dw, dtype,
            given=operands,
        )  # fmt: skip
        return y, x_saved, w_saved, layouts, seed  # a replay returns plain tuples

    given_key = operands_key(given) if given is not None else None
    signature = ("fast_forward", key, rank, needs_dx, needs_dw, dtype, warmup, given_key, counts)
    inputs = (x, weight, bias, seed, calls, average, updates, guide, *given_inputs)
    # from a resident graph under graphs("resident"): x (inputs[0]) is copied into its buffer,
    # the parameters and the layer's buffers are read where they are
    return PlannedForward(*run_planned(signature, call, inputs, resident=(0,)))


def planned_backward(
    grad_y: torch.Tensor,
    x_tensors: tuple[torch.Tensor, ...],
    w_tensors: tuple[torch.Tensor, ...],
    config: LinearConfig,
    key: str,
    call_seed: torch.Tensor,
    rank: int,
    layouts: tuple[Saved, Saved],
    needs: tuple[bool, bool, bool],
    targets: tuple[torch.dtype | None, ...],
    forward: tuple[torch.Size, torch.Size, torch.dtype],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """`fast_backward`, replayed from the layer programs; `forward`: the forward pass's x and
    W shapes and compute dtype (which, with the config and the rank, decide `layouts`)."""
    split = len(x_tensors)

    def call(grad_y, call_seed, *saved):
        return fast_backward(
            grad_y, saved[:split], saved[split:], config, call_seed, rank, layouts, needs,
            targets,
        )  # fmt: skip

    signature = ("fast_backward", key, rank, needs, targets, split, *forward)
    return run_planned(signature, call, (grad_y, call_seed, *x_tensors, *w_tensors))


class FastQuantLinearFunction(torch.autograd.Function):
    """y = x W^T + b for 2-D x (tokens, in_features) under a LinearConfig that `fast_gap`
    accepts: the same operands and GEMMs as QuantLinearFunction, fewer passes and bytes.
    (Under torch.compile the layer calls the same steps as custom ops: `ops.py`.) Both passes
    replay the layer programs (`planned_forward`, `planned_backward`) unless the output is
    tagged for recomputation."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        config: LinearConfig,
        key: str,
        counter: CallCounter,
        weight_guide: torch.Tensor | AverageGuide | None,
        rank: int = 0,
        dtype: torch.dtype | None = None,
        recompute: OutputUse | None = None,
        given: WeightOperands | None = None,
    ) -> torch.Tensor:
        """counter: the layer's, from which the call draws its seed (in the replayed program)."""
        needs_dx, needs_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if recompute is None:
            y, x_saved, w_saved, ctx.layouts, call_seed = planned_forward(
                x, weight, bias, config, key, counter, weight_guide, rank, needs_dx, needs_dw,
                dtype, given,
            )  # fmt: skip
        else:
            call_seed = counter.draw()
            y, x_saved, w_saved, ctx.layouts = fast_forward(
                x, weight, bias, config, call_seed, weight_guide, rank, needs_dx, needs_dw,
                dtype, recompute, given,
            )  # fmt: skip
        # the seed is saved, not kept on ctx: saved tensors are let go after the backward pass
        ctx.save_for_backward(*x_saved, *w_saved, call_seed)
        ctx.split = len(x_saved)
        ctx.config, ctx.key, ctx.rank = config, key, rank
        ctx.has_bias = bias is not None
        ctx.targets = given_dtypes(x, weight, bias)
        ctx.forward = (x.shape, weight.shape, dtype or x.dtype)
        return y

    @staticmethod
    def backward(ctx: Any, grad_y: torch.Tensor):
        *saved, call_seed = ctx.saved_tensors
        needs_db = ctx.has_bias and ctx.needs_input_grad[2]
        grads = planned_backward(
            grad_y,
            tuple(saved[: ctx.split]),
            tuple(saved[ctx.split :]),
            ctx.config,
            ctx.key,
            call_seed,
            ctx.rank,
            ctx.layouts,
            (ctx.needs_input_grad[0], ctx.needs_input_grad[1], needs_db),
            ctx.targets,
            ctx.forward,
        )
        return *grads, None, None, None, None, None, None, None, None
