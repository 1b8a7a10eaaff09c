"""Quantized layers' outputs recomputed in the backward pass instead of kept (`fp4 train
--recompute`).

A layer's output is kept for the backward pass by what reads it next: GELU keeps its input (fc1's
output, 4 x wide), attention keeps q, k and v (views of qkv's output). Inside
`recomputed_outputs()`, a quantized layer on the fast executor keeps its forward GEMM's operands
instead (X packed, 4.25 bits a value; W's operand, weight-sized; on the vector-wise executor the
operands as its GEMM reads them) and tags its output with how to multiply them again. Every
tensor autograd saves passes `_pack`: (a view of) a tagged output, unchanged since it was made,
is kept as that recipe and the view's geometry, and `_unpack` multiplies the operands again when
the backward pass reads it. The second product is the first's call on the same operands, so it
has the same bits; the forward's output itself is freed as soon as nothing else holds it.

Recomputing trades one GEMM of the layer's forward shape per recomputed output for the memory. A
layer whose output nothing saved in a pass (a residual branch's) stops keeping its operands
(`LayerRecompute`). Eager and CUDA-graph steps alike; not under torch.compile (`fp4 train`
refuses the pair).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

_TAG = "_fp4_recompute"
NOT_COMPILED = "compiled layers keep their outputs"  # why torch.compile and recomputing part
_active = [0]  # depth of recomputed_outputs() contexts


class OutputUse:
    """Whether autograd saved (a view of) one tagged output (`_pack` sets `saved`)."""

    def __init__(self) -> None:
        self.saved = False


class LayerRecompute:
    """A layer's side of recomputing: each call inside `recomputed_outputs()` gets a fresh
    OutputUse to tag its output with, until a call's output was saved by nothing (a residual
    branch's: the projection's, fc2's); from then on the layer keeps nothing extra."""

    def __init__(self) -> None:
        self.last: OutputUse | None = None
        self.stopped = False

    def next_use(self) -> OutputUse | None:
        """This call's OutputUse, or None where the layer keeps its output as usual."""
        if self.stopped or not recomputing():
            return None
        if self.last is not None and not self.last.saved:
            self.stopped = True
            return None
        self.last = OutputUse()
        return self.last


class Recompute:
    """How to compute a layer's output again, `function(*operands)` (the same tensor,
    contiguous), once per backward pass: several views of one output (q, k, v) share it."""

    def __init__(
        self,
        use: OutputUse,
        function: Callable[..., torch.Tensor],
        operands: tuple[Any, ...],
        version: int,
    ) -> None:
        self.use, self.function, self.operands = use, function, operands
        self.version = version  # the output's, as made: changed in place, it is not the product
        self.value: torch.Tensor | None = None

    def __call__(self) -> torch.Tensor:
        if self.value is None:
            self.value = self.function(*self.operands)
        return self.value

    def kept(self) -> list[torch.Tensor]:
        """The tensors it keeps until the backward pass (the operands, nested in tuples)."""
        found, pending = [], list(self.operands)
        while pending:
            item = pending.pop()
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif isinstance(item, tuple):
                pending.extend(item)
        return found


@contextmanager
def tagging() -> Iterator[None]:
    """Within it, layers on the kernel executors keep their operands and tag their outputs."""
    _active[0] += 1
    try:
        yield
    finally:
        _active[0] -= 1


@contextmanager
def recomputed_outputs(enabled: bool = True) -> Iterator[None]:
    """Within it, tagged layer outputs that autograd saves are recomputed in the backward pass
    (which may run after the context ends)."""
    if not enabled:
        yield
        return
    with torch.autograd.graph.saved_tensors_hooks(_pack, _unpack), tagging():
        yield


def recomputing() -> bool:
    """Whether a layer's forward now should keep its operands and tag its output."""
    return _active[0] > 0 and torch.is_grad_enabled()


def tag(
    output: torch.Tensor, use: OutputUse, function: Callable[..., torch.Tensor], *operands: Any
) -> None:
    """Mark a contiguous layer output as recomputable by `function(*operands)`; `use` records
    whether anything saves it."""
    if output.is_contiguous():
        setattr(output, _TAG, Recompute(use, function, operands, output._version))


def recompute_summary(model: torch.nn.Module) -> str:
    """One line for a run that recomputes: how many quantized layers can (those on the fast
    executor), and that the others keep their outputs."""
    from fp4cli.linear import quantized_layers

    layers = [m for m in quantized_layers(model).values() if not m.config.is_high_precision]
    able = sum(layer.executor()[0] in ("fast", "vector") for layer in layers)
    if not able:
        return "recompute: no quantized layer runs on a kernel executor; nothing is recomputed"
    rest = len(layers) - able
    others = f"; the other {rest} (on the reference executor) keep their outputs" if rest else ""
    return (
        f"recompute: the {able} quantized layers on the kernel executors keep their forward "
        f"operands where autograd would save their output, and recompute it in the backward "
        f"pass{others}"
    )


def kept_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """What saving `tensor` keeps inside `recomputed_outputs()`: the tensor, or the operands
    that recompute it."""
    packed = _pack(tensor)
    return [packed] if isinstance(packed, torch.Tensor) else packed[0].kept()


def _pack(tensor: torch.Tensor) -> Any:
    """A saved tensor as kept: a recipe for a view of a tagged output not changed in place since
    it was made, else the tensor detached (an output its own node saves would otherwise hold
    that node in a cycle autograd frees only by running the backward: a forward that fails, out
    of memory, would keep its whole graph)."""
    base = tensor if tensor._base is None else tensor._base
    recompute = getattr(base, _TAG, None)
    if recompute is None or base._version != recompute.version:
        return tensor.detach()
    recompute.use.saved = True
    offset = tensor.storage_offset() - base.storage_offset()
    return recompute, tuple(base.shape), tensor.size(), tensor.stride(), offset


def _unpack(packed: Any) -> torch.Tensor:
    if isinstance(packed, torch.Tensor):
        return packed
    recompute, base_shape, size, stride, offset = packed
    output = recompute()
    if tuple(output.shape) != base_shape or not output.is_contiguous():
        raise RuntimeError(f"recomputed output {tuple(output.shape)} is not {base_shape}")
    return output.as_strided(size, stride, output.storage_offset() + offset)
