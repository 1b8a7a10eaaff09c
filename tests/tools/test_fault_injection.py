"""Seeded fault injection on real processes (bounded: about a minute and a half on two cores).

- A training run SIGKILLed at up to 10 random moments (during start-up, steps, checkpoint and
  store writes), resumed after each, ends with the uninterrupted run's metrics exactly.
- A two-worker sweep SIGKILLed at random moments, run again after each, ends with exactly one
  finished run per point.
- While a run trains, a second process resuming it is refused in one line; while a sweep runs,
  a second `fp4 sweep` of it is refused in one line.
- A checkpoint that finds the disk full fails the run in one line (`failed`, never left
  `running` to be marked `interrupted`).
- A two-worker sweep stopped by Ctrl-C, or by SIGINT to its coordinator alone, exits 130.
"""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.store.host import epoch

FP4 = [sys.executable, "-m", "fp4cli.cli"]
SEED = 20261123
TRAIN = [
    "train",
    "--task",
    "regression",
    "--size",
    "debug",
    "--device",
    "cpu",
    "--quiet",
    "--recipe",
    "tetrajet",
    "--steps",
    "300",
    "--set",
    "checkpoint_every=1",
    "--set",
    "log_every=1",
]  # fmt: skip  (about 2 s of start-up, then 5 s of training)
KILLS = 10


def _series(store: RunStore, run_id: str) -> list[tuple[int, str, float]]:
    rows = store.metrics(run_id)
    return [(m["step"], m["name"], m["value"]) for m in rows if m["name"] != "samples_per_s"]


def _finished(store: RunStore) -> list[dict]:
    return store.list_runs(status="finished")


def _timings(store: RunStore, run_id: str, wall_s: float) -> tuple[float, float]:
    """(start-up seconds, seconds per step) of a finished run that took wall_s in all: the
    time between its first and last checkpoints is its steps'."""
    rows = store.checkpoints(run_id)
    training_s = epoch(rows[-1]["created_at"]) - epoch(rows[0]["created_at"])
    return max(wall_s - training_s, 0.1), training_s / (len(rows) - 1)


def _checkpointed_step(db: Path, run_id: str | None) -> int:
    """The step of the run's latest checkpoint; -1 when there is none (or no run yet)."""
    if run_id is None or not db.exists():
        return -1
    latest = RunStore(db).latest_checkpoint(run_id)
    return -1 if latest is None else latest["step"]


def _kill_at_a_random_moment(process, db: Path, run_id, rng, timings) -> None:
    """SIGKILL during start-up (a third of kills) or a few steps after training goes on.

    Both are timed from the machine's own reference run, and kills in training wait for a new
    checkpoint first: how many kills land in training does not depend on the machine's speed.
    """
    startup_s, step_s = timings
    if rng.random() < 1 / 3:
        time.sleep(rng.uniform(0.1, 0.9) * startup_s)
    else:
        start, deadline = _checkpointed_step(db, run_id), time.time() + 60
        while process.poll() is None and time.time() < deadline:
            runs = RunStore(db).list_runs() if db.exists() else []
            if runs and _checkpointed_step(db, runs[0]["id"]) > start:
                break
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 4 * step_s))  # inside a step, a checkpoint or a write
    process.send_signal(signal.SIGKILL)
    process.wait()


def test_a_run_killed_at_random_moments_resumes_to_the_same_metrics(tmp_path):
    reference_db, db = tmp_path / "reference.db", tmp_path / "fp4.db"
    started = time.time()
    subprocess.run([*FP4, *TRAIN, "--store", str(reference_db)], check=True, cwd=tmp_path)
    reference = RunStore(reference_db)
    (expected_run,) = _finished(reference)
    timings = _timings(reference, expected_run["id"], time.time() - started)
    rng = random.Random(SEED)
    run_id, killed_in_training = None, 0
    for _ in range(KILLS):
        if run_id is not None and RunStore(db).latest_checkpoint(run_id) is not None:
            command = [*FP4, "train", "--quiet", "--store", str(db), f"--resume={run_id}"]
        else:  # killed before its first checkpoint: start again
            if run_id is not None:
                RunStore(db).delete_run(run_id)
            command = [*FP4, *TRAIN, "--store", str(db)]
        before = _checkpointed_step(db, run_id)
        process = subprocess.Popen(command, cwd=tmp_path, stderr=subprocess.PIPE)
        _kill_at_a_random_moment(process, db, run_id, rng, timings)
        runs = RunStore(db).list_runs() if db.exists() else []
        run_id = runs[0]["id"] if runs else None
        if runs and runs[0]["status"] == "finished":
            break
        assert not runs or runs[0]["status"] == "interrupted"
        killed_in_training += _checkpointed_step(db, run_id) > before
    store = RunStore(db)
    if not _finished(store):
        if run_id is not None and store.latest_checkpoint(run_id) is not None:
            command = [*FP4, "train", "--quiet", "--store", str(db), f"--resume={run_id}"]
        else:
            if run_id is not None:
                store.delete_run(run_id)
            command = [*FP4, *TRAIN, "--store", str(db)]
        subprocess.run(command, check=True, cwd=tmp_path)
    (run,) = RunStore(db).list_runs()
    assert run["status"] == "finished" and killed_in_training >= KILLS // 2
    assert _series(RunStore(db), run["id"]) == _series(reference, expected_run["id"])


