"""Checkpoints: model, optimizer (with Q-Ramping state), EMA buffers, RNG states, resolved config.

Written to a temporary file and renamed into place, so a run killed mid-write never leaves a
truncated checkpoint behind. Only the newest checkpoint of a run is kept: the older ones are
removed after the store records the new one, so the one it records always exists. A checkpoint
holds only tensors, numbers, strings and plain containers, and is read with
`torch.load(weights_only=True)`: a file holding anything else (an object whose unpickling could
run code) is refused unread.

An FSDP2-sharded model is saved with torch.distributed.checkpoint instead: every rank writes its
shards into a folder `step-N.dcp` (written as `.partial` and renamed by rank 0 once all are
done), with the step, config and rank 0's RNG states in its `meta.pt`; it loads back on the same
number of processes.
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
    """Save the state after `step` completed steps. Older checkpoints stay until the store
    records this one (`prune_checkpoints`): a kill in between leaves the recorded one there."""
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
    try:
        torch.save(state, partial)
        os.replace(partial, path)
    except (OSError, RuntimeError) as error:  # a full disk, a quota, a file-size limit
        partial.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write checkpoint {path}: {_first_line(error)}") from None
    return path


def prune_checkpoints(directory: Path, keep: Path) -> None:
    """Remove the run's checkpoints other than `keep` (files and FSDP2 folders), once the
    store records `keep`."""
    import shutil

    for old in directory.glob("step-*"):
        if old != keep and not old.name.endswith(".partial"):
            shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: damaged, truncated, not a checkpoint, or holding
    more than tensors, numbers, strings and plain containers. One line naming the file."""


def read_plain(
    path: str | Path, device: torch.device | str = "cpu", what: str = "checkpoint"
) -> Any:
    """A torch file of tensors, numbers, strings and plain containers, loaded without running
    anything it holds; CheckpointError for anything else. `what` names the file in errors."""
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except OSError as error:
        raise CheckpointError(f"cannot read {what} {path}: {_os_reason(error)}") from None
    except Exception as error:  # any damaged or foreign file, in one line
        raise CheckpointError(_unreadable_message(path, what, error)) from None


def _unreadable_message(path: str | Path, what: str, error: Exception) -> str:
    """Why `path` was not loaded: the code it would have run, or that it is not a `what`.
    torch's own text is left out: it suggests loading the file unsafely."""
    refused = _refused_global(error)
    if refused is not None:
        return f"{what} {path} holds more than tensors and plain values ({refused}); refused unread"
    return f"cannot read {path}: not a {what} (unreadable)"


def _refused_global(error: Exception) -> str | None:
    """The object (`module.name`) a refused unpickling would have built, if that was why."""
    import pickle
    import re

    if not isinstance(error, pickle.UnpicklingError):
        return None
    match = re.search(r"GLOBAL ([\w.]+)", str(error))
    return match.group(1) if match else None


def _os_reason(error: OSError) -> str:
    return error.strerror or _first_line(error)


def _first_line(error: BaseException) -> str:
    """The first line of an error's text, at most 160 characters."""
    text = (str(error).strip().splitlines() or [type(error).__name__])[0]
    return text if len(text) <= 160 else text[:157] + "..."


def load_checkpoint(path: str | Path, device: torch.device) -> dict[str, Any]:
    if not Path(path).exists():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    state = read_plain(path, device)
    if not isinstance(state, dict) or not {"step", "model", "optimizer"} <= state.keys():
        raise CheckpointError(f"checkpoint {path} is not an fp4cli checkpoint")
    return state


def restore_rng(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"].cpu())
    if torch.cuda.is_available() and states.get("cuda") is not None:
        torch.cuda.set_rng_state_all([s.cpu() for s in states["cuda"]])


def _rng_states() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def save_sharded(
    directory: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    config: dict[str, Any],
    is_main: bool,
) -> Path:
    """Every rank: save an FSDP2 model and optimizer with distributed checkpoint. Returns the
    folder; rank 0 removes older checkpoints of the run."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = directory / f"step-{step:08d}.dcp"
    partial = path.with_suffix(".dcp.partial")
    from fp4cli.train.packed_gather import plain_state

    model_state, optimizer_state = plain_state(get_state_dict(model, optimizer))
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial))
    if is_main:
        meta = {"step": step, "config": config, "rng": _rng_states()}
        torch.save(meta, partial / "meta.pt")
    dist.barrier()
    if is_main:
        import shutil

        shutil.rmtree(path, ignore_errors=True)
        os.replace(partial, path)
    dist.barrier()
    return path


def load_sharded(
    path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any]:
    """Every rank: load a `save_sharded` folder into an FSDP2 model and its optimizer; returns
    the meta (step, config, rng)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not Path(path).is_dir():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    from fp4cli.train.packed_gather import plain_state

    model_state, optimizer_state = plain_state(get_state_dict(model, optimizer))
    dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)
    return read_plain(Path(path) / "meta.pt")
