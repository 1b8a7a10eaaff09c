"""Shards: store files that jobs on other machines write, claimed one writer per key, folded
into the main store idempotently; half-written ones wait."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys

from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.store.shards import claim, finished_shards, live_claims, merge_shards

TABLES = ("runs", "metrics", "quant_stats", "checkpoints", "layers")


def _shard(folder, key, status="finished", point=None, sweep=None, value=1.0):
    """A finished shard of one run with a row in every table; returns (path, run id)."""
    taken = claim(folder, key, job="test")
    assert taken is not None
    store = taken.open_store()
    tags = [f"point:{point}"] if point else []
    run_id = store.create_run("regression", "bf16", 0, {"train": {}}, "cpu", {}, tags, sweep)
    store.log_metrics(run_id, 1, {"train_loss": value, "val_loss": value / 2})
    store.log_quant_stats(run_id, 1, [("fc1", "forward_x", "snr_db", 9.5)])
    store.log_layers(run_id, [("fc1", 64, 32, 32, True)])
    store.add_checkpoint(run_id, 1, folder / "ckpt.pt")
    store.finish_run(run_id, status, step=1)
    store.close()
    return taken.complete(run_id), run_id


def _dump(path):
    conn = sqlite3.connect(path)
    try:
        return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}"))) for t in TABLES}
    finally:
        conn.close()


def test_a_shard_keeps_a_rollback_journal_and_the_main_store_wal(tmp_path):
    path, _ = _shard(tmp_path / "shards", "p1")
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    conn.close()
    main = RunStore(tmp_path / "main.db")
    assert main.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_merging_twice_changes_nothing(tmp_path):
    shards = tmp_path / "shards"
    _, first = _shard(shards, "p1", value=1.0)
    _, second = _shard(shards, "p2", status="failed", value=3.0)
    store = RunStore(tmp_path / "main.db")
    result = merge_shards(store, shards)
    assert sorted(result.merged) == sorted([first, second]) and not result.skipped
    assert store.get_run(first)["status"] == "finished"
    assert store.get_run(second)["status"] == "failed"
    assert store.final_metrics(first) == {"train_loss": 1.0, "val_loss": 0.5}
    assert store.quant_stats(first)[0]["value"] == 9.5 and store.layers(first)
    assert store.checkpoints(first)[0]["path"].endswith("ckpt.pt")
    before = _dump(store.path)
    again = merge_shards(store, shards)
    assert again.merged == [] and sorted(again.already) == sorted([first, second])
    assert _dump(store.path) == before
    store.delete_run(second)  # a sweep deletes a failed attempt: merging does not bring it back
    merge_shards(store, shards)
    assert [run["id"] for run in store.list_runs()] == [first]


def test_half_written_shards_are_skipped_and_picked_up_later(tmp_path):
    shards = tmp_path / "shards"
    done, run_id = _shard(shards, "p1")
    writing = claim(shards, "p2")  # a job still training its point: only a partial file
    writing.open_store().close()
    copied = shards / "p3-r-copied.db"  # a shard half copied onto the filesystem
    copied.write_bytes(done.read_bytes()[:2048])
    store = RunStore(tmp_path / "main.db")
    result = merge_shards(store, shards)
    assert result.merged == [run_id]
    assert [name for name, _ in result.skipped] == ["p3-r-copied.db"]
    assert "\n" not in result.skipped[0][1]
    shutil.copyfile(done, copied)  # the copy completes: a run merged before, nothing new
    assert merge_shards(store, shards).skipped == []
    writing.release()
    late, late_id = _shard(shards, "p2")
    assert merge_shards(store, shards).merged == [late_id]


def test_a_second_finished_run_of_a_point_is_recorded_not_inserted(tmp_path):
    store = RunStore(tmp_path / "main.db")
    sweep = store.ensure_sweep("grid", {})
    shards = tmp_path / "shards"
    _, first = _shard(shards, "a", point="abc", sweep=sweep)
    merge_shards(store, shards)
    _, second = _shard(shards, "b", point="abc", sweep=sweep)
    result = merge_shards(store, shards)
    assert result.duplicates == [second] and result.merged == []
    assert [run["id"] for run in store.list_runs(sweep=sweep)] == [first]
    assert merge_shards(store, shards).already == [first, second]


def test_one_live_claim_per_key_and_a_dead_holders_claim_is_taken_over(tmp_path):
    shards = tmp_path / "shards"
    taken = claim(shards, "p1", job="j1")
    assert taken is not None and claim(shards, "p1") is None  # this process holds it
    assert set(live_claims(shards)) == {"p1"}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    holder = json.loads(taken.claim_file.read_text()) | {"pid": int(dead.stdout)}
    taken.claim_file.write_text(json.dumps(holder))
    taken.partial.write_bytes(b"half a store")
    assert live_claims(shards) == {}
    again = claim(shards, "p1", job="j2")
    assert again is not None and not again.partial.exists()  # the dead writer's file is gone
    assert json.loads(again.claim_file.read_text())["job"] == "j2"
    assert finished_shards(shards) == []


def test_runs_merge_command(tmp_path):
    sweep_dir = tmp_path / "sweeps" / "grid"
    _, run_id = _shard(sweep_dir / "shards", "p1")
    db = str(tmp_path / "main.db")
    runner = CliRunner()
    first = runner.invoke(app, ["runs", "merge", str(sweep_dir), "--store", db])
    assert first.exit_code == 0, first.output
    assert "merged 1 run into" in first.output and "0 merged before" in first.output
    second = runner.invoke(app, ["runs", "merge", str(sweep_dir / "shards"), "--store", db])
    assert "merged 0 runs" in second.output and "1 merged before" in second.output
    assert RunStore(db).get_run(run_id)["status"] == "finished"
    missing = runner.invoke(app, ["runs", "merge", str(tmp_path / "nope"), "--store", db])
    assert missing.exit_code == 2 and "no such folder" in missing.output
