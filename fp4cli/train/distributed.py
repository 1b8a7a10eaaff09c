"""Training on several processes with PyTorch's own engine: torchrun, DDP and FSDP2.

A process started by torchrun (RANK, WORLD_SIZE, LOCAL_RANK in its environment) joins the
process group (NCCL on GPUs, gloo on CPUs) and trains its share of every batch:

- The batch is the user's global batch: each of the W ranks takes rows [r B/W, (r+1) B/W) of
  the batch the task draws for the step (a pure function of seed and step), so the learning rate
  and batch size mean what they say, and DDP's gradient average is the global batch's gradient.
- `ddp`: DistributedDataParallel around the model. `fsdp`: FSDP2 `fully_shard` on every element
  of the model's ModuleLists (transformer blocks, MLP layers), then on the root; on GPUs with
  BF16 parameters for compute and FP32 gradient reduction. A quantized Linear under FSDP2 sees
  its weight after the all-gather. Where its recipe allows, each rank quantizes its own rows
  and the gather moves FP4 codes and scales (`packed_gather`); otherwise the weight travels in
  BF16 and the layer quantizes it after the gather.
- Random streams: every rank holds the same weights, so the quantizers of W (and the random
  Hadamard signs, which a GEMM's two operands share) draw the same seeds everywhere; the
  stochastic rounding of activations and gradients (X, dY) adds rank x 2^48 to its seed, so the
  ranks round their own rows independently. Rank 0 keeps the seeds of a single process.
- Only rank 0 writes to the run store; the others get its run id and checkpoint path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from fp4cli.train.config import ConfigError

PARALLEL_MODES = ("none", "ddp", "fsdp")
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class Distributed:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    parallel: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.parallel != "none"


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


def world_size() -> int:
    """The processes of this run: torchrun's WORLD_SIZE, else 1."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else 1


def from_environment(parallel: str) -> Distributed:
    """This process's place: from torchrun's variables, else a single process. Under torchrun
    `none` means DDP."""
    if parallel not in PARALLEL_MODES:
        raise ConfigError(f"parallel: must be ddp or fsdp (got {parallel!r})")
    if not under_torchrun():
        if parallel != "none":
            raise ConfigError(
                f"parallel: {parallel} needs several processes: use --nproc-per-node N "
                "or start fp4 train under torchrun"
            )
        return Distributed()
    env = {name: int(os.environ[name]) for name in TORCHRUN_VARIABLES}
    return Distributed(
        env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], "ddp" if parallel == "none" else parallel
    )


def join(dist: Distributed, device: torch.device) -> None:
    """Join the process group (once per process)."""
    import torch.distributed as torch_dist

    if not dist.active or torch_dist.is_initialized():
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch_dist.init_process_group("nccl", device_id=device)
    else:
        torch.set_num_threads(cpu_threads())
        torch_dist.init_process_group("gloo")


