"""Checkpoints: model, optimizer (with Q-Ramping state), EMA buffers, RNG states, resolved config.

Written to a temporary file and renamed into place, so a run killed mid-write never leaves a
truncated checkpoint behind. Only the newest checkpoint of a run is kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn


def save_checkpoint(
    directory: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Save the state after `step` completed steps; remove older checkpoints of the run."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step-{step:08d}.pt"
    state = {
        "step": step,
        "model": model.state_dict(),  # includes QuantLinear seeds, call counters, EMA buffers
        "optimizer": optimizer.state_dict(),
        "config": config,
        "rng": _rng_states(),
        "extra": extra or {},
    }
    partial = path.with_suffix(".pt.partial")
    torch.save(state, partial)
    os.replace(partial, path)
    for old in directory.glob("step-*.pt"):
        if old != path:
            old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, device: torch.device) -> dict[str, Any]:
    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    state = torch.load(path, map_location=device, weights_only=False)
    return state


def restore_rng(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"].cpu())
    if torch.cuda.is_available() and states.get("cuda") is not None:
        torch.cuda.set_rng_state_all([s.cpu() for s in states["cuda"]])


def _rng_states() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}
