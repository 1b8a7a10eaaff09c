"""Where a sweep's points train: `local` worker processes (runner.py), or jobs that submitit
submits, to Slurm (`slurm`) or as processes of this machine (`submitit-local`: the same path
without a cluster, for trying a cluster sweep and for tests).

The cluster options come from the sweep file's `slurm:` mapping, overridden by the command line:

    slurm:
      partition: gpu          # sbatch --partition
      account: my-lab         # sbatch --account
      gpus_per_job: 1         # GPUs of each job (one node)
      cpus_per_job: 8         # sbatch --cpus-per-task
      time_min: 120           # the time limit of a job, in minutes
      points_per_job: 4       # small points share a job (one job array element per group)
      max_running: 32         # jobs of the array running at once
      sbatch: {constraint: h100, qos: high}   # any other sbatch option

Jobs submitted are recorded in DIR/jobs.json (written atomically) so that a coordinator started
again follows the jobs still queued or running instead of submitting their points again.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fp4cli.store.host import epoch, now, process_alive
from fp4cli.sweep.errors import SweepError

LAUNCHERS = ("local", "slurm", "submitit-local")
SUBMITIT_LAUNCHERS = ("slurm", "submitit-local")
CLUSTER_KEYS = (
    "partition", "account", "gpus_per_job", "cpus_per_job", "time_min", "points_per_job",
    "max_running", "sbatch",
)  # fmt: skip
SLURM_ALIVE = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING",
               "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED")  # fmt: skip
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class ClusterOptions:
    partition: str | None = None
    account: str | None = None
    gpus_per_job: int = 1
    cpus_per_job: int | None = None
    time_min: int = 60
    points_per_job: int = 1
    max_running: int | None = None
    sbatch: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not _is_int(self.gpus_per_job) or self.gpus_per_job < 0:
            raise SweepError(
                f"gpus_per_job: must be a non-negative integer (got {self.gpus_per_job!r})"
            )
        for name in ("time_min", "points_per_job", "cpus_per_job", "max_running"):
            value = getattr(self, name)
            if value is not None and (not _is_int(value) or value < 1):
                raise SweepError(f"{name}: must be a positive integer (got {value!r})")
        for name in ("partition", "account"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise SweepError(f"{name}: must be a name (got {value!r})")
        for key, _ in self.sbatch:
            if not _SBATCH_KEY.fullmatch(key):
                raise SweepError(
                    f"sbatch: {key!r} is not an sbatch option name (letters, digits, '-')"
                )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in CLUSTER_KEYS} | {"sbatch": dict(self.sbatch)}

    def updated(self, **values: Any) -> ClusterOptions:
        """These options with the values given (None: unset, kept)."""
        return replace(self, **{k: v for k, v in values.items() if v is not None})


def parse_cluster(raw: Any, label: str) -> ClusterOptions:
    """The sweep file's `slurm:` mapping; one-line SweepError naming the key."""
    if raw is None:
        return ClusterOptions()
    if not isinstance(raw, dict):
        raise SweepError(f"{label}: slurm: must be a mapping of cluster options (got {raw!r})")
    for key in raw:
        if key not in CLUSTER_KEYS:
            raise SweepError(
                f"{label}: slurm.{key}: unknown key; allowed: {', '.join(CLUSTER_KEYS)}"
            )
    values = dict(raw)
    sbatch = values.pop("sbatch", None) or {}
    if not isinstance(sbatch, dict):
        raise SweepError(f"{label}: slurm.sbatch: must be a mapping of option: value")
    try:
        return ClusterOptions(**values, sbatch=tuple((str(k), str(v)) for k, v in sbatch.items()))
    except SweepError as error:
        raise SweepError(f"{label}: slurm.{error}") from None


