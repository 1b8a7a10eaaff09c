"""The trainer end to end: tasks x recipes, resume, divergence, kills, statistics, CLI errors."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter

FP4 = [sys.executable, "-m", "fp4cli.cli"]


def _train(store, **flags):
    base = {"size": "debug", "device": "cpu", "log_every": 1}
    overrides = flags.pop("overrides", [])
    result, trainer = run_training({**base, **flags}, overrides, store, reporter=SilentReporter())
    return result, trainer


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "fp4.db")


# Every task with each recipe family, but the diffusion task (the slowest on a CPU) with bf16
# and one quantized recipe: the quantized layers do not depend on the task around them.
TASK_RECIPES = [
    (task, recipe)
    for task in ("regression", "vit", "diffusion", "gpt")
    for recipe in ("bf16", "mxfp4", "tetrajet", "nvfp4")
    if task != "diffusion" or recipe in ("bf16", "nvfp4")
]


@pytest.mark.parametrize(("task", "recipe"), TASK_RECIPES)
def test_every_task_trains_with_recipes(store, task, recipe):
    result, _ = _train(store, task=task, recipe=recipe, steps=3, batch_size=4)
    assert result.status == "finished"
    run = store.get_run(result.run_id)
    assert run["status"] == "finished" and run["step"] == 3
    losses = [m["value"] for m in store.metrics(result.run_id, "train_loss")]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert store.latest_checkpoint(result.run_id) is not None


class _StopAt(SilentReporter):
    def __init__(self, step):
        self.stop_step = step

    def update(self, step, loss, samples_per_s):
        if step == self.stop_step:
            raise KeyboardInterrupt


RESUME_OVERRIDES = {
    "tetrajet-qema": [],
    "tetrajet-qramp": ["optimizer.qramp.interval=15"],
    # windows of 8 from step 0: the checkpoint after step 19 holds the tracked sums of the window
    # that resets after step 20
    "tetrajet-v2-osci": [
        "optimizer.osci_reset.start_step=0",
        "optimizer.osci_reset.period=8",
        "optimizer.osci_reset.track_steps=3",
        "optimizer.osci_reset.threshold=2",
    ],
}


@pytest.mark.parametrize("recipe", RESUME_OVERRIDES)
def test_resume_reproduces_an_uninterrupted_run(store, recipe):
    flags = {
        "task": "regression",
        "size": "debug",
        "device": "cpu",
        "recipe": recipe,
        "steps": 40,
        "checkpoint_every": 20,
        "eval_every": 10,
        "log_every": 1,
        "stats_every": 10,
    }
    overrides = RESUME_OVERRIDES[recipe]
    full, _ = run_training(flags, overrides, store, reporter=SilentReporter())
    cut, _ = run_training(flags, overrides, store, reporter=_StopAt(27))
    assert cut.status == "interrupted"
    assert store.get_run(cut.run_id)["status"] == "interrupted"
    resumed, _ = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert resumed.run_id == cut.run_id and resumed.status == "finished"

    def series(run_id):  # every metric but the measured throughput
        rows = store.metrics(run_id)
        return [(m["step"], m["name"], m["value"]) for m in rows if m["name"] != "samples_per_s"]

    assert series(resumed.run_id) == series(full.run_id)  # no duplicate, none missing
    if recipe == "tetrajet-v2-osci":  # resets after steps 4, 12, 20, ...: logged at step + 1
        resets = store.metrics(full.run_id, "osci_reset_fraction")
        assert [m["step"] for m in resets] == [5, 13, 21, 29, 37]
        assert all(0 < m["value"] < 1 for m in resets)


def test_nan_loss_marks_the_run_diverged(store, monkeypatch):
    from fp4cli.tasks.base import create_task

    task_class = type(create_task("regression", "debug"))
    original_loss, original_batch = task_class.loss, task_class.batch

    def batch(self, step, batch_size, seed):
        tensors = original_batch(self, step, batch_size, seed)
        tensors.step_index = step
        return tensors

    def loss(self, model, tensors):
        value = original_loss(self, model, tensors)
        return value * float("nan") if tensors.step_index >= 4 else value

    monkeypatch.setattr(task_class, "batch", batch)
    monkeypatch.setattr(task_class, "loss", loss)
    result, _ = _train(store, task="regression", recipe="mxfp4", steps=10)
    run = store.get_run(result.run_id)
    assert result.status == "diverged" and run["status"] == "diverged"
    assert run["diverged_step"] == 4


def test_quant_stats_land_in_the_store(store):
    result, _ = _train(store, task="regression", recipe="tetrajet", steps=10, stats_every=5)
    rows = store.quant_stats(result.run_id)
    operands = {r["operand"] for r in rows}
    assert {"forward_x", "forward_w", "grad_input_dy", "grad_weight_x", "weight"} <= operands
    metrics = {r["metric"] for r in rows}
    assert {
        "rel_mse",
        "snr_db",
        "clipped",
        "flushed",
        "osc_share",
        "rate_qw",
        "conf_mean",
    } <= metrics
    assert {r["step"] for r in rows} == {5, 10}


def test_killed_training_process_is_marked_interrupted(tmp_path):
    db = tmp_path / "fp4.db"
    env = {**os.environ, "FP4_STORE": str(db)}
    cmd = [
        *FP4,
        "train",
        "--task",
        "regression",
        "--size",
        "debug",
        "--steps",
        "1000000",
        "--device",
        "cpu",
        "--quiet",
        "--recipe",
        "mxfp4",
    ]
    proc = subprocess.Popen(
        cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        if db.exists():
            runs = RunStore(db).list_runs()
            if runs and (runs[0]["step"] or 0) >= 30:
                break
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    store = RunStore(db)
    run = store.list_runs()[0]
    assert run["status"] == "interrupted"
    assert len(store.metrics(run["id"], "train_loss")) >= 3  # what was written is kept


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--task", "nope"], "unknown task"),
        (["--recipe", "nope"], "nope"),
        (["--set", "lrr=3"], "lrr"),
        (["--set", "linear.forward.x.rounding=rn"], "rounding"),
        (["--task", "gpt", "--data", "/does/not/exist"], "/does/not/exist"),
        (["--size", "huge"], "size"),
    ],
)
def test_bad_train_inputs_give_one_line_errors(tmp_path, args, fragment):
    env = {"FP4_STORE": str(tmp_path / "fp4.db")}
    result = CliRunner().invoke(app, ["train", "--steps", "1", "--quiet", *args], env=env)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in result.output


def test_corrupt_store_is_a_one_line_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(os.urandom(4096))
    result = CliRunner().invoke(app, ["train", "--store", str(bad), "--quiet"])
    assert result.exit_code == 2 and "error:" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_fp4_train_with_no_arguments_trains_and_summarizes(tmp_path):
    env = {**os.environ, "FP4_STORE": str(tmp_path / "fp4.db"), "COLUMNS": "200"}
    done = subprocess.run(
        [*FP4, "train", "--quiet"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "finished" in done.stdout and str(tmp_path / "fp4.db") in done.stdout
    assert Path(tmp_path / "fp4.db").exists()


def test_set_values_parse_exponent_floats():
    from fp4cli.recipes import apply_overrides, load_recipe
    from fp4cli.train.config import resolve_config

    config, recipe_overrides = resolve_config({}, ["lr=3e-4", "linear.qema.beta=9.98e-1"])
    assert config.lr == 3e-4
    recipe = apply_overrides(load_recipe("tetrajet-qema"), recipe_overrides)
    assert recipe.linear.qema.beta == 0.998


def test_quant_confidence_values():
    from fp4cli import LinearConfig, QuantLinear, QuantSpec
    from fp4cli.train.stats import quant_confidence

    layer = QuantLinear(32, 1, config=LinearConfig(forward_w=QuantSpec.preset("mxfp4-ceil")))
    values = [6.0, 1.25, 1.0, 2.5, 3.25, 0.375, -4.5] + [0.0] * 25  # amax 6: scale 1
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([values]))
    confidence = quant_confidence(layer)[0, :7].tolist()
    assert confidence == [1.0, 0.0, 1.0, 0.0, 0.5, 0.5, 0.5]
