"""One writer per run and per sweep: resuming a run a live process trains, or running a sweep a
live coordinator holds, is a one-line error; a holder that is gone is taken over; no metric or
statistic is stored twice for one step."""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlite_utils import Database

from fp4cli.store import RunStore, StoreError
from fp4cli.store.schema import MIGRATIONS, SCHEMA_VERSION
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter


def _ago(minutes: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(minutes=minutes)).isoformat()


@pytest.fixture
def live_process():
    """A live process of this host other than this one: a run or sweep 'held' by it."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


def _finished_run(store: RunStore) -> str:
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 2,
             "checkpoint_every": 1}  # fmt: skip
    result, _ = run_training(flags, [], store, reporter=SilentReporter())
    return result.run_id


def test_resuming_a_run_a_live_process_trains_is_refused(tmp_path, live_process):
    store = RunStore(tmp_path / "fp4.db")
    run_id = _finished_run(store)
    store.db.table("runs").update(
        run_id, {"status": "running", "pid": live_process.pid, "heartbeat_at": _ago(0)}
    )
    with pytest.raises(StoreError, match=f"is being trained by process {live_process.pid}") as e:
        run_training({"steps": 3}, [], store, resume=run_id, reporter=SilentReporter())
    assert "\n" not in str(e.value)
    live_process.kill()
    live_process.wait()
    store = RunStore(tmp_path / "fp4.db")  # opening marks the run interrupted
    assert store.get_run(run_id)["status"] == "interrupted"
    resumed, _ = run_training({"steps": 3}, [], store, resume=run_id, reporter=SilentReporter())
    assert resumed.status == "finished"


def test_a_run_on_another_host_with_a_fresh_heartbeat_is_live(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    run_id = _finished_run(store)
    store.db.table("runs").update(
        run_id, {"status": "running", "host": "elsewhere", "heartbeat_at": _ago(1)}
    )
    with pytest.raises(StoreError, match="on elsewhere"):
        store.reopen_run(run_id, 1)
    store.db.table("runs").update(run_id, {"heartbeat_at": _ago(60)})
    store.reopen_run(run_id, 1)  # a stale heartbeat: taken over
    assert store.get_run(run_id)["host"] == store.host


def test_a_step_is_stored_once(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    run_id = store.create_run("regression", "bf16", 0, {}, "cpu", {})
    store.log_metrics(run_id, 5, {"loss": 1.0})
    store.log_metrics(run_id, 5, {"loss": 2.0})
    store.log_quant_stats(run_id, 5, [("fc", "x", "snr_db", 10.0)])
    store.log_quant_stats(run_id, 5, [("fc", "x", "snr_db", 11.0)])
    assert [(m["step"], m["value"]) for m in store.metrics(run_id)] == [(5, 2.0)]
    assert [s["value"] for s in store.quant_stats(run_id)] == [11.0]


def test_migration_keeps_the_last_of_duplicate_rows(tmp_path):
    path = tmp_path / "v3.db"
    db = Database(path)
    for migration in MIGRATIONS[:3]:
        migration(db)
    db.execute("PRAGMA user_version = 3")
    db.table("runs").insert(
        {"id": "r-old", "task": "gpt", "recipe": "bf16", "status": "finished", "config": "{}",
         "tags": "[]", "versions": "{}", "started_at": _ago(60)}
    )  # fmt: skip
    for value in (1.0, 2.0, 3.0):
        db.table("metrics").insert({"run_id": "r-old", "step": 1, "name": "loss", "value": value})
    db.close()
    with RunStore(path) as store:
        assert store.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert [m["value"] for m in store.metrics("r-old")] == [3.0]


def test_a_sweep_has_one_coordinator(tmp_path, live_process):
    store = RunStore(tmp_path / "fp4.db")
    sweep_id = store.ensure_sweep("grid", {"name": "grid"})
    store.db.table("sweeps").update(
        sweep_id,
        {"holder_host": store.host, "holder_pid": live_process.pid, "holder_heartbeat": _ago(0)},
    )
    with pytest.raises(StoreError, match=f"sweep grid is being run by process {live_process.pid}"):
        store.claim_sweep(sweep_id)
    live_process.kill()
    live_process.wait()
    store.claim_sweep(sweep_id)  # its holder is gone: taken over
    store.claim_sweep(sweep_id)  # claiming again is a no-op for the holder
    store.release_sweep(sweep_id)
    row = store.db.table("sweeps").get(sweep_id)
    assert row["holder_pid"] is None


SWEEP = """
name: locked
base: mxfp4
tasks: [regression]
train: {size: debug, steps: 2, device: cpu, checkpoints: false}
baselines: []
axes:
  linear.forward.x.rounding: [rne, sr]
"""


def test_a_second_fp4_sweep_on_a_held_sweep_fails_in_one_line(tmp_path, live_process):
    from typer.testing import CliRunner

    from fp4cli.cli.main import app

    path, sweep_file = tmp_path / "fp4.db", tmp_path / "sweep.yaml"
    sweep_file.write_text(SWEEP)
    store = RunStore(path)
    sweep_id = store.ensure_sweep("locked", {"name": "locked"})
    store.db.table("sweeps").update(
        sweep_id,
        {"holder_host": store.host, "holder_pid": live_process.pid, "holder_heartbeat": _ago(0)},
    )
    store.close()
    result = CliRunner().invoke(app, ["sweep", str(sweep_file), "--store", str(path)])
    assert result.exit_code == 2 and "is being run by process" in result.output
    assert RunStore(path).list_runs() == []
    live_process.kill()
    live_process.wait()
    result = CliRunner().invoke(app, ["sweep", str(sweep_file), "--store", str(path), "--quiet"])
    assert result.exit_code == 0, result.output
    assert len(RunStore(path).list_runs()) == 2
    assert RunStore(path).db.table("sweeps").get(sweep_id)["holder_pid"] is None


def test_plan_records_nothing_on_a_dry_run(tmp_path: Path):
    from fp4cli.sweep import load_sweep, plan_sweep

    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(SWEEP)
    store = RunStore(tmp_path / "fp4.db")
    plan_sweep(load_sweep(sweep_file), store, record=False)
    assert store.sweeps() == []
