"""The bytes a forward pass keeps for its backward: every distinct tensor autograd saves
(`torch.autograd.graph.saved_tensors_hooks`), counted once however often it is saved."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def saved_bytes(forward: Callable[[], Any]) -> int:
    """Bytes of the distinct tensors `forward()` saves for its backward (its graph is freed)."""
    seen: dict[tuple[int, int], int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nbytes = tensor.numel() * tensor.element_size()
        seen[(tensor.data_ptr(), nbytes)] = nbytes
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(seen.values())