def parse_sbatch_flags(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`--sbatch KEY=VALUE` flags (a bare KEY is a flag without a value: `exclusive`)."""
    flags = []
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().removeprefix("--")
        if not key:
            raise SweepError(f"--sbatch {item!r}: expected KEY=VALUE (an sbatch option)")
        flags.append((key, value if sep else "true"))
    return tuple(flags)


def make_executor(
    launcher: str,
    folder: Path,
    options: ClusterOptions,
    name: str,
    nodes: int = 1,
    tasks_per_node: int = 1,
    gpus_per_node: int | None = None,
) -> Any:
    """A submitit executor for `launcher` (slurm or submitit-local), its logs in `folder`."""
    import submitit

    if launcher == "slurm" and shutil.which("sbatch") is None:
        raise SweepError(
            "--launcher slurm: sbatch is not on this machine's PATH; run fp4 on a Slurm login "
            "node (--launcher submitit-local tries the same path on this machine)"
        )
    if launcher not in SUBMITIT_LAUNCHERS:
        raise SweepError(f"--launcher: must be one of {', '.join(LAUNCHERS)} (got {launcher!r})")
    cluster = "slurm" if launcher == "slurm" else "local"
    executor = submitit.AutoExecutor(folder=str(folder), cluster=cluster)
    executor.update_parameters(**executor_parameters(options, name, nodes, tasks_per_node,
                                                     gpus_per_node))  # fmt: skip
    return executor


def executor_parameters(
    options: ClusterOptions,
    name: str,
    nodes: int = 1,
    tasks_per_node: int = 1,
    gpus_per_node: int | None = None,
) -> dict[str, Any]:
    """AutoExecutor parameters; the slurm_ ones are ignored by the local executor."""
    extra: dict[str, Any] = {k: True if v == "true" else v for k, v in options.sbatch}
    parameters: dict[str, Any] = {
        "name": name,
        "timeout_min": options.time_min,
        "nodes": nodes,
        "tasks_per_node": tasks_per_node,
        "gpus_per_node": options.gpus_per_job if gpus_per_node is None else gpus_per_node,
        "cpus_per_task": options.cpus_per_job,
        "slurm_partition": options.partition,
        "slurm_account": options.account,
        "slurm_array_parallelism": options.max_running,
        "slurm_additional_parameters": extra or None,
    }
    return {k: v for k, v in parameters.items() if v is not None}


def groups_of(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


class JobLedger:
    """The jobs a sweep submitted, in `path` (JSON, replaced atomically on every change)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.jobs: list[dict[str, Any]] = self._read()

    def _read(self) -> list[dict[str, Any]]:
        try:
            jobs = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as error:
            raise SweepError(f"cannot read the sweep's job list {self.path}: {error}") from None
        if not isinstance(jobs, list):
            raise SweepError(f"{self.path}: not a job list written by fp4 sweep")
        return jobs

    def add(self, job_id: str, launcher: str, points: Sequence[str], folder: Path) -> None:
        self.jobs.append({"job_id": job_id, "launcher": launcher, "points": list(points),
                          "folder": str(folder), "submitted_at": now()})  # fmt: skip
        self._write()

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.jobs, indent=1))
        os.replace(partial, self.path)

    def submissions(self, point: str) -> int:
        return sum(point in job["points"] for job in self.jobs)


def recorded_job_alive(job: Mapping[str, Any]) -> bool:
    """Whether a job recorded by an earlier coordinator is still queued or running: for
    submitit-local its controller process lives; for slurm, sacct says so."""
    if job["launcher"] == "submitit-local":
        try:
            pid = int(str(job["job_id"]).split("_")[0])
        except ValueError:
            return False
        return process_alive(pid, epoch(job["submitted_at"]))
    from submitit.slurm.slurm import SlurmJob

    try:
        state = SlurmJob(folder=job["folder"], job_id=str(job["job_id"])).state
    except Exception:  # sacct missing or failing: the claims still keep one writer per point
        return False
    return str(state).split(" ")[0].upper() in SLURM_ALIVE


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
