"""OutControl in training runs: the recipes on the CPU through the Python API and `fp4 train`,
with a resume mid-recording, the recipe shown, and a bad value as a one-line error."""

import pytest
import torch
from typer.testing import CliRunner

import fp4cli
from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter

# Chosen after step 1 (norms of step 1), FP8 channels counted in multiples of 16: the debug
# regression model's layers (32 and 64 inputs) keep 16 each.
SHORT = [
    "linear.out_control.record_start=0",
    "linear.out_control.record_steps=1",
    "linear.out_control.multiple=16",
]


@pytest.mark.parametrize("recipe", ["tetrajet-v2-outcontrol", "tetrajet-v2-full"])
def test_the_recipes_train_on_the_cpu(tmp_path, recipe):
    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "regression", "size": "debug", "device": "cpu", "log_every": 1,
             "recipe": recipe, "steps": 3, "batch_size": 8}  # fmt: skip
    result, trainer = run_training(flags, SHORT, store, reporter=SilentReporter())
    assert result.status == "finished"
    losses = [m["value"] for m in store.metrics(result.run_id, "train_loss")]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    layers = fp4cli.quantized_layers(trainer.model)
    assert layers and all(layer.out_control_channels() is not None for layer in layers.values())
    assert all(len(layer.out_control_channels()[0]) == 16 for layer in layers.values())  # type: ignore[index]


class _StopAt(SilentReporter):
    def __init__(self, step):
        self.stop_step = step

    def update(self, step, loss, samples_per_s):
        if step == self.stop_step:
            raise KeyboardInterrupt


def test_a_resumed_run_records_and_chooses_as_an_uninterrupted_one(tmp_path):
    """Norms recorded over steps 2-5, the checkpoint after step 3 holds half the sums."""
    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "regression", "size": "debug", "device": "cpu", "log_every": 1,
             "recipe": "tetrajet-v2-outcontrol", "steps": 10, "checkpoint_every": 4,
             "batch_size": 8}  # fmt: skip
    overrides = ["linear.out_control.record_start=1", "linear.out_control.record_steps=4",
                 "linear.out_control.multiple=16"]  # fmt: skip
    full, full_trainer = run_training(flags, overrides, store, reporter=SilentReporter())
    cut, _ = run_training(flags, overrides, store, reporter=_StopAt(6))
    assert cut.status == "interrupted"
    resumed, trainer = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert resumed.status == "finished"

    def losses(run_id):
        return [(m["step"], m["value"]) for m in store.metrics(run_id, "train_loss")]

    assert losses(resumed.run_id) == losses(full.run_id)
    for name, tensor in full_trainer.model.state_dict().items():
        assert torch.equal(trainer.model.state_dict()[name], tensor), name


def test_fp4_train_on_the_cpu_and_resume(tmp_path):
    """The command line: recorded over steps 3-5 (record_start 2), chosen after step 5; a run
    of 5 steps (it ends mid-recording) extended to 10 gives the losses of one run of 10 (a
    constant learning rate: the schedule does not depend on the steps asked for)."""
    store = str(tmp_path / "fp4.db")
    common = ["--store", store, "--quiet"]
    recipe = ["--task", "regression", "--size", "debug", "--device", "cpu", "--set", "log_every=1",
              "--recipe", "tetrajet-v2-outcontrol", "--set", "linear.out_control.record_start=2",
              "--set", "linear.out_control.record_steps=3",
              "--set", "linear.out_control.multiple=16",
              "--set", "warmup_steps=0", "--set", "min_lr_ratio=1"]  # fmt: skip
    runner = CliRunner()
    whole = runner.invoke(app, ["train", *recipe, "--steps", "10", *common])
    first = runner.invoke(app, ["train", *recipe, "--steps", "5", *common])
    assert whole.exit_code == 0 and first.exit_code == 0, whole.output + first.output
    runs = RunStore(tmp_path / "fp4.db")
    first_id, whole_id = (run["id"] for run in runs.list_runs())  # newest first
    resumed = runner.invoke(app, ["train", "--resume", first_id, "--steps", "10", *common])
    assert resumed.exit_code == 0, resumed.output

    def losses(run_id):
        return [(m["step"], m["value"]) for m in runs.metrics(run_id, "train_loss")]

    assert len(losses(first_id)) == 10 and losses(first_id) == losses(whole_id)
    checkpoint = torch.load(runs.latest_checkpoint(first_id)["path"], weights_only=True)
    assert any(name.endswith("channel_norms") for name in checkpoint["model"])
    shown = runner.invoke(app, ["recipes", "show", "tetrajet-v2-outcontrol"])
    assert shown.exit_code == 0 and "record_start: 501" in shown.output
    bad = runner.invoke(app, ["train", *recipe, "--set", "linear.out_control.ratio=2", *common])
    assert bad.exit_code != 0 and len(bad.output.strip().splitlines()) == 1
    assert "linear.out_control.ratio: must be in (0, 1]" in bad.output
