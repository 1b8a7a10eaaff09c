"""The run store's sweeps: a sweep's spec, and the one process that coordinates it.

A sweep is claimed by one coordinating process at a time (`claim_sweep`): another process on the
same host must be gone, one on another host silent for STALE_AFTER_S, before a new coordinator
takes over. `RunStore` gets these methods from `SweepRecords`.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlite_utils import Database

from fp4cli.store.host import gone_runs, new_id, now
from fp4cli.store.schema import StoreError

STALE_AFTER_S = 600.0  # a run on another host with no heartbeat for this long is interrupted
Row = dict[str, Any]


class SweepRecords:
    """Sweep records of a run store (the store's `_write`, `_rows`, `host` and `path`)."""

    host: str
    path: Any

    if TYPE_CHECKING:  # what RunStore provides

        def _write(self) -> contextlib.AbstractContextManager[Database]: ...

        def _rows(
            self, sql: str, params: list[Any] | dict[str, Any] | None = None
        ) -> list[Row]: ...

    def ensure_sweep(self, name: str, spec: Mapping[str, Any]) -> str:
        """The id of the sweep called `name` (its spec updated), created if there is none."""
        with self._write() as db:
            row = db.execute(
                "SELECT id FROM sweeps WHERE name = ? ORDER BY created_at DESC LIMIT 1", [name]
            ).fetchone()
            if row is not None:
                db.execute("UPDATE sweeps SET spec = ? WHERE id = ?", [json.dumps(spec), row[0]])
                return str(row[0])
            sweep_id = new_id("s")
            record = {"id": sweep_id, "name": name, "spec": json.dumps(spec), "created_at": now()}
            db.table("sweeps").insert(record)
        return sweep_id

    def claim_sweep(self, sweep_id: str) -> None:
        """Make this process the sweep's one coordinator; StoreError if a live process holds
        it (on this host: its pid lives; on another: its heartbeat is fresh)."""
        with self._write() as db:
            row = db.execute(
                "SELECT name, holder_host, holder_pid, holder_heartbeat, created_at "
                "FROM sweeps WHERE id = ?",
                [sweep_id],
            ).fetchone()
            if row is None:
                raise StoreError(f"unknown sweep {sweep_id!r} in {self.path}")
            name, host, pid, heartbeat, created = row
            mine = host == self.host and pid == os.getpid()
            holder = {"id": sweep_id, "host": host, "pid": pid, "started_at": created,
                      "heartbeat_at": heartbeat}  # fmt: skip
            if host is not None and not mine and not gone_runs([holder], self.host, STALE_AFTER_S):
                raise StoreError(
                    f"sweep {name} is being run by process {pid} on {host} (last heard of at "
                    f"{heartbeat}); wait for it to end or stop it first"
                )
            db.execute(
                "UPDATE sweeps SET holder_host = ?, holder_pid = ?, holder_heartbeat = ? "
                "WHERE id = ?",
                [self.host, os.getpid(), now(), sweep_id],
            )

    def sweep_heartbeat(self, sweep_id: str) -> None:
        """The coordinator of the sweep is alive."""
        with self._write() as db:
            db.execute(
                "UPDATE sweeps SET holder_heartbeat = ? WHERE id = ? AND holder_host = ? "
                "AND holder_pid = ?",
                [now(), sweep_id, self.host, os.getpid()],
            )

    def release_sweep(self, sweep_id: str) -> None:
        """This process no longer coordinates the sweep (if it did)."""
        with self._write() as db:
            db.execute(
                "UPDATE sweeps SET holder_host = NULL, holder_pid = NULL, holder_heartbeat = NULL "
                "WHERE id = ? AND holder_host = ? AND holder_pid = ?",
                [sweep_id, self.host, os.getpid()],
            )

    def get_sweep(self, ref: str) -> Row:
        """A sweep by id or name (the newest of that name), spec decoded."""
        rows = self._rows(
            "SELECT * FROM sweeps WHERE id = ? OR name = ? ORDER BY created_at DESC LIMIT 1",
            [ref, ref],
        )
        if not rows:
            known = ", ".join(row["name"] for row in self.sweeps()) or "none"
            raise StoreError(f"unknown sweep {ref!r} in {self.path} (sweeps: {known})")
        row = rows[0]
        row["spec"] = json.loads(row["spec"])
        return row

    def create_sweep(self, name: str, spec: Mapping[str, Any]) -> str:
        """Record a sweep (its runs name it in `sweep`); returns its id."""
        row = {"id": new_id("s"), "name": name, "spec": json.dumps(spec), "created_at": now()}
        with self._write() as db:
            db.table("sweeps").insert(row)
        return str(row["id"])

    def sweeps(self) -> list[Row]:
        """Sweeps, newest first, spec decoded."""
        rows = self._rows("SELECT * FROM sweeps ORDER BY created_at DESC, rowid DESC")
        for row in rows:
            row["spec"] = json.loads(row["spec"])
        return rows
