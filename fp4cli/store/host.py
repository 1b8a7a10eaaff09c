"""What the store learns from the machine: the clock, the git revision, whether a process lives.

A run records the host and pid of the process that writes it. When a store is opened, a
`running` run whose process is gone is interrupted: on this host when its pid is dead (or a
zombie, or reused by a newer process), on another host when its heartbeat is stale.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

PID_REUSE_SLACK_S = 60.0  # a pid's process that started this long after the run's last
# heartbeat is another process (the slack covers clock steps and /proc's 1 s boot time)


def now() -> str:
    """The time as ISO 8601 UTC to the millisecond (these strings sort as times)."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def new_id(prefix: str) -> str:
    """'r-20261122-103012-ab12': UTC time to the second, then 16 random bits."""
    return f"{prefix}-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def git_revision() -> str | None:
    """HEAD of the repository fp4cli runs from, with '-dirty' if files changed or were added
    (ignored ones aside); None outside a repository or without git."""
    source = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", *args], cwd=source, capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout.strip()

    try:
        revision = git("rev-parse", "HEAD")
        dirty = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return None
    return revision + ("-dirty" if dirty else "")


def gone_runs(
    running: Iterable[dict[str, Any]], host: str, stale_after: float
) -> list[tuple[str, str]]:
    """(id, why) of the runs whose process is gone, among `running` rows (id, host, pid,
    started_at, heartbeat_at) seen from `host`."""
    gone = []
    for run in running:
        last_seen = epoch(run["heartbeat_at"] or run["started_at"])
        if run["host"] == host:
            if process_alive(run["pid"], last_seen):
                continue
            why = f"process {run['pid']} on {host} ended without finishing the run"
        else:
            silent = datetime.now(timezone.utc).timestamp() - last_seen
            if silent < stale_after:
                continue
            why = f"no heartbeat from {run['host']} for {silent / 60:.0f} min"
        gone.append((run["id"], why))
    return gone


def process_alive(pid: int | None, seen_alive: float) -> bool:
    """Whether `pid` is still the live process that was seen alive at `seen_alive` (epoch s:
    its run's last heartbeat)."""
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: alive
    return not _dead_or_reused(pid, seen_alive)


def _dead_or_reused(pid: int, seen_alive: float) -> bool:
    """On Linux: a zombie (killed, not yet reaped by its parent), or a process that started
    well after the run's process was last seen alive (the pid was reused). False where /proc
    cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        state, start_ticks = fields[0], int(fields[19])
        started = boot + start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    return state in ("Z", "X") or started > seen_alive + PID_REUSE_SLACK_S