def cpu_threads() -> int:
    """The threads of a rank on the CPU: OMP_NUM_THREADS when set, else its share of the
    cores with the node's other ranks (torchrun's LOCAL_WORLD_SIZE)."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    return max(1, cpu_cores() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def leave(dist: Distributed) -> None:
    import torch.distributed as torch_dist

    if dist.active and torch_dist.is_initialized():
        torch_dist.destroy_process_group()


def rank_device(dist: Distributed, requested: str) -> str:
    """The device string of this rank: its local GPU under torchrun when CUDA is asked for or
    available, else what was asked."""
    if not dist.active or requested not in ("auto", "cuda"):
        return requested
    return f"cuda:{dist.local_rank}" if torch.cuda.is_available() else "cpu"


def check_config(dist: Distributed, config: Any, recipe: Any) -> None:
    """One-line errors for what cannot run on `dist.world_size` processes."""
    if not dist.active:
        return
    if config.batch_size % dist.world_size:
        raise ConfigError(
            f"batch_size: {config.batch_size} does not split over {dist.world_size} processes "
            "(the batch is the global one; pick a multiple)"
        )
    if dist.parallel == "fsdp":
        for what, present in (
            ("quantization statistics (--stats-every)", config.stats_every > 0),
            ("Q-EMA (linear.qema)", recipe.linear.qema is not None),
            ("Q-Ramping (optimizer.qramp)", recipe.qramp is not None),
            ("OsciReset (optimizer.osci_reset)", recipe.osci_reset is not None),
        ):
            if present:
                raise ConfigError(
                    f"parallel: fsdp does not support {what}: they read whole weights between "
                    "steps; use --parallel ddp"
                )


def packed_gather(model: nn.Module, dist: Distributed, config: Any) -> Any:
    """Under fsdp: mark the quantized weights FSDP2 can all-gather packed (before `wrap`) and
    return the `packed_gather.GatherReport`; None otherwise. `fp4_gather` false, torch.compile
    (a packed weight's layer runs eagerly) or one process gathers all in BF16."""
    if dist.parallel != "fsdp":
        return None
    from fp4cli.train.packed_gather import GatherReport, bf16_gather_report, mark_packed_weights

    if dist.world_size == 1:  # FSDP2 copies one process's shard: there is no gather
        return GatherReport(off="one process")
    if not config.fp4_gather:
        return bf16_gather_report(model, "parallel.fp4_gather=false")
    if config.compile:
        return bf16_gather_report(model, "torch.compile")
    return mark_packed_weights(model, dist.world_size)


def wrap(model: nn.Module, dist: Distributed, device: torch.device) -> nn.Module:
    """The model to train: DDP around it, FSDP2-sharded in place, or as it is."""
    from fp4cli.linear import quantized_layers

    for layer in quantized_layers(model).values():
        layer.rank = dist.rank
    if dist.parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        device_ids = [device.index] if device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=device_ids)
    if dist.parallel == "fsdp":
        _fully_shard(model, device)
    return model


def _fully_shard(model: nn.Module, device: torch.device) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy()  # CPU: FP32 throughout, so results match one process
    if device.type == "cuda":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blocks in model.modules():
        if isinstance(blocks, nn.ModuleList) and len(blocks) > 1:
            for block in blocks:
                fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def shard(batch: Any, dist: Distributed) -> Any:
    """This rank's rows of a global batch (every tensor is batch-first)."""
    if not dist.active:
        return batch
    tensors = {}
    for name, tensor in batch.tensors.items():
        rows = tensor.shape[0] // dist.world_size
        tensors[name] = tensor[dist.rank * rows : (dist.rank + 1) * rows]
    return type(batch)(tensors)


def broadcast(value: Any, dist: Distributed) -> Any:
    """Rank 0's `value` on every rank (any picklable object)."""
    if not dist.active:
        return value
    import torch.distributed as torch_dist

    holder = [value]
    torch_dist.broadcast_object_list(holder, src=0)
    return holder[0]


def barrier(dist: Distributed) -> None:
    if dist.active:
        import torch.distributed as torch_dist

        torch_dist.barrier()


def mean_over_ranks(value: torch.Tensor, dist: Distributed) -> torch.Tensor:
    """The mean of a 0-d tensor over the ranks (each rank's loss is its shard's mean, and the
    shards are equal: this is the global batch's loss)."""
    if not dist.active:
        return value
    import torch.distributed as torch_dist

    total = value.detach().to(torch.float32).clone()
    torch_dist.all_reduce(total)  # a sum: gloo has no average
    return total / dist.world_size


def local_value(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor from a replicated DTensor (FSDP2's gradient norm); others as they are."""
    full_tensor = getattr(value, "full_tensor", None)
    return full_tensor() if full_tensor is not None else value


class RankStore:
    """What ranks other than 0 have instead of the run store: writes do nothing, reads find
    nothing; `path` is rank 0's store file (checkpoints live next to it)."""

    def __init__(self, path: str) -> None:
        from pathlib import Path

        self.path = Path(path)

    def create_run(self, *args: Any, **kwargs: Any) -> None:
        return None

    def final_metrics(self, *args: Any, **kwargs: Any) -> dict[str, float]:
        return {}

    def latest_checkpoint(self, run_id: str) -> None:
        return None

    def _ignore(self, *args: Any, **kwargs: Any) -> None:
        return None

    reopen_run = log_metrics = log_quant_stats = log_layers = _ignore
    add_checkpoint = heartbeat = finish_run = _ignore
