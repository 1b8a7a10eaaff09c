"""Training on several processes (torchrun, gloo on the CPU): DDP and FSDP2 match one process,
rank 0 alone writes the store, resume, kills, seeds per rank, the launcher's errors."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.linear import QuantLinear
from fp4cli.linear.config import LinearConfig
from fp4cli.quant import QuantSpec
from fp4cli.store import RunStore
from fp4cli.train.launch import torchrun_command

FP4 = [sys.executable, "-m", "fp4cli.cli", "train"]
BASE = ["--size=debug", "--device=cpu", "--quiet", "--set=log_every=1"]


def _train(tmp_path, *args, check=True):
    """`fp4 train` in a subprocess; a --resume takes no other option but --steps."""
    store = ["--store", str(tmp_path / "s.db")]
    base = ["--quiet"] if any(a.startswith("--resume") for a in args) else BASE
    done = subprocess.run([*FP4, *base, *store, *args], capture_output=True, text=True, timeout=300)
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def _losses(store, run):
    return [m["value"] for m in store.metrics(run["id"], "train_loss")]


def _trains_as_one(tmp_path, args, parallel, metric):
    """One process, then two (`parallel`) on the same global batch: the same losses and final
    `metric`. Returns the two-process run."""
    _train(tmp_path, *args)
    _train(tmp_path, *args, "--nproc-per-node=2", f"--parallel={parallel}")
    store = RunStore(tmp_path / "s.db")
    distributed, single = store.list_runs()  # newest first; rank 0 alone wrote a run
    assert (distributed["world_size"], distributed["parallel"]) == (2, parallel)
    assert (single["world_size"], single["parallel"]) == (1, "none")
    assert _losses(store, distributed) == pytest.approx(_losses(store, single), rel=1e-5)
    final = [store.final_metrics(run["id"], [metric])[metric] for run in (distributed, single)]
    assert final[0] == pytest.approx(final[1], rel=1e-4)
    return distributed


@pytest.mark.parametrize(
    ("task", "recipe", "metric"),
    [("gpt", "mxfp4", "val_loss"), ("vit", "bf16", "top1")],  # FSDP2: the Ctrl-C test below
)
def test_two_processes_train_as_one_with_the_same_global_batch(tmp_path, task, recipe, metric):
    args = [f"--task={task}", f"--recipe={recipe}", "--steps=4", "--batch-size=8"]
    _trains_as_one(tmp_path, args, "ddp", metric)


def test_fsdp_run_stopped_by_ctrl_c_resumes_on_the_same_world_size(tmp_path):
    """Two FSDP2 processes train as one (the same global batch), and a run of them stopped by
    Ctrl-C resumes to the uninterrupted run's losses."""
    args = ["--task=gpt", "--recipe=mxfp4", "--steps=30", "--set=checkpoint_every=3"]
    fsdp = _trains_as_one(tmp_path, args, "fsdp", "val_loss")
    db = tmp_path / "s.db"
    command = [*FP4, *BASE, "--store", str(db), *args, "--nproc-per-node=2", "--parallel=fsdp"]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    run_id = _wait_for_checkpoint(db, process)
    os.killpg(
        process.pid, signal.SIGINT
    )  # Ctrl-C: the launcher and torchrun, which tells the ranks
    assert process.wait(timeout=120) == 130
    store = RunStore(db)
    assert store.get_run(run_id)["status"] == "interrupted", store.get_run(run_id)["message"]
    wrong = _train(tmp_path, f"--resume={run_id}", check=False)  # one process, not two
    assert wrong.returncode == 2 and "resume it on as many" in wrong.stderr
    _train(tmp_path, f"--resume={run_id}", "--nproc-per-node=2")
    store = RunStore(db)
    full, resumed = store.get_run(fsdp["id"]), store.get_run(run_id)
    assert resumed["status"] == "finished" and resumed["step"] == 30
    assert _losses(store, resumed) == pytest.approx(_losses(store, full), rel=1e-5)


