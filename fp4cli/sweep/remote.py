"""A sweep whose points train as submitit jobs (on Slurm, or as local processes).

Each job trains its group of points, each into a shard of its own under the sweep's folder
(fp4cli.store.shards: a claim per point, so no two live jobs train one point, and a rollback-
journal store file renamed into place when the run ends). This process, the sweep's one
coordinator, submits the points not done, follows its jobs, folds finished shards into the
main store as they appear, and submits again the points of a job that died (up to
MAX_SUBMISSIONS times per point in one run of `fp4 sweep`).

Killed and started again, the coordinator first merges what finished meanwhile, then follows
the jobs an earlier coordinator submitted that are still queued or running (DIR/jobs.json), and
submits only the points no live job holds: nothing finished is trained twice.
"""

from __future__ import annotations

import queue
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4cli.store.host import epoch
from fp4cli.store.shards import (
    break_claim,
    claim,
    finished_shards,
    live_claims,
    merge_shards,
    point_of,
    read_shard,
)
from fp4cli.sweep.launchers import (
    ClusterOptions,
    JobLedger,
    groups_of,
    make_executor,
    recorded_job_alive,
)
from fp4cli.sweep.point_run import PointResult, run_point
from fp4cli.sweep.points import Point
from fp4cli.sweep.runner import (
    DONE_STATUSES,
    SilentSweepReporter,
    SweepPlan,
    SweepReporter,
    _stop_on_sigterm,
)

POLL_S = 1.0  # how often the coordinator looks at its jobs and shards
MAX_SUBMISSIONS = 3  # a point whose job dies this often is reported lost (run the sweep again)
HEARTBEAT_S = 60.0


@dataclass(frozen=True)
class RemoteLaunch:
    launcher: str  # slurm or submitit-local
    options: ClusterOptions
    folder: Path  # the sweep's folder: shards/, jobs/ (submitit's logs), jobs.json
    log_to: tuple[str, ...] = ()

    @property
    def shards(self) -> Path:
        return self.folder / "shards"


def sweep_folder(store_path: Path, name: str) -> Path:
    """The default folder of a sweep's jobs and shards: beside the store."""
    return (Path(store_path).resolve().parent / "sweeps" / name).resolve()


def train_points(
    shard_dir: str,
    sweep_id: str,
    tags: Sequence[str],
    points: Sequence[Point],
    log_to: Sequence[str] = (),
    devices: Sequence[str] | None = None,
) -> list[PointResult]:
    """A job: train each point that no live job holds and that has no finished shard yet, into
    a shard of its own. Runs on a cluster node (or a local process). With several `devices`
    (default: one per GPU the job sees), one process per device trains its share of them."""
    job = _job_id()
    devices = list(devices) if devices is not None else _job_devices()
    if len(devices) > 1 and len(points) > 1:
        return _train_in_processes(job, shard_dir, sweep_id, tags, points, log_to, devices)
    return [
        result
        for point in points
        if (result := _train_one(job, shard_dir, sweep_id, tags, point, log_to, devices[0]))
        is not None
    ]


def _train_one(
    job: str,
    shard_dir: str,
    sweep_id: str,
    tags: Sequence[str],
    point: Point,
    log_to: Sequence[str],
    device: str,
) -> PointResult | None:
    """Train `point` into its shard on `device`; None if a live job holds it or it is done."""
    taken = claim(shard_dir, point.id, job)
    if taken is None:
        return None  # a live job trains it
    if _has_done_shard(Path(shard_dir), point.id, sweep_id):
        taken.release()
        return None
    store = taken.open_store()
    try:
        result = run_point(point, sweep_id, tags, device, store, log_to)
    finally:
        store.close()
    if result.run_id is not None:
        taken.complete(result.run_id)
    else:
        taken.release()
    return result


def _job_devices() -> list[str]:
    import torch

    gpus = torch.cuda.device_count()
    return [f"cuda:{i}" for i in range(gpus)] if gpus > 1 else ["auto"]


