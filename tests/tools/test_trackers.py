"""Trackers: TensorBoard event files (streamed, or exported from the store) read back with
tensorboard's own reader to the values the store holds; W&B's calls (a fake wandb module); a
missing tracker package or a bad name is one line."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.sweep import SweepError, expand_points, parse_sweep
from fp4cli.track.tensorboard import quant_tag
from fp4cli.train import ConfigError, run_training
from fp4cli.train.progress import SilentReporter

FLAGS = {"task": "regression", "size": "debug", "device": "cpu", "steps": 4, "log_every": 1,
         "stats_every": 2, "eval_every": 2, "checkpoints": False}  # fmt: skip


def _events(folder):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def _assert_events_hold_the_store(store, run_id, folder):
    events = _events(folder)
    tags = set(events.Tags()["scalars"])
    metrics = store.metrics(run_id)
    stats = store.quant_stats(run_id)
    assert stats and {r["name"] for r in metrics} >= {"train_loss", "val_loss", "lr"}
    expected = {(r["name"], r["step"]): r["value"] for r in metrics}
    expected |= {(quant_tag(r["layer"], r["operand"], r["metric"]), r["step"]): r["value"]
                 for r in stats}  # fmt: skip
    assert tags == {tag for tag, _ in expected}
    found = {(tag, e.step): e.value for tag in tags for e in events.Scalars(tag)}
    assert sum(len(events.Scalars(tag)) for tag in tags) == len(found)  # one event a step
    assert found.keys() == expected.keys()
    for key, value in expected.items():  # event files keep float32
        assert np.float32(value) == np.float32(found[key]) or (
            np.isnan(value) and np.isnan(found[key])
        ), key
    hparams = events.PluginTagToContent("hparams")
    assert "_hparams_/session_start_info" in hparams
    assert "train.lr" in hparams["_hparams_/session_start_info"].decode(errors="replace")


def test_streamed_tensorboard_events_read_back_to_the_stored_values(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    flags = FLAGS | {"log_to": ("tensorboard",)}
    result, _ = run_training(flags, [], store, reporter=SilentReporter())
    assert result.status == "finished"
    assert store.get_run(result.run_id)["config"]["train"]["log_to"] == ["tensorboard"]
    _assert_events_hold_the_store(store, result.run_id, tmp_path / "tensorboard" / result.run_id)


def test_a_resumed_run_hides_the_events_its_earlier_attempt_wrote_after_the_checkpoint(tmp_path):
    from fp4cli.track import tracked

    store = RunStore(tmp_path / "fp4.db")
    flags = FLAGS | {"steps": 2, "checkpoints": True, "log_to": ("tensorboard",)}
    first, _ = run_training(flags, [], store, reporter=SilentReporter())
    attempt = tracked(store, ["tensorboard"])  # went on to step 3, then died
    attempt.reopen_run(first.run_id, 2)
    attempt.log_metrics(first.run_id, 3, {"train_loss": 99.0})
    attempt.finish_run(first.run_id, "interrupted")
    resumed, _ = run_training({"steps": 4}, [], store, resume=first.run_id)
    assert resumed.status == "finished"
    _assert_events_hold_the_store(store, first.run_id, tmp_path / "tensorboard" / first.run_id)


def test_export_writes_the_events_of_a_stored_run(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    result, _ = run_training(FLAGS, [], store, reporter=SilentReporter())
    out = tmp_path / "tb"
    runner = CliRunner()
    for _ in range(2):  # a second export replaces the first's event files
        exported = runner.invoke(
            app, ["runs", "export", result.run_id[:-2], "--tensorboard", str(out),
                  "--store", str(store.path)],
        )  # fmt: skip
        assert exported.exit_code == 0, exported.output
    folder = out / result.run_id
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1
    _assert_events_hold_the_store(store, result.run_id, folder)
    unknown = runner.invoke(app, ["runs", "export", "r-nope", "--tensorboard", str(out),
                                  "--store", str(store.path)])  # fmt: skip
    assert unknown.exit_code == 2 and "unknown run 'r-nope'" in unknown.output


class _FakeRun:
    def __init__(self, calls):
        self.calls, self.summary = calls, {}

    def log(self, values, step):
        self.calls.append(("log", step, dict(values)))

    def finish(self, exit_code):
        self.calls.append(("finish", exit_code, dict(self.summary)))


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    module = types.ModuleType("wandb")

    def init(**kwargs):
        calls.append(("init", kwargs))
        return _FakeRun(calls)

    module.init = init
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("NETRC", "/nonexistent/netrc")
    return calls


def test_wandb_gets_the_config_metrics_and_statistics_offline(tmp_path, fake_wandb):
    store = RunStore(tmp_path / "fp4.db")
    result, _ = run_training(FLAGS | {"log_to": "wandb"}, [], store, reporter=SilentReporter())
    (kind, init), *logs, finish = fake_wandb
    run = store.get_run(result.run_id)
    assert kind == "init" and init["id"] == run["id"] and init["mode"] == "offline"
    assert init["config"] == run["config"] and init["project"] == "fp4cli"
    assert init["dir"] == str(tmp_path.resolve())
    assert finish == ("finish", 0, {"status": "finished"})
    logged = {(name, step): value for _, step, values in logs for name, value in values.items()}
    stored = {(r["name"], r["step"]): r["value"] for r in store.metrics(run["id"])}
    stored |= {(quant_tag(r["layer"], r["operand"], r["metric"]), r["step"]): r["value"]
               for r in store.quant_stats(run["id"])}  # fmt: skip
    assert logged == stored


def test_wandb_is_left_to_its_own_settings_when_configured(tmp_path, fake_wandb, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_PROJECT", "fp4-lab")
    run_training(FLAGS | {"steps": 1, "log_to": ("wandb",)}, [], RunStore(tmp_path / "s.db"))
    init = fake_wandb[0][1]
    assert init["mode"] is None and init["project"] == "fp4-lab"


def test_a_wandb_login_counts_as_configured(tmp_path, fake_wandb, monkeypatch):
    from fp4cli.track.wandb import wandb_mode

    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org\n  login a\n  password b\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert wandb_mode() == "offline"
    netrc.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    assert wandb_mode() is None


def test_a_missing_tracker_is_one_line_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    db = str(tmp_path / "s.db")
    result = CliRunner().invoke(
        app, ["train", "--size", "debug", "--device", "cpu", "--log-to", "tensorboard,wandb",
              "--store", db],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "wandb needs the wandb package" in result.output and "fp4cli[wandb]" in result.output
    assert RunStore(db).list_runs() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("mlflow", "unknown tracker 'mlflow'; known: tensorboard, wandb"),
        ("tensorboard,tensorboard", "names a tracker twice"),
        (3, "must be tracker names"),
    ],
)
def test_bad_tracker_names(value, message):
    from fp4cli.train import TrainConfig

    with pytest.raises(ConfigError, match=message):
        TrainConfig(log_to=value)


def test_a_sweep_names_its_trackers_at_the_top_without_changing_its_points(tmp_path):
    raw = {"name": "t", "tasks": ["regression"], "baselines": [],
           "train": {k: v for k, v in FLAGS.items() if k not in ("task",)}}  # fmt: skip
    plain = parse_sweep(raw, "t.yaml")
    tracked = parse_sweep(raw | {"log_to": ["tensorboard"]}, "t.yaml")
    assert tracked.log_to == ("tensorboard",)
    assert [p.id for p in expand_points(plain)] == [p.id for p in expand_points(tracked)]
    with pytest.raises(SweepError, match="train.log_to: trackers are a top-level key"):
        parse_sweep(raw | {"train": {"log_to": ["tensorboard"]}}, "t.yaml")
    with pytest.raises(SweepError, match="t.yaml: log_to: unknown tracker 'tb'"):
        parse_sweep(raw | {"log_to": "tb"}, "t.yaml")
    from fp4cli.sweep import plan_sweep, run_sweep

    store = RunStore(tmp_path / "s.db")
    (result,) = run_sweep(plan_sweep(tracked, store), store)
    assert (tmp_path / "tensorboard" / result.run_id).is_dir()
