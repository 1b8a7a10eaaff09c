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
from fp4cli.train.config import ConfigError
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


# Resuming never moves a run back; an extended run resumes to its extended steps.


def _store_rows(store, run_id):
    """Everything the store holds of a run, but the measured throughput."""
    run = dict(store.get_run(run_id))
    return run, _series(store, run_id), store.checkpoints(run_id), store.quant_stats(run_id)


def _series(store, run_id):
    rows = store.metrics(run_id)
    return [(m["step"], m["name"], m["value"]) for m in rows if m["name"] != "samples_per_s"]


def test_a_finished_run_resumed_without_more_steps_changes_nothing(store):
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 6}
    first, _ = run_training(flags, [], store, reporter=SilentReporter())
    run_training({"steps": 9}, [], store, resume=first.run_id, reporter=SilentReporter())
    before = _store_rows(store, first.run_id)
    args = ["train", "--resume", first.run_id, "--store", str(store.path), "--quiet"]
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert again.output.strip() == (
        f"run {first.run_id} finished at step 9 of 9; give --steps above 9 to train further"
    )
    same = CliRunner().invoke(app, [*args, "--steps", "9"])
    back = CliRunner().invoke(app, [*args, "--steps", "7"])
    assert same.exit_code == 0 and back.exit_code == 2, same.output + back.output
    assert back.output.startswith("error: --steps 7:") and "never moves a run back" in back.output
    assert _store_rows(store, first.run_id) == before
    assert Path(store.latest_checkpoint(first.run_id)["path"]).exists()


def test_an_extended_run_resumes_to_its_extended_steps(store):
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 6,
             "checkpoint_every": 1, "log_every": 1}  # fmt: skip
    first, _ = run_training(flags, [], store, reporter=SilentReporter())
    cut, _ = run_training({"steps": 12}, [], store, resume=first.run_id, reporter=_StopAt(9))
    assert cut.status == "interrupted" and store.latest_checkpoint(cut.run_id)["step"] == 8
    resumed, trainer = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert (resumed.status, resumed.step, trainer.config.steps) == ("finished", 12, 12)
    run = store.get_run(cut.run_id)
    assert (run["status"], run["step"]) == ("finished", 12)
    assert [m["step"] for m in store.metrics(cut.run_id, "train_loss")] == list(range(1, 13))
    assert store.latest_checkpoint(cut.run_id)["step"] == 12


