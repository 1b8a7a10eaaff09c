"""`fp4 train --launcher slurm --nodes N --gpus-per-node G`: the torchrun command each node
runs (rendezvous from the Slurm environment), the job run end to end through submitit's local
executor (one node, two processes on the CPU), and the options it refuses."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.train.slurm import TrainJob, node_command, rendezvous


def test_each_node_joins_the_rendezvous_on_the_jobs_first_host(tmp_path):
    job = TrainJob(("--task=gpt", "--quiet"), str(tmp_path), nodes=2, procs_per_node=4)
    env = SimpleNamespace(hostnames=["gpu-a17", "gpu-b03"], job_id="812345", node=1)
    command = node_command(job, env)
    assert rendezvous(env.hostnames, env.job_id) == "gpu-a17:29845"
    for part in ("--nproc-per-node=4", "--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=gpu-a17:29845"):  # fmt: skip
        assert part in command
    assert command[-3:] == ["--task=gpt", "--quiet", f"--store={tmp_path}/shards/run.db.partial"]
    single = node_command(TrainJob((), str(tmp_path), 1, 2), env)
    assert "--standalone" in single and not any("--nnodes" in part for part in single)


def test_a_job_on_the_local_executor_trains_on_two_processes_and_merges(tmp_path):
    db = str(tmp_path / "fp4.db")
    result = CliRunner().invoke(
        app, ["train", "--size", "debug", "--steps", "3", "--device", "cpu", "--launcher",
              "submitit-local", "--gpus-per-node", "2", "--wait", "--store", db],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "submitted job" in result.output and "finished at step 3" in result.output
    (run,) = RunStore(db).list_runs()
    assert (run["status"], run["world_size"], run["parallel"]) == ("finished", 2, "ddp")
    folder = next((tmp_path / "jobs").iterdir())
    record = json.loads((folder / "job.json").read_text())
    assert record["gpus_per_node"] == 2 and "--store" not in " ".join(record["args"])
    assert [p.name for p in (folder / "shards").glob("*.db")] == [f"run-{run['id']}.db"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "2"], "--nodes and --gpus-per-node: only with --launcher slurm"),
        (["--launcher", "submitit-local", "--nodes", "2"], "submitit-local runs one node"),
        (["--launcher", "submitit-local", "--resume", "r-x"], "--resume: not with --launcher"),
        (["--launcher", "slurm"], "sbatch is not on this machine's PATH"),
        (["--launcher", "slurm", "--sbatch", "=3"], "expected KEY=VALUE"),
        (["--launcher", "submitit-local", "--gpus-per-node", "3", "--batch-size", "8"],
         "does not split over 3 processes"),
    ],
)  # fmt: skip
def test_options_the_launcher_refuses(tmp_path, monkeypatch, args, message):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    db = str(tmp_path / "fp4.db")
    result = CliRunner().invoke(app, ["train", "--size", "debug", "--store", db, *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "jobs").exists()