def test_a_killed_multi_process_run_is_marked_interrupted(tmp_path):
    db = tmp_path / "s.db"
    command = [*FP4, *BASE, "--store", str(db), "--task=gpt", "--steps=2000", "--nproc-per-node=2"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not (db.exists() and RunStore(db).list_runs()):
        time.sleep(0.5)
    (run,) = RunStore(db).list_runs()
    os.kill(run["pid"], signal.SIGKILL)  # rank 0, outright; torchrun then ends the other rank
    assert process.wait(timeout=120) != 0
    (run,) = RunStore(db).list_runs()
    assert run["status"] == "interrupted" and run["world_size"] == 2


def _wait_for_checkpoint(db, process):
    deadline = time.time() + 180
    while time.time() < deadline:
        assert process.poll() is None, "the run ended before it could be stopped"
        if db.exists():
            runs = RunStore(db).list_runs(status="running")
            if runs and RunStore(db).checkpoints(runs[0]["id"]):
                return runs[0]["id"]
        time.sleep(0.2)
    raise AssertionError("no checkpoint appeared")


def test_activations_and_gradients_round_per_rank_weights_alike():
    """SR on one operand at a time: only X and dY make the ranks differ."""
    torch.manual_seed(0)
    x, grad_y = torch.randn(64, 64), torch.randn(64, 32)  # not on the grid: SR has work to do
    sr = QuantSpec.preset("mxfp4", rounding="sr")

    def outputs(config):
        results = []
        for rank in (0, 1):
            torch.manual_seed(1)
            layer = QuantLinear(64, 32, config=config, seed=5)
            layer.rank = rank
            inputs = x.clone().requires_grad_()
            out = layer(inputs)
            out.backward(grad_y)
            results.append((out.detach(), inputs.grad, layer.weight.grad))
        return results

    (y0, dx0, dw0), (y1, dx1, dw1) = outputs(LinearConfig(forward_w=sr, grad_input_w=sr))
    assert torch.equal(y0, y1) and torch.equal(dx0, dx1)  # the weight rounds alike
    (y0, _, _), (y1, _, _) = outputs(LinearConfig(forward_x=sr))
    assert not torch.equal(y0, y1)
    (_, dx0, dw0), (_, dx1, dw1) = outputs(LinearConfig(grad_input_dy=sr, grad_weight_dy=sr))
    assert not torch.equal(dx0, dx1) and not torch.equal(dw0, dw1)


def test_the_worker_processes_get_flags_they_parse(tmp_path):
    """Each process under torchrun (and each Slurm task) runs `fp4 train` with the options of
    the first: a flag goes as --compile / --no-compile, never --compile=True."""
    from typer.main import get_command

    from fp4cli.cli.train_cmd import _train_args

    flags = {"task": "gpt", "compile": True, "cuda_graph": False, "steps": 3, "tags": ("a",)}
    args = _train_args(flags, ["lr=0.1"], None, str(tmp_path / "s.db"), quiet=True)
    assert args == ["--task=gpt", "--compile", "--no-cuda-graph", "--steps=3", "--tag=a",
                    "--set=lr=0.1", f"--store={tmp_path / 's.db'}", "--quiet"]  # fmt: skip
    context = get_command(app).commands["train"].make_context("train", list(args))
    assert context.params["compile"] is True and context.params["cuda_graph"] is False


def test_the_launcher_command_and_its_errors(tmp_path):
    command = torchrun_command(["--task=gpt"], 2)
    assert command[1:5] == ["-m", "fp4cli.train.torchrun", "--nproc-per-node=2", "--standalone"]
    assert command[-4:] == ["-m", "fp4cli.cli", "train", "--task=gpt"]
    nodes = torchrun_command([], 8, nnodes=2, node_rank=1, rdzv_endpoint="host:29500")
    assert "--nnodes=2" in nodes and "--node-rank=1" in nodes
    assert "--rdzv-endpoint=host:29500" in nodes and "--standalone" not in nodes
    store = ["--store", str(tmp_path / "s.db")]
    for args, message in (
        (["--nproc-per-node=2", "--nnodes=2"], "several nodes need --rdzv-endpoint"),
        (["--nproc-per-node=2", "--node-rank=3"], "--node-rank: must be in 0..0"),
        (["--nproc-per-node=3", "--batch-size=8"], "batch_size: 8 does not split over 3"),
        (["--nproc-per-node=2", "--parallel=fsdp", "--stats-every=5"], "fsdp does not support"),
        (
            ["--nproc-per-node=2", "--parallel=fsdp", "--recipe=tetrajet-v2-osci"],
            "fsdp does not support OsciReset",
        ),
        (["--nproc-per-node=2", "--parallel=zero"], "parallel: must be ddp or fsdp"),
        (["--parallel=fsdp"], "needs several processes"),
    ):
        result = CliRunner().invoke(app, ["train", *store, "--size=debug", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and result.output.count("\n") == 1
