"""One training step (forward under BF16 autocast, backward, gradient clipping, optimizer step),
run eagerly or replayed from a CUDA graph.

A quantized model launches many small kernels per step (each operand's quantization, the seeds,
the GEMMs); on a GPU the host often cannot issue them as fast as the GPU runs them. With
`cuda_graph`, the first WARMUP_STEPS steps run eagerly on a side stream, the next one is
captured whole (the optimizer's update and Q-EMA included) and every later step copies its batch
into the captured input buffers and replays the graph: one launch a step. The graph computes
what the eager step computes: the quantized layers draw their seeds on the device from their
call counters, and the optimizer is capturable (step counts and learning rate on the device).
A step the caller asks to run eagerly (statistics, the first step's layer shapes) runs outside
the graph on the same parameters, gradients and optimizer state.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

WARMUP_STEPS = 3

LossFn = Callable[[Any, Any], torch.Tensor]  # (model, batch) -> loss


@functools.cache
def _warmup_stream(device_index: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device=device_index)


def warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of every warm-up step on `device`, one for the process: cuBLAS gives each
    stream it runs on a workspace it keeps for the process's life, so a new stream per step
    held about 0.19 GiB more after every captured run (a sweep or benchmark runs many)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _warmup_stream(index)


def plain_step(
    model: Any,  # an nn.Module, or what torch.compile made of one
    optimizer: torch.optim.Optimizer,
    loss_of: LossFn,
    batch: Any,
    grad_clip: float | None,
    autocast: bool,
    cache_casts: bool = True,
    recompute: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, gradient norm before clipping) of one step; gradients must be None or zero.
    recompute: the quantized layers' outputs that autograd saves are recomputed in the backward
    pass (`fp4cli.linear.recompute`)."""
    from fp4cli.linear.recompute import recomputed_outputs

    device_type = "cuda" if autocast else "cpu"
    casts = torch.autocast(
        device_type, dtype=torch.bfloat16, enabled=autocast, cache_enabled=cache_casts
    )
    with casts, recomputed_outputs(recompute):
        loss = loss_of(model, batch)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip or 1e9)
    optimizer.step()
    return loss.detach(), grad_norm


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Every group's learning rate: in place where it is a (captured) device tensor."""
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