def _train_in_processes(
    job: str,
    shard_dir: str,
    sweep_id: str,
    tags: Sequence[str],
    points: Sequence[Point],
    log_to: Sequence[str],
    devices: Sequence[str],
) -> list[PointResult]:
    """One spawned process per device; the i-th trains every len(devices)-th point from i."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    done: Any = context.Queue()
    devices = list(devices)[: len(points)]
    shares = [list(points[i :: len(devices)]) for i in range(len(devices))]
    args = (job, shard_dir, sweep_id, tuple(tags), tuple(log_to), done)
    processes = [
        context.Process(target=_device_worker, args=(*args, share, device))
        for share, device in zip(shares, devices, strict=True)
    ]
    for process in processes:
        process.start()
    results: list[PointResult] = []
    while any(p.is_alive() for p in processes) or not done.empty():
        try:
            result = done.get(timeout=0.5)
        except queue.Empty:
            continue
        if result is not None:
            results.append(result)
    for process in processes:
        process.join()
    return results


def _device_worker(
    job: str,
    shard_dir: str,
    sweep_id: str,
    tags: tuple[str, ...],
    log_to: tuple[str, ...],
    done: Any,
    points: list[Point],
    device: str,
) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    for point in points:
        done.put(_train_one(job, shard_dir, sweep_id, tags, point, log_to, device))


def _job_id() -> str:
    try:
        import submitit

        return str(submitit.JobEnvironment().job_id)
    except Exception:  # not inside a submitit job
        return ""


def _has_done_shard(folder: Path, point_id: str, sweep_id: str) -> bool:
    """Whether the point has a finished (or diverged) run of this sweep in a shard."""
    for path in folder.glob(f"{point_id}-*.db"):
        try:
            runs = read_shard(path).runs
            if any(r["status"] in DONE_STATUSES and r["sweep"] == sweep_id for r in runs):
                return True
        except ValueError:
            continue
    return False


@dataclass
class _Job:
    job_id: str
    points: list[str]
    handle: Any = None  # the submitit Job, for jobs this process submitted
    record: dict[str, Any] | None = None  # the ledger's entry, for jobs an earlier one did
    inspected: bool = False

    def alive(self) -> bool:
        if self.handle is not None:
            return not self.handle.done()
        return self.record is not None and recorded_job_alive(self.record)


@dataclass
class _Coordinator:
    plan: SweepPlan
    store: Any
    launch: RemoteLaunch
    reporter: SweepReporter
    poll_s: float
    pending: dict[str, Point] = field(default_factory=dict)
    results: dict[str, PointResult] = field(default_factory=dict)
    jobs: list[_Job] = field(default_factory=list)
    submitted: dict[str, int] = field(default_factory=dict)  # point -> submissions here
    messages: dict[str, str] = field(default_factory=dict)  # point -> why its job ended
    ended: set[str] = field(default_factory=set)  # ids of jobs known to have ended
    executor: Any = None

    def run(self) -> list[PointResult]:
        self.pending = {p.id: p for p in self.plan.pending}
        self.ledger = JobLedger(self.launch.folder / "jobs.json")
        self._reattach()
        last_beat = time.monotonic()
        while True:
            busy = self._busy_points()  # before merging: a job that ends now has its shard
            self._merge()
            waiting = [p for p in self.pending if p not in self.results]
            if not waiting:
                return list(self.results.values())
            self._resubmit([p for p in waiting if p not in busy])
            if time.monotonic() - last_beat > HEARTBEAT_S:
                self.store.sweep_heartbeat(self.plan.sweep_id)
                last_beat = time.monotonic()
            time.sleep(self.poll_s)

    def _reattach(self) -> None:
        for job in self.ledger.jobs:
            points = [p for p in job["points"] if p in self.pending]
            if not points:
                continue
            if recorded_job_alive(job):
                self.jobs.append(_Job(str(job["job_id"]), points, record=job))
            else:
                self.ended.add(str(job["job_id"]))
        if self.jobs:
            ids = ", ".join(job.job_id for job in self.jobs)
            self.reporter.message(f"following {len(self.jobs)} job(s) queued or running: {ids}")

    def _busy_points(self) -> set[str]:
        """The points a live job holds or will train."""
        busy: set[str] = set()
        for job in self.jobs:
            if job.alive():
                busy.update(job.points)
                continue
            if job.handle is not None:
                self._inspect(job)
            job.inspected = True
            self.ended.add(job.job_id)
        self.jobs = [job for job in self.jobs if not job.inspected]
        here = socket.gethostname()
        for key, holder in live_claims(self.launch.shards).items():
            if holder.get("host") != here and str(holder.get("job")) in self.ended:
                break_claim(self.launch.shards, key)  # its job has ended: its node is not
            else:  # waited out (the claim looks alive only by its recent writes)
                busy.add(key)
        return busy

    def _inspect(self, job: _Job) -> None:
        """A job this process submitted has ended: keep its failures without a run."""
        if not job.handle.paths.result_pickle.exists():  # killed: result() would wait for it
            for point in job.points:
                self.messages[point] = (
                    f"job {job.job_id} ended without a result (killed, or past its time "
                    f"limit?); its log: {job.handle.paths.stderr}"
                )
            return
        try:
            returned = job.handle.result()
        except Exception as error:
            why = " ".join(str(error).split())[:200] or type(error).__name__
            for point in job.points:
                self.messages[point] = f"job {job.job_id} ended: {why}"
            return
        for result in returned or []:
            if result.run_id is None and result.point_id in self.pending:
                self.results[result.point_id] = result
                self.reporter.point_done(result)

    def _merge(self) -> None:
        if not finished_shards(self.launch.shards):
            return
        merged = merge_shards(self.store, self.launch.shards, self.plan.sweep_id)
        for run_id in merged.merged:
            run = self.store.get_run(run_id)
            point = point_of(run.get("tags"))
            if point not in self.pending or point in self.results:
                continue
            if run["status"] == "interrupted":  # stopped (a time limit): trained again
                self.store.delete_run(run_id)
                continue
            label = self.pending[point].label
            result = PointResult(point, label, run["task"], run["seed"], run["status"], run_id)
            result.metrics = self.store.final_metrics(run_id)
            result.message = run.get("message") or ""
            if run.get("ended_at"):
                result.seconds = epoch(run["ended_at"]) - epoch(run["started_at"])
            self.results[point] = result
            self.reporter.point_done(result)

    def _resubmit(self, lost: list[str]) -> None:
        again = []
        for point in lost:
            if self.submitted.get(point, 0) >= MAX_SUBMISSIONS:
                why = self.messages.get(point, "its jobs ended without a run")
                failed = self._failed(point, f"lost after {MAX_SUBMISSIONS} jobs; {why}")
                self.results[point] = failed
                self.reporter.point_done(failed)
            else:
                again.append(point)
        if again:
            self._submit(again)

    def _failed(self, point_id: str, message: str) -> PointResult:
        point = self.pending[point_id]
        return PointResult(point.id, point.label, point.task, point.seed, "failed", message=message)

    def _submit(self, point_ids: list[str]) -> None:
        launch = self.launch
        if self.executor is None:
            name = f"fp4-{self.plan.spec.name}"
            self.executor = make_executor(launch.launcher, launch.folder / "jobs", launch.options,
                                          name)  # fmt: skip
        groups = groups_of([self.pending[p] for p in point_ids], launch.options.points_per_job)
        n = len(groups)
        handles = self.executor.map_array(
            train_points, [str(launch.shards)] * n, [self.plan.sweep_id] * n,
            [self.plan.spec.tags] * n, groups, [launch.log_to] * n,
        )  # fmt: skip
        for handle, group in zip(handles, groups, strict=True):
            ids = [p.id for p in group]
            self.ledger.add(str(handle.job_id), launch.launcher, ids, launch.folder / "jobs")
            self.jobs.append(_Job(str(handle.job_id), ids, handle))
            for point in ids:
                self.submitted[point] = self.submitted.get(point, 0) + 1
        job_ids = ", ".join(str(h.job_id) for h in handles)
        self.reporter.message(f"submitted {len(point_ids)} point(s) in {n} job(s): {job_ids}")


def run_remote(
    plan: SweepPlan,
    store: Any,
    launch: RemoteLaunch,
    reporter: SweepReporter | None = None,
    poll_s: float = POLL_S,
) -> list[PointResult]:
    """Run the plan's pending points as submitit jobs; returns their results. Ctrl-C or SIGTERM
    stops this process only (SweepStopped / KeyboardInterrupt): the jobs go on, and running the
    sweep again follows them. Ends this process's claim on the sweep."""
    reporter = reporter or SilentSweepReporter()
    for run_id in plan.stale:
        store.delete_run(run_id)
    reporter.start(len(plan.points), len(plan.done), plan.spec.name)
    try:
        with _stop_on_sigterm():
            return _Coordinator(plan, store, launch, reporter, poll_s).run()
    finally:
        reporter.finish()
        store.release_sweep(plan.sweep_id)
