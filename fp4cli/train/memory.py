"""Whether a training batch fits in memory, told before the first step.

A batch too large for the device ends a run in the middle of its first step: on a GPU with an
out-of-memory error, on a CPU often with the kernel's OOM killer and no message at all. Before
training, two forward passes of 1 and 2 samples (in evaluation mode, so no layer advances its
random streams, and under the run's autocast) count the bytes autograd saves for the backward
pass; what grows with the batch, times the batch, plus the parameters, gradients and optimizer
state, is the estimate, compared with the memory the device has free.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from fp4cli.train.config import ConfigError

HEADROOM = 0.9  # of the free memory an estimate may use
GIB = 2**30


def forward_saved_bytes(forward: Callable[[], Any], recompute: bool = False) -> int:
    """Bytes of the tensors autograd keeps for the backward pass of `forward()` (each storage
    once); with `recompute`, as `recomputed_outputs()` keeps them (a recomputed output's
    operands instead of it). The pass cannot be differentiated: the graph keeps nothing saved."""
    from fp4cli.linear.recompute import kept_tensors, tagging

    storages: dict[int, torch.UntypedStorage] = {}

    def pack(tensor: torch.Tensor) -> None:
        for kept in kept_tensors(tensor) if recompute else [tensor]:
            storage = kept.untyped_storage()
            storages[storage.data_ptr()] = storage
        # The storage is held here until the pass ends, so that no later tensor reuses its
        # memory (and address); the graph keeps nothing: a saved output kept as itself would
        # hold its own graph in a cycle Python cannot free (and with it each parameter's
        # gradient accumulator, made on this stream, which a later CUDA-graph capture reuses).

    tag_outputs = tagging() if recompute else nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, _never_unpacked), tag_outputs:
        forward()
    return sum(storage.nbytes() for storage in storages.values())


def saved_bytes(
    model: nn.Module, loss_of: Any, batch: Any, device: torch.device, recompute: bool = False
) -> int:
    """`forward_saved_bytes` of the loss of one batch, with the model in evaluation mode for the
    pass (no layer advances its random streams) and BF16 autocast on CUDA, as training casts."""
    was_training = model.training
    model.eval()
    autocast = (
        torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()
    )
    try:
        with autocast:
            return forward_saved_bytes(lambda: loss_of(model, batch), recompute)
    finally:
        model.train(was_training)


def _never_unpacked(_: None) -> torch.Tensor:
    raise RuntimeError("the memory probe's forward pass is not differentiated")


def free_bytes(device: torch.device) -> int | None:
    """Memory free for this process on `device`, or None where it cannot be read."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_batch_fits(
    model: nn.Module,
    task: Any,
    batch_size: int,
    seed: int,
    device: torch.device,
    recompute: bool = False,
) -> None:
    """ConfigError, before training, when the estimate for `batch_size` (this process's share)
    exceeds the device's free memory."""
    free = free_bytes(device)
    if free is None:
        return
    one = saved_bytes(model, task.loss, task.batch(0, 1, seed), device, recompute)
    two = saved_bytes(model, task.loss, task.batch(0, 2, seed), device, recompute)
    per_sample, fixed = max(two - one, 0), max(2 * one - two, 0)
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    state = 3 * parameters  # gradients and AdamW's two moments, not allocated yet
    needed = fixed + batch_size * per_sample + state
    if needed > HEADROOM * free:
        fitting = max(1, int((HEADROOM * free - fixed - state) // max(per_sample, 1)))
        raise ConfigError(
            f"batch_size: {batch_size} needs about {needed / GIB:.1f} GiB for its activations and "
            f"optimizer state, {free / GIB:.1f} GiB are free on {device}; about {fitting} fits"
        )
