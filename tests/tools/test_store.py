"""The run store: its API, its schema migrations, killed and concurrent writers, `fp4 runs`."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from sqlite_utils import Database
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import SCHEMA_VERSION, RunStore, StoreError
from fp4cli.store.schema import MIGRATIONS
from tests.run_ids import unique_prefix

VERSIONS = {"torch": "2.9.0", "triton": "3.5.0", "python": "3.11.7"}
runner = CliRunner()
WIDE = {"COLUMNS": "200"}


@pytest.fixture
def store(tmp_path: Path) -> RunStore:
    return RunStore(tmp_path / "fp4.db")


def new_run(store: RunStore, **fields: Any) -> str:
    args: dict[str, Any] = {
        "task": "regression", "recipe": "bf16", "seed": 0, "config": {"lr": 1e-3},
        "device": "cpu", "versions": VERSIONS, **fields,
    }  # fmt: skip
    return store.create_run(**args)


def ago(minutes: float) -> str:
    return (datetime.now(timezone.utc) - timedelta(minutes=minutes)).isoformat()


# The API.


def test_create_run_records_the_process_and_its_setup(store: RunStore) -> None:
    run_id = new_run(store, tags=("fp4", "ablation"), sweep="s1", name="first")
    run = store.get_run(run_id)
    assert run_id.startswith("r-") and len(run_id) == len("r-20261122-103012-ab12")
    assert run["status"] == "running" and run["pid"] == os.getpid()
    assert run["host"] == socket.gethostname() and run["ended_at"] is None
    assert run["config"] == {"lr": 1e-3} and run["tags"] == ["fp4", "ablation"]
    assert (run["torch_version"], run["triton_version"]) == ("2.9.0", "3.5.0")
    assert run["versions"] == VERSIONS and run["sweep"] == "s1" and run["name"] == "first"
    assert (run["world_size"], run["parallel"]) == (1, "none")
    revision = run["git_revision"]
    assert revision is None or len(revision.removesuffix("-dirty")) == 40
    pragmas = [store.db.conn.execute(f"PRAGMA {p}").fetchone()[0] for p in
               ("journal_mode", "user_version", "busy_timeout")]  # fmt: skip
    assert pragmas == ["wal", SCHEMA_VERSION, 30_000]


def test_metrics_final_values_and_nan(store: RunStore) -> None:
    run_id = new_run(store)
    store.log_metrics(run_id, 10, {"train_loss": 2.0, "lr": 1e-3})
    store.log_metrics(run_id, 20, {"train_loss": 1.5, "val_loss": float("nan")})
    store.log_metrics(run_id, 20, {"train_loss": 1.25})  # the same step again: the later wins
    store.log_metrics(run_id, 5, {"val_loss": 3.0})
    rows = store.metrics(run_id, "train_loss")  # one row per run, step and name
    assert [(r["step"], r["value"]) for r in rows] == [(10, 2.0), (20, 1.25)]
    final = store.final_metrics(run_id)
    assert set(final) == {"lr", "train_loss", "val_loss"} and final["train_loss"] == 1.25
    assert math.isnan(final["val_loss"])  # SQLite keeps a NaN as NULL; it reads back as NaN
    assert store.final_metrics(run_id, ["lr", "top1"]) == {"lr": 1e-3}
    assert store.get_run(run_id)["step"] == 20  # the last step reached, not the last logged


def test_quant_stats_checkpoints_heartbeat_finish(store: RunStore) -> None:
    run_id = new_run(store)
    assert store.quant_stats_summary(run_id) is None and store.latest_checkpoint(run_id) is None
    store.log_quant_stats(run_id, 10, [("fc1", "x", "sqnr", 20.0)])
    rows = [("fc1", "x", "sqnr", 22.0), ("fc2", "x", "sqnr", 18.0), ("fc1", "w", "clip", 0.5)]
    store.log_quant_stats(run_id, 20, rows)
    assert len(store.quant_stats(run_id)) == 4
    assert [r["layer"] for r in store.quant_stats(run_id, step=20, operand="x")] == ["fc1", "fc2"]
    summary = store.quant_stats_summary(run_id)
    assert summary is not None and summary["step"] == 20
    assert summary["rows"] == [
        {"operand": "w", "metric": "clip", "layers": 1, "mean": 0.5, "min": 0.5, "max": 0.5},
        {"operand": "x", "metric": "sqnr", "layers": 2, "mean": 20.0, "min": 18.0, "max": 22.0},
    ]
    store.add_checkpoint(run_id, 20, "ckpt/20.pt")
    store.add_checkpoint(run_id, 10, Path("ckpt/10.pt"))
    assert [c["step"] for c in store.checkpoints(run_id)] == [10, 20]
    assert store.latest_checkpoint(run_id)["path"] == "ckpt/20.pt"  # type: ignore[index]
    store.heartbeat(run_id, 25)
    assert store.get_run(run_id)["step"] == 25
    store.finish_run(run_id, "diverged", step=27, diverged_step=27, message="loss became nan")
    run = store.get_run(run_id)
    assert (run["status"], run["step"], run["diverged_step"]) == ("diverged", 27, 27)
    assert run["message"] == "loss became nan" and run["ended_at"] >= run["started_at"]
    with pytest.raises(StoreError, match="cannot end as 'running'"):
        store.finish_run(run_id, "running")


def test_unknown_runs_and_id_prefixes(store: RunStore) -> None:
    first, second = new_run(store), new_run(store)
    for write in (
        lambda: store.log_metrics("r-nope", 1, {"loss": 1.0}),
        lambda: store.log_quant_stats("r-nope", 1, [("fc", "x", "sqnr", 1.0)]),
        lambda: store.add_checkpoint("r-nope", 1, "x.pt"),
        lambda: store.heartbeat("r-nope", 1),
        lambda: store.finish_run("r-nope", "failed"),
        lambda: store.get_run("r-nope"),
    ):
        with pytest.raises(StoreError, match="unknown run 'r-nope'"):
            write()
    assert store.metrics("r-nope") == []  # nothing half-written
    for old, new in ((first, "r-aaa1"), (second, "r-aab2")):
        store.db.execute("UPDATE runs SET id = ? WHERE id = ?", [new, old])
    assert store.get_run("r-aaa")["id"] == "r-aaa1" and store.get_run("r-aab2")["id"] == "r-aab2"
    with pytest.raises(StoreError, match="ambiguous: r-aaa1, r-aab2"):
        store.get_run("r-aa")


def test_list_runs_filters_newest_first(store: RunStore) -> None:
    a = new_run(store, task="gpt", recipe="bf16", tags=["base"])
    b = new_run(store, task="gpt", recipe="mxfp4", sweep="s1")
    c = new_run(store, task="vit", recipe="mxfp4", sweep="s1", tags=["base", "x"])
    store.finish_run(a, "finished")
    ids = lambda **f: [run["id"] for run in store.list_runs(**f)]  # noqa: E731
    assert ids() == [c, b, a] and ids(limit=2) == [c, b]
    assert ids(task="gpt") == [b, a] and ids(recipe="mxfp4", sweep="s1") == [c, b]
    assert ids(status="finished") == [a] and ids(tag="base") == [c, a] and ids(tag="y") == []
    with pytest.raises(StoreError, match="unknown status"):
        store.list_runs(status="done")


def test_delete_run_removes_its_rows(store: RunStore) -> None:
    keep, gone = new_run(store), new_run(store)
    for run_id in (keep, gone):
        store.log_metrics(run_id, 1, {"loss": 1.0})
        store.log_quant_stats(run_id, 1, [("fc", "x", "sqnr", 1.0)])
        store.add_checkpoint(run_id, 1, "x.pt")
    assert store.delete_run(gone) == gone
    assert [r["id"] for r in store.list_runs()] == [keep]
    for table in ("metrics", "quant_stats", "checkpoints"):
        assert [r["run_id"] for r in store.db.query(f"SELECT run_id FROM {table}")] == [keep]


def test_reopen_run_drops_rows_after_the_resumed_step(store: RunStore) -> None:
    run_id = new_run(store)
    for step in (10, 20, 30):
        store.log_metrics(run_id, step, {"loss": 1.0})
    store.add_checkpoint(run_id, 20, "20.pt")
    store.finish_run(run_id, "interrupted", message="stopped")
    store.reopen_run(run_id, 20)
    run = store.get_run(run_id)
    assert (run["status"], run["step"], run["ended_at"], run["message"]) == (
        "running", 20, None, None
    )  # fmt: skip
    assert [r["step"] for r in store.metrics(run_id)] == [10, 20]


def test_benchmarks_and_sweeps(store: RunStore) -> None:
    config = {"m": 4096, "n": 4096, "k": 4096}
    first = store.log_benchmark("gemm", "H100", VERSIONS, config, "tflops", 812.5, "TFLOP/s")
    store.log_benchmark("quantize", "H100", {"torch": "2.9.0"}, {}, "gbps", 2900.0, "GB/s")
    gemm = store.benchmarks("gemm")
    assert [b["id"] for b in gemm] == [first] and gemm[0]["config"] == config
    assert (gemm[0]["value"], gemm[0]["unit"], gemm[0]["triton_version"]) == (
        812.5, "TFLOP/s", "3.5.0"
    )  # fmt: skip
    assert len(store.benchmarks()) == 2
    sweep = store.create_sweep("scales", {"recipe": ["mxfp4", "nvfp4"]})
    assert store.sweeps()[0]["id"] == sweep and store.sweeps()[0]["spec"]["recipe"][1] == "nvfp4"


# The file: where it is, its schema, a bad file.


def test_default_path_env_then_runs_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FP4_STORE", raising=False)
    assert RunStore().path == Path("runs/fp4.db") and (tmp_path / "runs/fp4.db").exists()
    monkeypatch.setenv("FP4_STORE", str(tmp_path / "deep/er/x.db"))
    assert RunStore().path == tmp_path / "deep/er/x.db" and (tmp_path / "deep/er/x.db").exists()
    with pytest.raises(StoreError, match="no run store at"):
        RunStore(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()


def test_an_old_file_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    db = Database(path)
    MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.table("runs").insert(
        {"id": "r-old", "task": "gpt", "recipe": "bf16", "status": "finished", "config": "{}",
         "tags": "[]", "versions": "{}", "started_at": ago(60)}
    )  # fmt: skip
    db.close()
    with RunStore(path) as store:
        run = store.get_run("r-old")
        assert (run["world_size"], run["parallel"]) == (1, "none")
        assert store.db.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        new_run(store, world_size=8, parallel="fsdp2")
        assert store.list_runs()[0]["world_size"] == 8


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"not a database, " * 300, "file is not a database"),
        (os.urandom(8192), "file is not a database"),
    ],
)
def test_corrupt_file_is_one_line_store_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.db"
    path.write_bytes(content)
    with pytest.raises(StoreError) as error:
        RunStore(path)
    assert str(path) in str(error.value) and message in str(error.value)
    assert "\n" not in str(error.value)


def test_foreign_or_newer_databases_are_refused(tmp_path: Path) -> None:
    foreign = Database(tmp_path / "other.db")
    foreign.table("things").insert({"a": 1})
    foreign.close()
    with pytest.raises(StoreError, match="not a run store"):
        RunStore(tmp_path / "other.db")
    RunStore(tmp_path / "new.db").db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer than this fp4cli"):
        RunStore(tmp_path / "new.db")


# Runs whose process is gone.


def test_dead_local_and_silent_remote_runs_are_interrupted(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "fp4.db")
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead, reused, alive, remote_silent, remote_live = (new_run(store) for _ in range(5))
    edits: dict[str, dict[str, Any]] = {
        dead: {"pid": int(done.stdout), "heartbeat_at": ago(0.5)},
        reused: {"started_at": ago(10_000), "heartbeat_at": ago(9_000)},  # our pid: reused
        remote_silent: {"host": "elsewhere", "heartbeat_at": ago(30)},
        remote_live: {"host": "elsewhere", "heartbeat_at": ago(1)},
    }
    for run_id, fields in edits.items():
        store.db.table("runs").update(run_id, fields)
    store.close()
    store = RunStore(tmp_path / "fp4.db")  # opening marks them
    status = {run["id"]: run["status"] for run in store.list_runs()}
    assert status == {dead: "interrupted", reused: "interrupted", alive: "running",
                      remote_silent: "interrupted", remote_live: "running"}  # fmt: skip
    run = store.get_run(dead)
    assert run["ended_at"] == run["heartbeat_at"] and "ended without finishing" in run["message"]
    assert "no heartbeat from elsewhere for 30 min" in store.get_run(remote_silent)["message"]
    assert store.mark_interrupted(stale_after=30) == [remote_live]


def test_a_live_run_marked_interrupted_runs_again_when_it_writes(store: RunStore) -> None:
    run_id = new_run(store)
    store.db.table("runs").update(run_id, {"status": "interrupted", "ended_at": ago(0)})
    store.log_metrics(run_id, 3, {"loss": 1.0})
    run = store.get_run(run_id)
    assert (run["status"], run["ended_at"], run["step"]) == ("running", None, 3)


WRITER = """
import sys
from fp4cli.store import RunStore
store = RunStore(sys.argv[1])
run_id = store.create_run("regression", "bf16", 0, {"lr": 0.001}, "cpu", {"torch": "x"})
print(run_id, flush=True)
step = 0
while True:
    store.log_metrics(run_id, step, {"loss": 1.0 / (step + 1), "grad_norm": 1.0})
    store.log_quant_stats(run_id, step, [("fc", "x", "sqnr", 20.0), ("fc", "w", "sqnr", 25.0)])
    if step == 100:
        print("ready", flush=True)
    step += 1
