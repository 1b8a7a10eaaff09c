"""`fp4 train --launcher slurm --nodes N --gpus-per-node G`: one submitit job that runs the
torchrun / DDP / FSDP2 path (launch.py) on N nodes of G processes each.

submitit starts one task per node. Each task runs torchrun with `--nnodes N`, its node's rank
and a c10d rendezvous on the job's first host (from SLURM_JOB_NODELIST, through submitit's
JobEnvironment), port 29500 + the job id mod 1000. The run's rank 0 writes a shard (a store
file with a rollback journal, fp4cli.store.shards) in the job's folder on the shared filesystem;
the other ranks never open it. When torchrun ends, node 0 renames the shard into place, and
`fp4 runs merge FOLDER` (or `--wait`) folds it into the store.

`--launcher submitit-local` runs the same job as processes of this machine (one node).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fp4cli.store.host import new_id, now
from fp4cli.train.config import ConfigError

RDZV_PORT_BASE = 29500
SHARD_KEY = "run"
WAL_VARIABLE = "FP4_STORE_WAL"  # "0": the store a command opens keeps a rollback journal


@dataclass(frozen=True)
class TrainJob:
    """What each node of the job runs: `fp4 train ARGS` under torchrun."""

    args: tuple[str, ...]  # fp4 train's options, less the store and the launcher's
    folder: str  # the job's folder: shards/ and logs/
    nodes: int
    procs_per_node: int


def job_folder(store_path: Path) -> Path:
    """A new folder for a training job's shard and logs, beside the store."""
    return Path(store_path).resolve().parent / "jobs" / new_id("train")


def rendezvous(hostnames: Sequence[str], job_id: str) -> str:
    """HOST:PORT of the job's c10d rendezvous: its first host, a port from the job id."""
    digits = "".join(c for c in str(job_id) if c.isdigit()) or "0"
    return f"{hostnames[0]}:{RDZV_PORT_BASE + int(digits) % 1000}"


def node_command(job: TrainJob, env: Any) -> list[str]:
    """The torchrun command of this node (`env`: submitit's JobEnvironment)."""
    from fp4cli.train.launch import torchrun_command

    shard = Path(job.folder) / "shards" / f"{SHARD_KEY}.db.partial"
    args = [*job.args, f"--store={shard}"]
    if job.nodes == 1:
        return torchrun_command(args, job.procs_per_node)
    endpoint = rendezvous(env.hostnames, env.job_id)
    return torchrun_command(args, job.procs_per_node, job.nodes, env.node, endpoint)


def node_main(job: TrainJob) -> int:
    """One node's task: claim the shard (node 0), run torchrun, put the shard in place."""
    import submitit

    from fp4cli.store.shards import claim
    from fp4cli.train.launch import run_torchrun

    env = submitit.JobEnvironment()
    taken = None
    if env.node == 0:
        taken = claim(Path(job.folder) / "shards", SHARD_KEY, str(env.job_id))
        if taken is None:
            raise RuntimeError(f"the shard of {job.folder} is held by a live process")
    os.environ[WAL_VARIABLE] = "0"
    code = run_torchrun(node_command(job, env))
    if taken is not None:
        run_id = _run_of(taken.partial)
        taken.complete(run_id) if run_id is not None else taken.release()
    return code


def _run_of(shard: Path) -> str | None:
    if not shard.exists():
        return None
    conn = sqlite3.connect(shard)
    try:
        row = conn.execute("SELECT id FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
    except sqlite3.Error:
        return None
    finally:
        conn.close()
    return None if row is None else str(row[0])


def submit_training(
    launcher: str,
    args: Sequence[str],
    store_path: Path,
    options: Any,
    nodes: int,
    gpus_per_node: int,
) -> tuple[Any, Path]:
    """Submit the job; returns (submitit job, its folder). The job's record is job.json."""
    from fp4cli.sweep.errors import SweepError
    from fp4cli.sweep.launchers import make_executor

    if nodes < 1 or gpus_per_node < 1:
        raise ConfigError("--nodes and --gpus-per-node: must be positive integers")
    if launcher == "submitit-local" and nodes > 1:
        raise ConfigError("--nodes: submitit-local runs one node (this machine)")
    folder = job_folder(store_path)
    try:
        executor = make_executor(launcher, folder / "logs", options, "fp4-train", nodes, 1,
                                 gpus_per_node)  # fmt: skip
    except SweepError as error:
        raise ConfigError(str(error)) from None
    job = executor.submit(node_main, TrainJob(tuple(args), str(folder), nodes, gpus_per_node))
    record = {"job_id": str(job.job_id), "launcher": launcher, "nodes": nodes,
              "gpus_per_node": gpus_per_node, "args": list(args),
              "submitted_at": now()}  # fmt: skip
    (folder / "job.json").write_text(json.dumps(record, indent=1))
    return job, folder


def wait_and_merge(job: Any, folder: Path, store: Any, poll_s: float = 2.0) -> list[str]:
    """Wait for the job to end, then fold its shard into `store`; returns the run ids merged."""
    from fp4cli.store.shards import merge_shards

    while not job.done():
        time.sleep(poll_s)
    return merge_shards(store, folder / "shards").merged
