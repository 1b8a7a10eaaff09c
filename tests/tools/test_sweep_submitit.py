"""`fp4 sweep --launcher slurm` through submitit, tested with its local executor
(`--launcher submitit-local`: real job processes, no cluster): the same points and metrics as
the default launcher, a killed job submitted again, a killed coordinator started again, the
sweep readable while it runs, and the Slurm options as sbatch sees them."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.sweep import SweepError, expand_points, load_sweep, parse_sweep, plan_sweep, run_sweep
from fp4cli.sweep.launchers import ClusterOptions, make_executor
from fp4cli.sweep.remote import RemoteLaunch, run_remote

FP4 = [sys.executable, "-m", "fp4cli.cli"]
TRAIN = {"size": "debug", "steps": 3, "device": "cpu", "checkpoints": False, "log_every": 1}
AXES = {
    "bwd": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]},
    "linear.grad_weight.hadamard": [None, 32],
}
RAW = {"name": "tiny", "base": "mxfp4", "tasks": ["regression"], "train": TRAIN, "axes": AXES}


def _write(tmp_path, **changes):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(RAW | changes))
    return path


def _metrics_by_point(store):
    """point id -> {(name, step): value} of the sweep's finished runs (timings left out)."""
    found = {}
    for run in store.list_runs(sweep=store.get_sweep("tiny")["id"]):
        assert run["status"] == "finished"
        point = next(t[len("point:") :] for t in run["tags"] if t.startswith("point:"))
        assert point not in found, "two runs of one point"
        rows = store.metrics(run["id"])
        found[point] = {(r["name"], r["step"]): r["value"] for r in rows
                        if r["name"] != "samples_per_s"}  # fmt: skip
    return found


def _ledger(tmp_path):
    return json.loads((tmp_path / "sweeps" / "tiny" / "jobs.json").read_text())


def test_submitit_local_gives_the_points_and_metrics_of_the_local_launcher(tmp_path):
    spec = parse_sweep(RAW, "tiny.yaml")
    local = RunStore(tmp_path / "local.db")
    run_sweep(plan_sweep(spec, local), local)
    remote = RunStore(tmp_path / "remote.db")
    launch = RemoteLaunch("submitit-local", ClusterOptions(points_per_job=3, time_min=5),
                          tmp_path / "sweeps" / "tiny")  # fmt: skip
    results = run_remote(plan_sweep(spec, remote), remote, launch, poll_s=0.2)
    assert sorted(r.status for r in results) == ["finished"] * 5
    expected = _metrics_by_point(local)
    assert set(expected) == {p.id for p in expand_points(spec)}
    assert _metrics_by_point(remote) == expected
    assert [len(job["points"]) for job in json.loads((launch.folder / "jobs.json").read_text())] \
        == [3, 2]  # fmt: skip
    assert remote.get_sweep("tiny")["holder_pid"] is None  # the claim on the sweep is released
    again = plan_sweep(spec, remote)
    assert again.pending == [] and len(again.done) == 5
    # A new store with the same folder: the older sweep's shards are neither merged nor done.
    fresh = RunStore(tmp_path / "fresh.db")
    results = run_remote(plan_sweep(spec, fresh), fresh, launch, poll_s=0.2)
    assert sorted(r.status for r in results) == ["finished"] * 5
    assert _metrics_by_point(fresh) == expected and len(fresh.list_runs()) == 5


@pytest.fixture
def started(tmp_path):
    """Start processes in sessions of their own, their output into a file (jobs they start
    inherit it, and outlive a killed coordinator); whatever is left of them is killed after."""
    processes = []

    def start(command, env):
        log = tmp_path / f"output-{len(processes)}.txt"
        with open(log, "wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env,
                                       start_new_session=True)  # fmt: skip
        process.log = log
        processes.append(process)
        return process

    yield start
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _output(process):
    return process.log.read_text(errors="replace")


def _wait_for(condition, process, seconds=120):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if condition():
            return
        assert process.poll() is None, _output(process)
        time.sleep(0.1)
    raise AssertionError(f"timed out: {_output(process)}")


