"""`fp4 train --nproc-per-node N`: the same training under torchrun (torch.distributed.run).

The command re-runs itself as torchrun's workers (`python -m fp4cli.cli train ...` with the same
options less the launcher's), which find torchrun's variables and join (distributed.py). One
node: `--standalone` rendezvous. Several nodes: each node runs the same command with its
`--node-rank`, and `--nnodes` and `--rdzv-endpoint HOST:PORT` pass through (c10d rendezvous).
"""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from fp4cli.train.config import ConfigError
from fp4cli.train.distributed import under_torchrun


def torchrun_command(
    train_args: Sequence[str],
    nproc_per_node: int,
    nnodes: int = 1,
    node_rank: int = 0,
    rdzv_endpoint: str | None = None,
    subcommand: Sequence[str] = ("train",),
) -> list[str]:
    """The torchrun command line that runs `fp4 train train_args` (or another `subcommand`)
    on every process."""
    if under_torchrun():
        raise ConfigError("--nproc-per-node: this process already runs under torchrun")
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError("--nproc-per-node and --nnodes: must be positive integers")
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank: must be in 0..{nnodes - 1} (got {node_rank})")
    torchrun = [sys.executable, "-m", "fp4cli.train.torchrun"]  # torch.distributed.run
    command = [*torchrun, f"--nproc-per-node={nproc_per_node}"]
    if nnodes == 1 and rdzv_endpoint is None:
        command.append("--standalone")
    elif rdzv_endpoint is None:
        raise ConfigError("--nnodes: several nodes need --rdzv-endpoint HOST:PORT")
    else:
        command += [
            f"--nnodes={nnodes}",
            f"--node-rank={node_rank}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={rdzv_endpoint}",
        ]
    return [*command, "-m", "fp4cli.cli", *subcommand, *train_args]


def check_launch(flags: dict[str, Any], overrides: Sequence[str], nproc: int, nnodes: int) -> None:
    """What the workers would refuse, refused here in one line before starting them: a batch
    that does not split over the processes, FSDP2 with what it cannot run."""
    from fp4cli.recipes import apply_overrides, load_recipe
    from fp4cli.tasks.base import task_defaults
    from fp4cli.train.config import resolve_config
    from fp4cli.train.distributed import Distributed, check_config

    if nproc < 1 or nnodes < 1:  # before a batch is divided by them
        raise ConfigError("--nproc-per-node and --nnodes: must be positive integers")
    if flags.get("resume") is not None:
        return  # the stored config was checked when the run started
    config, recipe_overrides = resolve_config(flags, overrides)
    recipe = apply_overrides(load_recipe(config.recipe), recipe_overrides)
    if config.batch_size is None:
        defaults = task_defaults(config.task, config.size)
        batch_size = defaults.batch_size if defaults is not None else None
        config = dataclasses.replace(config, batch_size=batch_size)
    world = Distributed(
        0, nproc * nnodes, 0, config.parallel if config.parallel != "none" else "ddp"
    )
    if config.batch_size is not None:
        check_config(world, config, recipe)


def run_torchrun(command: Sequence[str]) -> int:
    """Run torchrun and wait; returns its exit code. Ctrl-C reaches torchrun from the terminal
    as it reaches this process (one process group), and torchrun passes it to its workers, whose
    trainers mark the run interrupted; a SIGTERM sent to this process is passed on to torchrun."""
    process = subprocess.Popen(list(command))

    def forward(signum: int, frame: Any) -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)

    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, lambda signum, frame: None),
        signal.SIGTERM: signal.signal(signal.SIGTERM, forward),
    }
    try:
        return process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