def device_learning_rates(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Make every group's learning rate a float32 device tensor, as a captured step needs."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        value = float(lr.item()) if isinstance(lr, torch.Tensor) else float(lr)
        group["lr"] = torch.tensor(value, dtype=torch.float32, device=device)


class StepRunner:
    """Runs training steps on `model` with `optimizer`; `cuda_graph` replays them from a graph
    (CUDA only; the optimizer must be capturable, see `device_learning_rates`), or where the
    capture fails and `eager_if_capture_fails`, runs them eagerly (`capture_failure` says
    why); `recompute` recomputes the quantized layers' saved outputs in the backward pass
    (`plain_step`)."""

    def __init__(
        self,
        model: Any,  # an nn.Module, or what torch.compile made of one
        optimizer: torch.optim.Optimizer,
        loss_of: LossFn,
        grad_clip: float | None,
        device: torch.device,
        cuda_graph: bool = False,
        plain_model: Any = None,
        recompute: bool = False,
        eager_if_capture_fails: bool = False,
    ) -> None:
        self.model, self.optimizer, self.loss_of = model, optimizer, loss_of
        # the steps asked to run eagerly (statistics, the first) run this one: the model before
        # torch.compile, whose statistics layers would break and recompile a compiled model
        self.plain_model = plain_model if plain_model is not None else model
        self.device = device
        self.grad_clip = grad_clip
        self.autocast = device.type == "cuda"
        self.cuda_graph = cuda_graph
        self.eager_if_capture_fails = eager_if_capture_fails
        self.capture_failure: str | None = None  # why the steps run eagerly after all
        self.recompute = recompute
        self.eager_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batch: Any = None
        self.static_out: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, batch: Any, eager: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss, gradient norm) of one step on `batch`; `eager` keeps it out of the graph."""
        if eager:
            return self._eager(batch, self.plain_model)
        if not self.cuda_graph:
            return self._eager(batch, self.model)
        if self.graph is None and self.eager_steps < WARMUP_STEPS:
            side = warmup_stream(self.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                out = self._eager(batch, self.model)
            torch.cuda.current_stream().wait_stream(side)
            return out
        if self.graph is None:
            try:
                self._capture(batch)
            except Exception as error:
                if not self.eager_if_capture_fails:
                    raise
                return self._eager_from_now(batch, error)
        else:
            _copy_into(self.static_batch, batch)
        assert self.graph is not None and self.static_out is not None
        self.graph.replay()
        loss, grad_norm = self.static_out
        return loss.clone(), grad_norm.clone()

    def _eager(self, batch: Any, model: Any) -> tuple[torch.Tensor, torch.Tensor]:
        # Once a graph holds the gradients, they are zeroed in place, not freed.
        self.optimizer.zero_grad(set_to_none=self.graph is None)
        self.eager_steps += 1
        # Graphed or not, every step casts alike: autocast's state is part of what a compiled
        # model checks, and a change at capture would recompile inside the capture.
        return plain_step(
            model, self.optimizer, self.loss_of, batch, self.grad_clip, self.autocast,
            cache_casts=not self.cuda_graph, recompute=self.recompute,
        )  # fmt: skip

    def _eager_from_now(self, batch: Any, error: Exception) -> tuple[torch.Tensor, torch.Tensor]:
        """Give up the graph after a failed capture (nothing it recorded has run) and run this
        step and every later one eagerly."""
        from fp4cli.bench.configs import error_line

        self.cuda_graph, self.graph, self.static_out = False, None, None
        self.capture_failure = error_line(error, 160)
        torch.cuda.synchronize(self.device)
        return self._eager(batch, self.model)

    def _capture(self, batch: Any) -> None:
        self.static_batch = _clone(batch)
        self.optimizer.zero_grad(set_to_none=True)  # the graph allocates and owns the gradients
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.static_out = plain_step(
                self.model, self.optimizer, self.loss_of, self.static_batch, self.grad_clip,
                self.autocast, cache_casts=False, recompute=self.recompute,
            )  # fmt: skip
        self.graph = graph


def batch_tensors(batch: Any) -> list[torch.Tensor]:
    """The tensors of a batch: a task's Batch, a tensor, or a tuple, list or dict of them."""
    if isinstance(batch, torch.Tensor):
        return [batch]
    if hasattr(batch, "tensors"):
        batch = batch.tensors
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (tuple, list)):
        return [t for item in batch for t in batch_tensors(item)]
    raise TypeError(f"a CUDA-graph step takes batches of tensors (got {type(batch).__name__})")


def _clone(batch: Any) -> Any:
    """A copy of the batch in new memory, of the same structure and strides (a compiled model
    checks its inputs' strides: a contiguous copy of a sliced batch would recompile it)."""
    if isinstance(batch, torch.Tensor):
        copy = torch.empty_strided(batch.shape, batch.stride(), dtype=batch.dtype,
                                   device=batch.device)  # fmt: skip
        return copy.copy_(batch)
    if hasattr(batch, "tensors"):
        return type(batch)(_clone(batch.tensors))
    if isinstance(batch, dict):
        return {name: _clone(item) for name, item in batch.items()}
    return type(batch)(_clone(item) for item in batch)


def _copy_into(static: Any, batch: Any) -> None:
    for target, tensor in zip(batch_tensors(static), batch_tensors(batch), strict=True):
        if target.shape != tensor.shape:
            raise ValueError(
                f"a CUDA-graph step needs batches of one shape: got {tuple(tensor.shape)}, "
                f"the captured one {tuple(target.shape)}"
            )
        target.copy_(tensor)
