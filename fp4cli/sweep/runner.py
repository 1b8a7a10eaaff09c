"""Running a sweep: plan what is left, run it in parallel workers, resume after a kill.

Every point is an ordinary run in the store, in the sweep (`runs.sweep` = the sweep's id) and
tagged `point:<id>`. Planning reads the store: a point with a finished or diverged run is done;
one whose run is still `running` in a live process (another `fp4 sweep` of the same file) is
left to it; an interrupted or failed attempt is deleted and the point runs again. So a sweep
killed at any moment, run again, ends with exactly one run per point.

Workers are processes (spawned, so CUDA is safe), one per GPU by default and several per GPU for
the small regression task; each opens its own RunStore (the store is made for many writers)
and trains the points it takes from a shared queue. With one worker the points run in this
process.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fp4cli.sweep.errors import SweepStopped
from fp4cli.sweep.point_run import POINT_TAG, PointResult, run_point
from fp4cli.sweep.points import Point, expand_points
from fp4cli.sweep.spec import SweepSpec

DONE_STATUSES = ("finished", "diverged")
REGRESSION_RUNS_PER_GPU = 8  # small runs are bound by the CPU's kernel launches: fill the GPU


@dataclass
class SweepPlan:
    spec: SweepSpec
    sweep_id: str
    points: list[Point]
    done: dict[str, str] = field(default_factory=dict)  # point id -> run id
    elsewhere: dict[str, str] = field(default_factory=dict)  # running in a live process
    stale: list[str] = field(default_factory=list)  # run ids of attempts to delete

    @property
    def pending(self) -> list[Point]:
        return [p for p in self.points if p.id not in self.done and p.id not in self.elsewhere]


class SweepReporter(Protocol):
    def start(self, total: int, done: int, description: str) -> None: ...

    def point_done(self, result: PointResult) -> None: ...

    def message(self, text: str) -> None: ...

    def finish(self) -> None: ...


class SilentSweepReporter:
    def start(self, total: int, done: int, description: str) -> None:
        pass

    def point_done(self, result: PointResult) -> None:
        pass

    def message(self, text: str) -> None:
        pass

    def finish(self) -> None:
        pass


def plan_sweep(spec: SweepSpec, store: Any, record: bool = True) -> SweepPlan:
    """Sort the sweep's points into done and to do; `record` the sweep in `store` (by name)
    and claim it for this process first (StoreError if a live process runs it), else only look
    it up (a dry run writes nothing)."""
    points = expand_points(spec)
    if record:  # this process becomes the sweep's one coordinator (release_sweep ends it)
        sweep_id = store.ensure_sweep(spec.name, spec.to_dict())
        store.claim_sweep(sweep_id)
    else:
        known = [s for s in store.sweeps() if s["name"] == spec.name]
        sweep_id = known[0]["id"] if known else "(new)"
    plan = SweepPlan(spec, sweep_id, points)
    wanted = {p.id for p in points}
    for run in sorted(store.list_runs(sweep=plan.sweep_id), key=lambda r: r["started_at"]):
        point_id = _point_of(run)
        if point_id is None or point_id not in wanted:
            continue  # a point the file no longer has: kept, not ours to judge
        if run["status"] in DONE_STATUSES and point_id not in plan.done:
            plan.done[point_id] = run["id"]
        elif run["status"] in DONE_STATUSES or run["status"] in ("interrupted", "failed"):
            plan.stale.append(run["id"])  # a second finished run would be a duplicate
        elif run["status"] == "running":
            plan.elsewhere[point_id] = run["id"]
    plan.elsewhere = {k: v for k, v in plan.elsewhere.items() if k not in plan.done}
    return plan


def default_workers(tasks: Sequence[str]) -> int:
    """One per GPU; for a regression-only sweep up to 8 per GPU (at most one per CPU core);
    one on a machine without a GPU."""
    import torch

    gpus = torch.cuda.device_count()
    if gpus == 0:
        return 1
    if set(tasks) != {"regression"}:
        return gpus
    cores_per_gpu = (os.cpu_count() or 1) // gpus
    return gpus * max(1, min(REGRESSION_RUNS_PER_GPU, cores_per_gpu))


def worker_devices(workers: int, device: str | None) -> list[str]:
    """The device of each worker: `device` for all, else the GPUs round-robin, else the CPU."""
    import torch

    if device is not None and device != "auto":
        return [device] * workers
    gpus = torch.cuda.device_count()
    return [f"cuda:{i % gpus}" if gpus else "cpu" for i in range(workers)]


def run_sweep(
    plan: SweepPlan,
    store: Any,
    workers: int | None = None,
    device: str | None = None,
    reporter: SweepReporter | None = None,
) -> list[PointResult]:
    """Run the plan's pending points; returns their results. Raises SweepStopped when stopped
    (every finished point is stored; running ones are marked interrupted). Ends this process's
    claim on the sweep."""
    reporter = reporter or SilentSweepReporter()
    for run_id in plan.stale:
        store.delete_run(run_id)
    pending = plan.pending
    workers = max(1, min(workers or default_workers(plan.spec.tasks), max(len(pending), 1)))
    devices = worker_devices(workers, device)
    threads = max(1, (os.cpu_count() or 1) // workers)
    reporter.start(len(plan.points), len(plan.done), plan.spec.name)
    try:
        if workers == 1:
            return _run_here(plan, pending, store, devices[0], reporter)
        return _run_in_workers(plan, pending, str(store.path), devices, threads, reporter)
    finally:
        reporter.finish()
        store.release_sweep(plan.sweep_id)


def _run_here(
    plan: SweepPlan, pending: list[Point], store: Any, device: str, reporter: SweepReporter
) -> list[PointResult]:
    results = []
    with _stop_signals():
        for point in pending:
            spec = plan.spec
            result = run_point(point, plan.sweep_id, spec.tags, device, store, spec.log_to)
            if result.status == "interrupted":
                raise SweepStopped(f"stopped during {point.label}")
            results.append(result)
            reporter.point_done(result)
    return results


def _run_in_workers(
    plan: SweepPlan,
    pending: list[Point],
    store_path: str,
    devices: list[str],
    threads: int,
    reporter: SweepReporter,
) -> list[PointResult]:
    from fp4cli.sweep.worker import worker_main

    context = multiprocessing.get_context("spawn")
    jobs: Any = context.Queue()
    results_queue: Any = context.Queue()
    for point in pending:
        jobs.put(point)
    for _ in devices:
        jobs.put(None)
    args = (store_path, plan.sweep_id, plan.spec.tags, plan.spec.log_to, threads, jobs,
            results_queue)  # fmt: skip
    processes = [context.Process(target=worker_main, args=(*args, d)) for d in devices]
    results: list[PointResult] = []
    heartbeat = _Heartbeat(store_path, plan.sweep_id)
    with _stop_signals():
        try:
            for process in processes:
                process.start()
            while len(results) < len(pending):
                try:
                    result = results_queue.get(timeout=0.5)
                except queue.Empty:
                    if not any(p.is_alive() for p in processes):
                        break  # every worker ended (one that died loses its point)
                    heartbeat.beat()
                    continue
                results.append(result)
                reporter.point_done(result)
            _stop_if_points_left(results, len(pending))
        except BaseException:
            _stop(processes)
            raise
    for process in processes:
        process.join()
    return results


def _stop_if_points_left(results: list[PointResult], pending: int) -> None:
    """SweepStopped when a point was interrupted (its worker took a Ctrl-C or SIGTERM) or
    workers ended with points left: the sweep did not finish."""
    interrupted = sum(r.status == "interrupted" for r in results)
    left = pending - len(results) + interrupted
    if left:
        raise SweepStopped(f"stopped with {left} point(s) left")


class _Heartbeat:
    """The coordinator's heartbeat on its sweep, at most once a minute."""

    EVERY_S = 60.0

    def __init__(self, store_path: str, sweep_id: str) -> None:
        self.store_path, self.sweep_id, self.last = store_path, sweep_id, time.monotonic()

    def beat(self) -> None:
        if time.monotonic() - self.last < self.EVERY_S:
            return
        from fp4cli.store import RunStore

        with RunStore(self.store_path) as store:
            store.sweep_heartbeat(self.sweep_id)
        self.last = time.monotonic()


def _stop(processes: list[Any]) -> None:
    """SIGTERM each worker (its trainer marks the run interrupted), then wait; kill stragglers."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.time() + 30
    for process in processes:
        process.join(max(0.1, deadline - time.time()))
        if process.is_alive():
            process.kill()
            process.join()


def _stop_signals() -> Any:
    """While the sweep runs in this process: the first SIGTERM raises SweepStopped and the
    first Ctrl-C KeyboardInterrupt (also where SIGINT was inherited ignored); later ones are
    ignored while the sweep stops."""
    from fp4cli.train.signals import stop_signals

    return stop_signals(on_term=SweepStopped)


_stop_on_sigterm = _stop_signals  # remote.py's name for it


def _point_of(run: dict[str, Any]) -> str | None:
    for tag in run.get("tags") or []:
        if isinstance(tag, str) and tag.startswith(POINT_TAG):
            return tag[len(POINT_TAG) :]
    return None