def _job_processes(folder):
    """The pids of the job processes submitit started for the sweep in `folder`."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"submitit.core._submit" in cmdline and str(folder).encode() in b" ".join(cmdline):
            pids.append(int(proc.name))
    return pids


def test_a_killed_job_is_submitted_again(tmp_path, started):
    path = _write(tmp_path, train=TRAIN | {"steps": 20}, baselines=[],
                  slurm={"points_per_job": 4, "time_min": 5})  # fmt: skip
    db, shards = tmp_path / "s.db", tmp_path / "sweeps" / "tiny" / "shards"
    command = [*FP4, "sweep", str(path), "--store", str(db), "--launcher", "submitit-local"]
    process = started(command, os.environ | {"COLUMNS": "200"})
    _wait_for(lambda: len(list(shards.glob("*.db"))) >= 1 and list(shards.glob("*.claim")),
              process)  # fmt: skip
    holder = json.loads(next(shards.glob("*.claim")).read_text())
    os.kill(holder["pid"], signal.SIGKILL)  # the job's process, in the middle of a point
    assert process.wait(timeout=240) == 0, _output(process)
    assert "ran 4 points (4 finished)" in _output(process)
    jobs = _ledger(tmp_path)
    assert len(jobs) == 2 and len(jobs[1]["points"]) < 4  # only what the dead job left
    by_point = _metrics_by_point(RunStore(db))
    assert set(by_point) == {p.id for p in expand_points(load_sweep(path))}


def test_a_killed_coordinator_started_again_submits_nothing_twice(tmp_path, started):
    path = _write(tmp_path, train=TRAIN | {"steps": 40},
                  slurm={"points_per_job": 4, "time_min": 5})  # fmt: skip
    db, shards = tmp_path / "s.db", tmp_path / "sweeps" / "tiny" / "shards"
    command = [*FP4, "sweep", str(path), "--store", str(db), "--launcher", "submitit-local"]
    env = os.environ | {"COLUMNS": "200"}
    first = started(command, env)

    def baselines_done():  # the report needs the sweep's baselines (trained first)
        finished = RunStore(db).list_runs(status="finished") if db.exists() else []
        return {"bf16", "mxfp4"} <= {run["recipe"] for run in finished}

    _wait_for(baselines_done, first)
    jobs = _job_processes(tmp_path / "sweeps" / "tiny" / "jobs")
    for pid in jobs:  # the jobs hold still while the coordinator is replaced
        os.kill(pid, signal.SIGSTOP)
    assert jobs and first.poll() is None
    os.kill(first.pid, signal.SIGKILL)  # the coordinator only: its jobs go on
    first.wait()
    report = subprocess.run([*FP4, "report", "--sweep", "tiny", "--store", str(db), "--json"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert report.returncode == 0, report.stderr  # the sweep reads while it runs
    assert 2 <= len(json.loads(report.stdout)["runs"]) < 5
    second = started(command, env)
    _wait_for(lambda: "following" in _output(second), second)
    for pid in jobs:
        os.kill(pid, signal.SIGCONT)
    assert second.wait(timeout=240) == 0, _output(second)
    assert "submitted" not in _output(second)
    points = {p.id for p in expand_points(load_sweep(path))}
    submitted = [p for job in _ledger(tmp_path) for p in job["points"]]
    assert sorted(submitted) == sorted(points)  # each point submitted once, in all
    assert set(_metrics_by_point(RunStore(db))) == points
    assert len(list(shards.glob("*.db"))) == 5 and not list(shards.glob("*.claim"))


def test_a_job_of_two_devices_trains_its_points_in_two_processes(tmp_path):
    from fp4cli.store.shards import merge_shards
    from fp4cli.sweep.remote import train_points

    points = expand_points(parse_sweep(RAW | {"baselines": []}, "tiny.yaml"))[:2]
    shards = tmp_path / "shards"
    results = train_points(str(shards), "s-1", (), points, devices=["cpu", "cpu"])
    assert sorted(r.point_id for r in results) == sorted(p.id for p in points)
    assert {r.status for r in results} == {"finished"}
    store = RunStore(tmp_path / "main.db")
    assert len(merge_shards(store, shards).merged) == 2
    assert len({run["pid"] for run in store.list_runs()}) == 2
    assert train_points(str(shards), "s-1", (), points, devices=["cpu"]) == []  # all done


def test_the_claim_of_a_job_that_ended_on_another_node_is_not_waited_out(tmp_path):
    """A killed job's claim looks alive for minutes (its files changed recently, on a host whose
    processes this one cannot see); once its job has ended, its point is trained again."""
    spec = parse_sweep(RAW | {"baselines": [], "axes": {}}, "tiny.yaml")
    (point,) = expand_points(spec)
    folder = tmp_path / "sweeps" / "tiny"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    ledger = [{"job_id": dead, "launcher": "submitit-local", "points": [point.id],
               "folder": str(folder / "jobs"), "submitted_at": "2026-01-01T00:00"}]  # fmt: skip
    (folder / "shards").mkdir(parents=True)
    (folder / "jobs.json").write_text(json.dumps(ledger))
    holder = {"host": "node-7", "pid": 1234, "job": dead, "at": "2026-01-01T00:00:00+00:00"}
    (folder / "shards" / f"{point.id}.claim").write_text(json.dumps(holder))
    store = RunStore(tmp_path / "s.db")
    launch = RemoteLaunch("submitit-local", ClusterOptions(time_min=5), folder)
    started_at = time.time()
    (result,) = run_remote(plan_sweep(spec, store), store, launch, poll_s=0.2)
    assert result.status == "finished" and time.time() - started_at < 60
    assert [job["points"] for job in _ledger(tmp_path)] == [[point.id], [point.id]]


# The options.


def test_slurm_options_from_the_file_and_the_command_line_reach_sbatch(tmp_path, monkeypatch):
    import shutil

    from submitit.slurm.slurm import SlurmExecutor

    spec = parse_sweep(RAW | {"slurm": {"partition": "gpu", "time_min": 90, "gpus_per_job": 2,
                                        "sbatch": {"constraint": "h100"}}}, "t.yaml")  # fmt: skip
    options = spec.cluster.updated(account="lab", max_running=8)
    monkeypatch.setattr(SlurmExecutor, "affinity", classmethod(lambda cls: 1))  # "on a cluster"
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: f"/usr/bin/{name}")
    executor = make_executor("slurm", tmp_path, options, "fp4-tiny", nodes=2, gpus_per_node=4)
    text = executor._executor._make_submission_file_text("python -m job", "uid")
    for line in ("--partition=gpu", "--account=lab", "--time=90", "--gpus-per-node=4",
                 "--nodes=2", "--ntasks-per-node=1", "--constraint=h100",
                 "--job-name=fp4-tiny"):  # fmt: skip
        assert f"#SBATCH {line}" in text, text


@pytest.mark.parametrize(
    ("slurm", "message"),
    [
        ({"partiton": "gpu"}, "slurm.partiton: unknown key"),
        ({"time_min": 0}, "slurm.time_min: must be a positive integer"),
        ({"gpus_per_job": -1}, "slurm.gpus_per_job: must be a non-negative integer"),
        ({"sbatch": {"bad key": 1}}, "is not an sbatch option name"),
        ("gpu", "slurm: must be a mapping"),
    ],
)
def test_bad_cluster_options_are_one_line(slurm, message):
    with pytest.raises(SweepError) as error:
        parse_sweep(RAW | {"slurm": slurm}, "t.yaml")
    assert message in str(error.value) and "\n" not in str(error.value)


def test_slurm_launcher_without_sbatch_and_an_unknown_launcher(tmp_path, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    path, db = _write(tmp_path), str(tmp_path / "s.db")
    runner = CliRunner()
    result = runner.invoke(app, ["sweep", str(path), "--store", db, "--launcher", "slurm"])
    assert result.exit_code == 2 and "sbatch is not on this machine's PATH" in result.output
    result = runner.invoke(app, ["sweep", str(path), "--store", db, "--launcher", "pbs"])
    assert result.exit_code == 2 and "--launcher" in result.output
    result = runner.invoke(app, ["sweep", str(path), "--store", db, "--partition", "gpu"])
    assert result.exit_code == 2
    assert "--partition: only with --launcher slurm or submitit-local" in result.output
    args = ["sweep", str(path), "--store", db, "--launcher", "submitit-local", "--workers", "2"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and "--workers and --device: only with" in result.output
    assert RunStore(db).list_runs() == []
    assert not Path(tmp_path / "sweeps" / "tiny" / "jobs.json").exists()