def test_an_interrupted_run_is_not_resumed_below_its_checkpoint(store):
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 10,
             "checkpoint_every": 1, "log_every": 1}  # fmt: skip
    cut, _ = run_training(flags, [], store, reporter=_StopAt(7))
    before = _store_rows(store, cut.run_id)
    with pytest.raises(ConfigError, match="--steps 4: run .* is at step 6; a resume never"):
        run_training({"steps": 4}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert _store_rows(store, cut.run_id) == before


# The statistics' window that spans an interruption is restored from the checkpoint.


def test_resume_records_the_uninterrupted_runs_statistics(store):
    flags = {"task": "regression", "size": "debug", "device": "cpu", "recipe": "tetrajet",
             "steps": 15, "checkpoint_every": 1, "stats_every": 5, "log_every": 1,
             "seed": 3}  # fmt: skip
    full, _ = run_training(flags, [], store, reporter=SilentReporter())
    cut, _ = run_training(flags, [], store, reporter=_StopAt(8))  # inside the window 5..10
    assert store.latest_checkpoint(cut.run_id)["step"] == 7
    resumed, _ = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    expected = store.quant_stats(full.run_id)
    assert {r["step"] for r in expected} == {5, 10, 15}
    assert store.quant_stats(resumed.run_id) == expected
    window = [r for r in expected if r["step"] == 10 and r["metric"] == "rate_w"]
    assert window and all(r["value"] > 0 for r in window)


def test_a_window_counts_every_step_of_its_weights_movement(store):
    """The window's previous weight is a copy: the optimizer updates the weight in place."""
    from fp4cli.linear import QuantLinear
    from fp4cli.linear.config import LinearConfig
    from fp4cli.quant import QuantSpec
    from fp4cli.train.stats import QuantStatsCollector

    layer = QuantLinear(32, 4, config=LinearConfig(forward_w=QuantSpec.preset("mxfp4-ceil")))
    collector = QuantStatsCollector(torch.nn.Sequential(layer), enabled=True)
    for _ in range(4):
        collector.begin(collect=False)
        layer(torch.ones(2, 32))
        with torch.no_grad():
            layer.weight.add_(0.01)  # in place, as the optimizer
        collector.after_step()
    (window,) = collector.windows.values()
    assert window.steps == 3
    assert torch.allclose(window.dist_w, torch.full_like(window.dist_w, 0.03))


# Stop signals: 130, a second signal while the first is handled raises nothing.


def test_a_second_signal_while_the_run_records_its_stop_is_ignored(store, monkeypatch):
    class SignalAt(SilentReporter):
        def update(self, step, loss, samples_per_s):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)

    real_finish = RunStore.finish_run

    def finish_then_signalled(self, run_id, status, **fields):
        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's SIGTERM, milliseconds later
        return real_finish(self, run_id, status, **fields)

    monkeypatch.setattr(RunStore, "finish_run", finish_then_signalled)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 10, "log_every": 1}
    result, _ = run_training(flags, [], store, reporter=SignalAt())
    assert result.status == "interrupted" and result.step == 2
    assert store.get_run(result.run_id)["status"] == "interrupted"
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_the_stop_handler_raises_once():
    from fp4cli.train.signals import stop_signals

    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    raised = 0
    try:
        with stop_signals():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
                try:
                    signal.raise_signal(sig)
                except KeyboardInterrupt:
                    raised += 1
        assert raised == 1  # the process is ending: later signals stay ignored
        assert signal.getsignal(signal.SIGINT) == signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    with stop_signals():  # no signal: the handlers come back
        pass
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


@pytest.mark.parametrize(
    "signals",
    [(signal.SIGINT,), (signal.SIGTERM,), (signal.SIGINT, signal.SIGTERM)],
    ids=["sigint", "sigterm", "sigint-then-sigterm"],
)
def test_fp4_train_stopped_by_a_signal_exits_130(tmp_path, signals):
    db = tmp_path / "fp4.db"
    command = [*FP4, "train", "--task", "regression", "--size", "debug", "--device", "cpu",
               "--steps", "1000000", "--quiet", "--store", str(db)]  # fmt: skip
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.time() + 120
    while time.time() < deadline and process.poll() is None:
        runs = RunStore(db).list_runs() if db.exists() else []
        if runs and (runs[0]["step"] or 0) >= 20:
            break
        time.sleep(0.2)
    for sig in signals:
        process.send_signal(sig)
        time.sleep(0.008)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130, out + err
    assert "Traceback" not in err and "interrupted at step" in out
    assert RunStore(db).list_runs()[0]["status"] == "interrupted"


# Processes on the CPU share its cores.


def test_cpu_processes_share_the_cores_and_say_so(tmp_path, monkeypatch):
    import fp4cli.train.launch as launch
    from fp4cli.train.distributed import cpu_cores

    seen = []
    monkeypatch.setattr(launch, "run_torchrun", lambda command: seen.append(
        os.environ.get("OMP_NUM_THREADS")) or 0)  # fmt: skip
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    args = ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--quiet",
            "--nproc-per-node", "2", "--store", str(tmp_path / "s.db")]  # fmt: skip
    done = CliRunner().invoke(app, args)
    assert done.exit_code == 0, done.output
    assert seen == [str(max(1, cpu_cores() // 2))] and "OMP_NUM_THREADS" not in os.environ
    warnings = [line for line in done.output.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "share" in warnings[0]
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's is kept
    assert CliRunner().invoke(app, args).exit_code == 0 and seen[-1] == "3"


def test_a_cpu_rank_takes_its_share_of_the_cores(monkeypatch):
    from fp4cli.train.distributed import cpu_cores, cpu_threads

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert cpu_threads() == max(1, cpu_cores() // 8)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cpu_threads() == 2
