"""A quantized layer's calls as recorded host programs (`fp4cli.replay`).

What a call of the fast or vector-wise executor does on the device depends on the layer's
config, its rank, the flags of the pass (which gradients, the compute dtype) and its inputs'
shapes, dtypes, strides and alignment: nothing else. So the executors' forward and backward
passes run through one `ProgramCache`, keyed by exactly that: a layer's first call of a shape
runs the executor's Python, its second is recorded, and every later call replays the recorded
allocations, tensor operations and kernel launches. Layers of one config and shape share a
program (GPT-2 small's 48 quantized layers have four shapes).

The executors stay the definition: a replay runs the steps they ran, on the new inputs, and the
tests compare both bit for bit. Calls that tag their output for recomputation, and a custom
op's fake implementation (no tensors to launch on), run the executors directly.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from fp4cli.replay import ProgramCache

PROGRAMS = ProgramCache()


def run_planned(
    signature: Hashable,
    call: Callable[..., Any],
    inputs: Sequence[torch.Tensor | None],
    resident: tuple[int, ...] | None = None,
) -> Any:
    """call(*inputs) through the layer programs, by `signature` (the config's `ops.op_key`,
    the rank, the pass's flags) and the inputs' own; directly where launches are skipped (a
    custom op's fake implementation). resident: from a resident graph under
    `graphs("resident")` (a forward pass, whose results die with its step), the inputs at these
    indices (the activations) copied into its buffers."""
    from fp4cli.kernels.host.launch import launches_skipped

    if launches_skipped():
        return call(*inputs)
    return PROGRAMS.run(signature, call, inputs, resident)
