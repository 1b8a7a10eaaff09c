"""The store checks itself: a damaged file is refused in one line; a file removed or replaced
under a running process, or one that cannot be written, ends the run with one line, never with
"Stored in"."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore, StoreError
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter

FLAGS = {"task": "regression", "size": "debug", "device": "cpu", "steps": 6, "log_every": 1}


def _filled_store(path: Path) -> None:
    store = RunStore(path)
    for _ in range(3):
        run_id = store.create_run("regression", "bf16", 0, {"x": "y" * 2000}, "cpu", {})
        store.log_metrics(run_id, 1, {f"m{i}": float(i) for i in range(300)})
    store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()


def test_a_damaged_store_is_refused_in_one_line(tmp_path):
    path = tmp_path / "fp4.db"
    _filled_store(path)
    data = bytearray(path.read_bytes())
    page = 4096
    for number in range(1, len(data) // page):  # every b-tree page's header but the first
        data[number * page : number * page + 12] = b"\xff" * 12
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError) as error:
        RunStore(path)
    message = str(error.value)
    assert "\n" not in message and str(path) in message
    assert "damaged" in message or "cannot read run store" in message


class _RemoveStoreAt(SilentReporter):
    def __init__(self, path: Path, step: int, replace: bool = False) -> None:
        self.path, self.step, self.replace = path, step, replace

    def update(self, step, loss, samples_per_s):
        if step == self.step:
            self.path.unlink()
            if self.replace:
                RunStore(self.path).close()  # a new, empty store at the same path


@pytest.mark.parametrize("replace", [False, True])
def test_a_store_removed_mid_run_ends_the_run(tmp_path, replace):
    path = tmp_path / "fp4.db"
    store = RunStore(path)
    with pytest.raises(StoreError, match="was removed or replaced while this process used it"):
        run_training(FLAGS, [], store, reporter=_RemoveStoreAt(path, 2, replace))


def test_the_cli_says_so_in_one_line_and_never_stored_in(tmp_path, monkeypatch):
    path = tmp_path / "fp4.db"
    import fp4cli.train.progress as progress

    monkeypatch.setattr(progress, "RichReporter", lambda: _RemoveStoreAt(path, 2))
    result = CliRunner().invoke(
        app, ["train", "--task", "regression", "--size", "debug", "--device", "cpu",
              "--steps", "6", "--set", "log_every=1", "--store", str(path)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "was removed or replaced" in result.output and "Stored in" not in result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes read-only files")
def test_a_read_only_store_is_one_line(tmp_path):
    path = tmp_path / "fp4.db"
    _filled_store(path)
    path.chmod(0o444)
    with pytest.raises(StoreError, match="cannot write run store"):
        RunStore(path).create_run("regression", "bf16", 0, {}, "cpu", {})


def test_a_write_error_is_a_store_error(tmp_path, monkeypatch):
    """What a read-only file, a full disk or a lock held too long raise inside a write."""
    store = RunStore(tmp_path / "fp4.db")
    run_id = store.create_run("regression", "bf16", 0, {}, "cpu", {})

    def failing(*args, **kwargs):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(store.db.table("metrics"), "insert_all", failing, raising=False)
    monkeypatch.setattr(type(store.db.table("metrics")), "insert_all", failing)
    with pytest.raises(StoreError, match="cannot write run store .* readonly"):
        store.log_metrics(run_id, 1, {"loss": 1.0})


def test_a_full_disk_ends_the_run_in_one_line(tmp_path):
    """A file-size limit stands in for a full disk: the checkpoint cannot be written."""
    import resource
    import subprocess
    import sys

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, 300_000))

    args = "train --task gpt --size debug --device cpu --steps 10 --set checkpoint_every=5"
    command = [sys.executable, "-m", "fp4cli.cli", *args.split(), "--quiet", "--store", "s.db"]
    done = subprocess.run(command, cwd=tmp_path, preexec_fn=limit, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot write checkpoint")
    assert not list(tmp_path.glob("checkpoints/*/*.partial"))
    (run,) = RunStore(tmp_path / "s.db").list_runs()
    assert run["status"] == "failed"


def test_the_recorded_checkpoint_survives_a_kill_before_the_next_is_recorded(tmp_path, monkeypatch):
    """A kill between writing checkpoint N and recording it in the store: the store still names
    checkpoint N-1, whose file must still be there to resume from."""
    from pathlib import Path

    store = RunStore(tmp_path / "fp4.db")
    real = RunStore.add_checkpoint
    calls = []

    def killed_on_the_second(self, run_id, step, path):
        calls.append(step)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what a SIGKILL leaves: the file written, no row
        return real(self, run_id, step, path)

    monkeypatch.setattr(RunStore, "add_checkpoint", killed_on_the_second)
    flags = {**FLAGS, "steps": 4, "checkpoint_every": 1}
    cut, _ = run_training(flags, [], store, reporter=SilentReporter())
    assert cut.status == "interrupted"
    monkeypatch.setattr(RunStore, "add_checkpoint", real)
    recorded = store.latest_checkpoint(cut.run_id)
    assert recorded["step"] == 1 and Path(recorded["path"]).exists()
    resumed, _ = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert resumed.status == "finished"
    checkpoints = list((tmp_path / "checkpoints" / cut.run_id).glob("step-*"))
    assert [c.name for c in checkpoints] == ["step-00000004.pt"]  # the older ones pruned