def _sweep_file(tmp_path: Path, steps: int = 30) -> Path:
    path = tmp_path / "sweep.yaml"
    spec = {
        "name": "faults", "base": "mxfp4", "tasks": ["regression"], "seeds": [0, 1],
        "baselines": ["bf16"],
        "train": {"size": "debug", "steps": steps, "device": "cpu", "checkpoints": False},
        "axes": {"linear.forward.x.rounding": ["rne", "sr"]},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_sweep_killed_at_random_moments_ends_with_one_run_per_point(tmp_path):
    path, db = _sweep_file(tmp_path), tmp_path / "s.db"
    command = [*FP4, "sweep", str(path), "--store", str(db), "--workers", "2", "--quiet"]
    rng = random.Random(SEED + 1)
    for _ in range(4):
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        time.sleep(rng.uniform(2.0, 6.0))
        os.killpg(process.pid, signal.SIGKILL)  # the coordinator and its workers
        process.wait()
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    store = RunStore(db)
    points: dict[str, list[str]] = {}
    for run in store.list_runs():
        point = next(t for t in run["tags"] if t.startswith("point:"))
        points.setdefault(point, []).append(run["status"])
    assert len(points) == 6  # (bf16 + 2 roundings) x 2 seeds
    assert all(statuses == ["finished"] for statuses in points.values()), points


def test_a_second_writer_is_refused_while_the_first_lives(tmp_path):
    db = tmp_path / "fp4.db"
    long_run = [*FP4, *TRAIN[:-6], "--steps", "100000", "--set", "checkpoint_every=20",
                "--store", str(db)]  # fmt: skip
    process = subprocess.Popen(long_run, cwd=tmp_path, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            runs = RunStore(db).list_runs() if db.exists() else []
            if runs and RunStore(db).latest_checkpoint(runs[0]["id"]) is not None:
                break
            time.sleep(0.3)
        resume = [*FP4, "train", "--store", str(db), f"--resume={runs[0]['id']}"]
        second = subprocess.run(resume, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stderr
        assert second.stderr.count("\n") == 1 and "is being trained by process" in second.stderr
    finally:
        process.kill()
        process.wait()

    path = _sweep_file(tmp_path, steps=100_000)
    sweep = [*FP4, "sweep", str(path), "--store", str(tmp_path / "s.db"), "--workers", "1"]
    first = subprocess.Popen(sweep, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not (tmp_path / "s.db").exists():
            time.sleep(0.3)
        while time.time() < deadline and not RunStore(tmp_path / "s.db").list_runs():
            time.sleep(0.3)
        second = subprocess.run(sweep, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        assert "is being run by process" in second.stderr
    finally:
        first.kill()
        first.wait()


# A full disk, stop signals.


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_full_disk_fails_the_run_in_one_line(tmp_path, monkeypatch, where):
    """A checkpoint that finds the disk full ends the run `failed` in one line. The failed
    write's file holds its space while it is open: the store records the failure only once
    it is closed (here, a store write fails while that file is open)."""
    import fp4cli.train.checkpoint as checkpoint
    import fp4cli.train.loop as loop
    from fp4cli.store import StoreError

    open_files = []

    def full_disk_save(state, path):
        file = open(path, "wb")  # noqa: SIM115 (left open, as a failed writer leaves it)
        open_files.append(weakref.ref(file))
        file.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk_folder(directory, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    real_finish = RunStore.finish_run

    def finish_unless_full(self, *args, **kwargs):
        if any(ref() is not None and not ref().closed for ref in open_files):
            raise StoreError(f"cannot write run store {self.path}: database or disk is full")
        return real_finish(self, *args, **kwargs)

    if where == "file":
        monkeypatch.setattr(checkpoint.torch, "save", full_disk_save)
    else:
        monkeypatch.setattr(loop, "save_checkpoint", full_disk_folder)
    monkeypatch.setattr(RunStore, "finish_run", finish_unless_full)
    db = tmp_path / "s.db"
    args = ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--quiet",
            "--steps", "6", "--checkpoint-every", "2", "--store", str(db)]  # fmt: skip
    done = CliRunner().invoke(app, args)
    lines = [line for line in done.output.splitlines() if line.strip()]
    assert done.exit_code == 2 and len(lines) == 1, done.output
    assert lines[0].startswith("error: cannot") and "No space left on device" in lines[0]
    (run,) = RunStore(db).list_runs()
    assert run["status"] == "failed" and "No space left on device" in run["message"]
    assert not list(tmp_path.glob("checkpoints/*/*.partial"))


def _wait_for_running(db: Path, process, count: int) -> None:
    deadline = time.time() + 180
    while time.time() < deadline:
        assert process.poll() is None, process.communicate()
        runs = RunStore(db).list_runs(status="running") if db.exists() else []
        if len(runs) >= count and all((run["step"] or 0) > 0 for run in runs):
            return
        time.sleep(0.2)
    raise AssertionError("the runs did not start")


def _ignore_sigint() -> None:
    """What a shell does to a job it starts in the background."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("target", ["group", "coordinator"])
def test_an_interrupted_sweep_with_points_left_exits_130(tmp_path, target):
    """Ctrl-C (the whole group) or SIGINT to the coordinator alone, which inherited SIGINT
    ignored: the sweep stops, says so, and exits 130."""
    path, db = _sweep_file(tmp_path, steps=100_000), tmp_path / "s.db"
    command = [*FP4, "sweep", str(path), "--store", str(db), "--workers", "2", "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, preexec_fn=_ignore_sigint,
                               env=os.environ | {"COLUMNS": "200"})  # fmt: skip
    try:
        _wait_for_running(db, process, 2)
        if target == "group":
            os.killpg(process.pid, signal.SIGINT)
        else:
            process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, out + err
    assert "Run the same command again" in out and "Traceback" not in err
    statuses = [run["status"] for run in RunStore(db).list_runs()]
    assert statuses and set(statuses) == {"interrupted"}
