"""The run store under faults of its files: `fp4 runs merge` never puts an older copy of a run
over a newer one nor reads the store into itself; a store missing a table is refused and left
as it is; reading commands open the store read-only (a read-only file or mount reads); `runs
show` lists the checkpoints still on disk; a missing store or a path the system refuses is one
line."""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sqlite_utils import Database
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import SCHEMA_VERSION, RunStore, StoreError
from fp4cli.store.schema import MIGRATIONS, read_only_uri, tables_at
from fp4cli.store.shards import merge_shards

TABLES = ("runs", "metrics", "quant_stats", "checkpoints", "layers", "merged_shards")
LONG = "a" * 300  # one path component over the 255 bytes a file system allows
runner = CliRunner()


def _train(store: RunStore, run_id: str, steps: range, offset: float = 0.0) -> None:
    """What training writes for `steps`: metrics, a statistic and a checkpoint per step."""
    for step in steps:
        store.log_metrics(run_id, step, {"train_loss": 1.0 / step + offset})
        store.log_quant_stats(run_id, step, [("fc", "x", "sqnr", 20.0 + offset)])
        store.add_checkpoint(run_id, step, f"checkpoints/{run_id}/step-{step:08d}.pt")
    store.finish_run(run_id, "finished", step=steps[-1])


def _stored_run(path: Path, steps: int = 20) -> str:
    """A store at `path` with one finished run of `steps` steps; returns its id."""
    with RunStore(path) as store:
        run_id = store.create_run("regression", "bf16", 0, {}, "cpu", {})
        store.log_layers(run_id, [("fc", 64, 32, 32, True)])
        _train(store, run_id, range(1, steps + 1))
    return run_id


def _resume(path: Path, run_id: str, start: int, end: int, offset: float = 0.0) -> None:
    """`fp4 train --resume`: the run continues from `start` to `end` in the store at `path`."""
    with RunStore(path) as store:
        store.reopen_run(run_id, start)
        _train(store, run_id, range(start + 1, end + 1), offset)