"""


def test_sigkilled_writer_leaves_a_readable_store_and_an_interrupted_run(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        run_id = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert proc.stdout.readline() == "ready\n", "the writer died"  # type: ignore[union-attr]
        proc.send_signal(signal.SIGKILL)  # in the middle of its stream of transactions
        if sys.platform == "linux":  # left a zombie: its pid still answers os.kill(pid, 0)
            os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
        else:
            proc.wait(10)
        with RunStore(path) as store:
            assert store.db.conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            run = store.get_run(run_id)
            assert run["status"] == "interrupted" and run["step"] >= 100
            steps = [r["step"] for r in store.metrics(run_id, "loss")]
            assert steps == list(range(run["step"] + 1))  # every step up to the last, no gap
            assert len(store.metrics(run_id)) == 2 * len(steps)  # no half-written step
            stats = [r["step"] for r in store.quant_stats(run_id)]  # written after the metrics
            assert stats == [s for s in range(len(stats) // 2) for _ in "xw"]
            assert len(stats) // 2 in (len(steps), len(steps) - 1)
    finally:
        proc.kill()
        proc.wait(10)


def _concurrent_writer(path: str, worker: int, start: Any) -> None:
    start.wait()  # all four open the fresh file at once: WAL set-up and migration race too
    store = RunStore(path)
    runs = [new_run(store, seed=worker * 10 + i) for i in range(2)]
    for step in range(100):
        for run_id in runs:
            store.log_metrics(run_id, step, {"loss": float(step)})
    for run_id in runs:
        store.finish_run(run_id, "finished", step=99)


def _concurrent_reader(path: str, start: Any) -> None:
    """Reads while the writers write: every read sees whole rows, none fails."""
    start.wait()
    for _ in range(60):
        with RunStore(path) as store:
            for run in store.list_runs():
                values = [r["value"] for r in store.metrics(run["id"])]
                assert values == list(map(float, range(len(values))))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = str(tmp_path / "fp4.db")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(5)
    workers = [
        context.Process(target=_concurrent_writer, args=(path, worker, start))
        for worker in range(4)
    ]
    workers.append(context.Process(target=_concurrent_reader, args=(path, start)))
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
    assert [process.exitcode for process in workers] == [0] * 5  # no "database is locked"
    with RunStore(path) as store:
        runs = store.list_runs()
        assert sorted(run["seed"] for run in runs) == [0, 1, 10, 11, 20, 21, 30, 31]
        assert {run["status"] for run in runs} == {"finished"}
        for run in runs:
            assert [r["value"] for r in store.metrics(run["id"])] == list(map(float, range(100)))


# `fp4 runs`.


def filled_store(path: Path) -> tuple[str, str]:
    with RunStore(path) as store:
        gpt = new_run(store, task="gpt", recipe="mxfp4", config={"train": {"lr": 3e-4}})
        store.log_metrics(gpt, 100, {"train_loss": 3.1, "val_loss": 3.25})
        store.log_quant_stats(
            gpt, 100, [("h.0.fc", "x", "sqnr", 21.5), ("h.1.fc", "x", "sqnr", 19.5)]
        )
        store.add_checkpoint(gpt, 100, "runs/checkpoints/step100.pt")
        store.finish_run(gpt, "finished", step=100)
        vit = new_run(store, task="vit", recipe="bf16", seed=3)
        store.log_metrics(vit, 50, {"top1": 0.625, "val_loss": float("nan")})
    return gpt, vit


def test_runs_list(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = runner.invoke(app, ["runs", "list", "--store", str(path)])
    assert result.exit_code == 2 and result.stderr == f"error: no run store at {path}\n"
    assert not path.exists()  # listing creates nothing
    RunStore(path).close()
    result = runner.invoke(app, ["runs", "list", "--store", str(path)])
    assert result.exit_code == 0 and result.stdout == f"no runs in {path}\n"
    gpt, vit = filled_store(path)
    result = runner.invoke(app, ["runs", "list", "--store", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    for text in (gpt, vit, "val_loss", "top1", "3.25", "0.62%", "finished", "running", "nan"):
        assert text in result.stdout
    assert result.stdout.index(vit) < result.stdout.index(gpt)  # newest first
    lines = result.stdout.splitlines()  # not a terminal: tab-separated, one run a line
    assert lines[0].split("\t")[:6] == ["id", "task", "recipe", "seed", "status", "step"]
    assert [line.split("\t")[0] for line in lines[1:]] == [vit, gpt]
    for width in ("80", "200"):  # on a terminal: a table whose ids and statuses are whole
        env = {"COLUMNS": width, "FORCE_COLOR": "1"}
        shown = runner.invoke(app, ["runs", "list", "--store", str(path)], env=env).stdout
        plain = re.sub(r"\x1b\[[0-9;]*m", "", shown)
        assert gpt in plain and vit in plain and "finished" in plain and "running" in plain
        assert max(map(len, plain.splitlines())) <= int(width)
    result = runner.invoke(
        app, ["runs", "list", "--task", "vit", "--json"], env={"FP4_STORE": str(path)}
    )
    runs = json.loads(result.stdout)
    assert [run["id"] for run in runs] == [vit]
    assert runs[0]["final_metrics"] == {"top1": 0.625, "val_loss": None}  # strict JSON
    result = runner.invoke(app, ["runs", "list", "--status", "failed", "--store", str(path)])
    assert result.stdout == f"no runs in {path} match these filters\n"


def test_runs_show(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    gpt, vit = filled_store(path)
    prefix = unique_prefix(gpt, [vit], drop=1)
    result = runner.invoke(app, ["runs", "show", prefix, "--store", str(path)], env=WIDE)
    assert result.exit_code == 0, result.output
    shown = (gpt, "mxfp4", "lr: 0.0003", "val_loss", "3.25", "sqnr", "20.5")
    for text in (*shown, "1 checkpoint no longer on disk (step 100)"):
        assert text in result.stdout, text
    result = runner.invoke(app, ["runs", "show", gpt, "--store", str(path), "--json"])
    shown = json.loads(result.stdout)
    assert shown["config"] == {"train": {"lr": 3e-4}} and shown["final_metrics"]["val_loss"] == 3.25
    assert shown["checkpoints"][0]["step"] == 100 and shown["quant_stats"]["rows"][0]["layers"] == 2


def test_runs_delete(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    gpt, vit = filled_store(path)
    result = runner.invoke(app, ["runs", "delete", gpt, "--store", str(path)], input="n\n")
    assert result.exit_code == 1 and "Delete run" in result.output
    result = runner.invoke(app, ["runs", "delete", gpt, "--store", str(path), "--yes"])
    assert result.exit_code == 0 and result.stdout == f"deleted run {gpt}\n"
    assert [run["id"] for run in RunStore(path).list_runs()] == [vit]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["runs", "show", "r-nope"], "unknown run 'r-nope'"),
        (["runs", "delete", "r-nope", "--yes"], "unknown run 'r-nope'"),
        (["runs", "list", "--status", "done"], "unknown status 'done'"),
        (["runs", "show", "r-", "--store", "{corrupt}"], "file is not a database"),
        (["runs", "list", "--store", "{corrupt}"], "file is not a database"),
        (["runs", "show", "r-1", "--store", "{missing}"], "no run store at"),
    ],
)
def test_runs_errors_are_one_line_exit_2(tmp_path: Path, args: list[str], fragment: str) -> None:
    path = tmp_path / "fp4.db"
    filled_store(path)
    (tmp_path / "corrupt.db").write_bytes(os.urandom(4096))
    places = {"{corrupt}": str(tmp_path / "corrupt.db"), "{missing}": str(tmp_path / "no.db")}
    args = [places.get(arg, arg) for arg in args]
    result = runner.invoke(app, args, env={"FP4_STORE": str(path)})
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr


def test_opening_retries_while_the_file_is_locked() -> None:
    """Switching a fresh file to WAL can fail at once with "database is locked" when several
    processes open it together; opening tries again, and gives up on any other error."""
    import sqlite3

    from fp4cli.store.schema import _retry_while_locked

    calls = []

    def locked_twice() -> None:
        calls.append(1)
        if len(calls) < 3:
            raise sqlite3.OperationalError("database is locked")

    _retry_while_locked(locked_twice)
    assert len(calls) == 3

    def broken() -> None:
        calls.append(1)
        raise sqlite3.OperationalError("no such table: runs")

    calls.clear()
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        _retry_while_locked(broken)
    assert len(calls) == 1