def _dump(path: Path) -> dict[str, list[str]]:
    conn = sqlite3.connect(path)
    try:
        return {t: sorted(map(repr, conn.execute(f"SELECT * FROM {t}"))) for t in TABLES}
    finally:
        conn.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_error_line(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr
    assert fragment in result.stderr and "Traceback" not in result.output


# `fp4 runs merge`: an older copy never replaces a newer one.


def test_merging_an_older_copy_keeps_the_newer_run(tmp_path):
    main, shards = tmp_path / "main.db", tmp_path / "shards"
    run_id = _stored_run(main, steps=20)
    shards.mkdir()
    shutil.copyfile(main, shards / f"backup-{run_id}.db")  # a backup taken at step 20
    _resume(main, run_id, 20, 40)
    before = _dump(main)
    with RunStore(main) as store:
        result = merge_shards(store, shards)
        assert store.get_run(run_id)["step"] == 40
        assert len(store.metrics(run_id)) == 40
    assert result.merged == [] and [c.run_id for c in result.conflicts] == [run_id]
    assert "reached step 40, this one step 20" in result.conflicts[0].why
    assert _dump(main) == before  # nothing written, not even the ledger


def test_a_copy_holding_every_row_and_further_replaces_the_run(tmp_path):
    old, newer, shards = tmp_path / "old.db", tmp_path / "newer.db", tmp_path / "shards"
    run_id = _stored_run(newer, steps=20)
    shutil.copyfile(newer, old)
    _resume(newer, run_id, 20, 40)
    shards.mkdir()
    shutil.copyfile(newer, shards / f"backup-{run_id}.db")
    with RunStore(old) as store:
        assert merge_shards(store, shards).merged == [run_id]
        assert store.get_run(run_id)["step"] == 40 and len(store.metrics(run_id)) == 40


def test_the_same_copy_is_already_there_and_nothing_is_written(tmp_path):
    main, shards = tmp_path / "main.db", tmp_path / "shards"
    run_id = _stored_run(main)
    shards.mkdir()
    shutil.copyfile(main, shards / f"copy-{run_id}.db")
    before = _dump(main)
    with RunStore(main) as store:
        result = merge_shards(store, shards)
    assert result.present == [run_id] and result.merged == [] and not result.conflicts
    assert _dump(main) == before


def test_a_copy_that_went_another_way_is_a_conflict(tmp_path):
    """Both copies resumed from step 10 and trained on apart: neither holds the other."""
    main, shards = tmp_path / "main.db", tmp_path / "shards"
    run_id = _stored_run(main, steps=10)
    other = tmp_path / "other.db"
    shutil.copyfile(main, other)
    _resume(main, run_id, 10, 20)
    _resume(other, run_id, 10, 30, offset=1.0)  # further, but not the same rows
    shards.mkdir()
    shutil.copyfile(other, shards / f"other-{run_id}.db")
    before = _dump(main)
    with RunStore(main) as store:
        result = merge_shards(store, shards)
    assert [c.run_id for c in result.conflicts] == [run_id]
    assert "rows that this one lacks" in result.conflicts[0].why
    assert _dump(main) == before


def test_runs_merge_says_what_it_did_per_run_and_skips_the_store_itself(tmp_path):
    runs = tmp_path / "runs"
    main = runs / "fp4.db"
    run_id = _stored_run(main, steps=20)
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copyfile(main, shards / f"backup-{run_id}.db")
    shutil.copyfile(main, runs / f"copy-{run_id}.db")
    _resume(main, run_id, 20, 40)
    new_id = _stored_run(shards / "p1-new.db", steps=5)
    before = _dump(main)
    result = runner.invoke(app, ["runs", "merge", str(runs), "--store", str(main)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert "skipped fp4.db: it is the store merged into" in lines
    assert f"skipped {run_id} from copy-{run_id}.db, a conflict" in result.stdout
    assert _dump(main) == before  # the store never merged into itself, nor the older copy
    result = runner.invoke(app, ["runs", "merge", str(shards), "--store", str(main)])
    lines = result.stdout.splitlines()
    assert f"merged {new_id} from p1-new.db" in lines
    conflict = next(line for line in lines if line.startswith(f"skipped {run_id}"))
    assert "reached step 40, this one step 20" in conflict and "store's copy is kept" in conflict
    assert lines[-1].startswith("merged 1 run into") and "1 conflict" in lines[-1]
    again = runner.invoke(app, ["runs", "merge", str(shards), "--store", str(main)]).stdout
    assert f"{new_id} from p1-new.db: merged before" in again.splitlines()
    with RunStore(main, read_only=True) as store:
        assert store.get_run(run_id)["step"] == 40


# A store missing a table.


def _without_metrics(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "fp4.db"
    run_id = _stored_run(path, steps=3)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE metrics")
    conn.commit()
    conn.close()
    return path, run_id


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list"],
        ["runs", "show", "{run}"],
        ["runs", "delete", "{run}", "--yes"],
        ["runs", "merge", "{folder}"],
        ["report"],
        ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--steps", "2"],
    ],
    ids=" ".join,
)
def test_a_store_missing_a_table_is_refused_and_left_as_it_is(tmp_path, args):
    path, run_id = _without_metrics(tmp_path)
    digest = _digest(path)
    (tmp_path / "shards").mkdir()
    places = {"{run}": run_id, "{folder}": str(tmp_path / "shards")}
    args = [places.get(arg, arg) for arg in args]
    result = runner.invoke(app, [*args, "--store", str(path)])
    _one_error_line(result, f"run store {path} is damaged: its table metrics is missing")
    assert _digest(path) == digest
    assert "metrics" not in Database(path).table_names()


def test_the_tables_of_each_version_are_those_its_migrations_make(tmp_path):
    db = Database(tmp_path / "v.db")
    for version, migration in enumerate(MIGRATIONS, start=1):
        migration(db)
        assert sorted(db.table_names()) == sorted(tables_at(version)), version
    assert version == SCHEMA_VERSION


# Reading commands open the store read-only.


def test_a_read_only_store_writes_nothing(tmp_path):
    path = tmp_path / "fp4.db"
    run_id = _stored_run(path)
    digest = _digest(path)
    with RunStore(path, read_only=True) as store:
        assert store.get_run(run_id)["step"] == 20
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            store.db.conn.execute("CREATE TABLE x (a)")
        with pytest.raises(StoreError, match="open for reading only"):
            store.finish_run(run_id, "failed")
    for args in (
        ["runs", "list"],
        ["runs", "show", run_id],
        ["report"],
        ["runs", "list", "--json"],
    ):
        result = runner.invoke(app, [*args, "--store", str(path)])
        assert result.exit_code in (0, 2) and "Traceback" not in result.output, result.output
    assert _digest(path) == digest


def test_reading_commands_open_the_store_with_mode_ro(tmp_path, monkeypatch):
    path = tmp_path / "fp4.db"
    run_id = _stored_run(path)
    opened: list[str] = []
    real_connect = sqlite3.connect

    def recording_connect(database, *args, **kwargs):
        opened.append(str(database))
        return real_connect(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", recording_connect)
    for args in (["runs", "list"], ["runs", "show", run_id], ["report"]):
        opened.clear()
        runner.invoke(app, [*args, "--store", str(path)])
        assert opened and all(uri.startswith("file:") and "mode=ro" in uri for uri in opened)


def test_a_gone_run_reads_as_interrupted_but_is_not_marked(tmp_path):
    path = tmp_path / "fp4.db"
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with RunStore(path) as store:
        run_id = store.create_run("regression", "bf16", 0, {}, "cpu", {})
        store.db.table("runs").update(run_id, {"pid": int(done.stdout)})
    with RunStore(path, read_only=True) as store:
        assert store.get_run(run_id)["status"] == "interrupted"
        assert [run["id"] for run in store.list_runs(status="interrupted")] == [run_id]
        assert store.list_runs(status="running") == []
    assert Database(path).execute("SELECT status FROM runs").fetchone()[0] == "running"


def test_a_read_only_store_sees_what_a_live_writer_committed(tmp_path):
    path = tmp_path / "fp4.db"
    writer = RunStore(path)  # open: its rows are still in the -wal file
    run_id = writer.create_run("regression", "bf16", 0, {}, "cpu", {})
    writer.log_metrics(run_id, 1, {"loss": 2.0})
    with RunStore(path, read_only=True) as store:
        assert store.final_metrics(run_id) == {"loss": 2.0}
    writer.close()


def test_a_store_in_a_folder_that_cannot_be_written_is_read_immutable(tmp_path, monkeypatch):
    """A read-only mount: SQLite could create no -wal or -shm file there (root, who may write
    anywhere, is told so by os.access as on such a mount)."""
    folder = tmp_path / "ro"
    path = folder / "fp4.db"
    run_id = _stored_run(path)
    real_access = os.access

    def no_writes_in_folder(target, mode, *args, **kwargs):
        if mode & os.W_OK and Path(target).resolve() == folder.resolve():
            return False
        return real_access(target, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", no_writes_in_folder)
    assert read_only_uri(path).endswith("?mode=ro&immutable=1")
    result = runner.invoke(app, ["runs", "show", run_id, "--store", str(path)])
    assert result.exit_code == 0 and run_id in result.stdout, result.output
    result = runner.invoke(app, ["runs", "list", "--store", str(path)])
    assert result.exit_code == 0 and run_id in result.stdout, result.output
    assert sorted(p.name for p in folder.iterdir()) == ["fp4.db"]  # no -wal, no -shm


def _writes_read_only_files(folder: Path) -> bool:
    """Whether this process writes a file whose mode forbids it (root with CAP_DAC_OVERRIDE;
    run as `setpriv --bounding-set=-dac_override,-dac_read_search` it does not)."""
    probe = folder / "probe"
    probe.touch(mode=0o444)
    try:
        probe.open("a").close()
    except PermissionError:
        return False
    return True


def test_a_read_only_file_in_a_read_only_folder_reads(tmp_path):
    if _writes_read_only_files(tmp_path):
        pytest.skip("root writes read-only files")
    folder = tmp_path / "ro"
    path = folder / "fp4.db"
    run_id = _stored_run(path)
    path.chmod(0o444)
    folder.chmod(0o555)
    try:
        for args in (["runs", "list"], ["runs", "show", run_id], ["report", run_id]):
            result = runner.invoke(app, [*args, "--store", str(path)])
            assert "unable to open" not in result.output and "Traceback" not in result.output
            assert result.exit_code in (0, 2) and run_id in result.output, result.output
    finally:
        folder.chmod(0o755)
        path.chmod(0o644)


def test_an_old_store_is_read_without_migrating_it(tmp_path):
    path = tmp_path / "v1.db"
    db = Database(path)
    MIGRATIONS[0](db)
    db.execute("PRAGMA user_version = 1")
    db.table("runs").insert(
        {"id": "r-old", "task": "gpt", "recipe": "bf16", "status": "finished", "config": "{}",
         "tags": "[]", "versions": "{}", "started_at": "2026-01-01T00:00:00+00:00"}
    )  # fmt: skip
    db.close()
    digest = _digest(path)
    with RunStore(path, read_only=True) as store:
        assert store.get_run("r-old")["world_size"] == 1 and store.layers("r-old") == []
    result = runner.invoke(app, ["runs", "list", "--store", str(path)])
    assert result.exit_code == 0 and "r-old" in result.stdout
    assert _digest(path) == digest


# `fp4 runs show` and the checkpoints pruned from disk.


def test_runs_show_lists_the_checkpoints_still_on_disk(tmp_path):
    path = tmp_path / "fp4.db"
    run_id = _stored_run(path, steps=50)
    last = tmp_path / "checkpoints" / run_id / "step-00000050.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(b"weights")  # the older ones were pruned when the next was written
    result = runner.invoke(app, ["runs", "show", run_id, "--store", str(path)],
                           env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "step-00000050.pt" in result.stdout and "step-00000049.pt" not in result.stdout
    assert "49 checkpoints no longer on disk (steps 1 to 49)" in result.stdout
    result = runner.invoke(app, ["runs", "show", run_id, "--store", str(path), "--json"])
    import json

    checkpoints = json.loads(result.stdout)["checkpoints"]
    assert [c["step"] for c in checkpoints if c["on_disk"]] == [50] and len(checkpoints) == 50


# A store that is not there, a path the system refuses.


@pytest.mark.parametrize("extra", [[], ["--json"]])
def test_runs_list_without_a_store_says_so_and_creates_nothing(tmp_path, extra):
    path = tmp_path / "deeper" / "missing.db"
    result = runner.invoke(app, ["runs", "list", "--store", str(path), *extra])
    _one_error_line(result, f"no run store at {path}")
    assert not path.parent.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["runs", "list", "--store", f"{LONG}.db"],
        ["runs", "show", "r-1", "--store", f"{LONG}.db"],
        ["report", "--store", f"{LONG}.db"],
        ["runs", "merge", LONG, "--store", "{store}"],
        ["runs", "merge", "{folder}", "--store", f"{LONG}.db"],
    ],
    ids=lambda args: " ".join(a[:12] for a in args),
)
def test_a_path_the_system_refuses_is_one_line(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    places = {"{store}": str(tmp_path / "fp4.db"), "{folder}": str(tmp_path)}
    result = runner.invoke(app, [places.get(arg, arg) for arg in args])
    _one_error_line(result, "File name too long")
    assert "cannot use aaaa" in result.stderr and LONG not in result.stderr


@pytest.mark.parametrize("read_only", [False, True])
def test_the_store_turns_a_refused_path_into_a_store_error(tmp_path, read_only):
    with pytest.raises(StoreError, match=r"cannot use .+\.\.\.a+\.db: File name too long"):
        RunStore(tmp_path / f"{LONG}.db", read_only=read_only)
