"""The run store: one SQLite file that every run, benchmark and sweep writes to.

Many processes write to one file at once (a sweep's workers, a benchmark, `fp4 runs list`), so
the file is in WAL mode with a long busy timeout, and every write is one short transaction that
takes the write lock first (schema.write). Open one `RunStore` per process.

A process killed outright loses nothing it committed; its run says `running` until the next
`RunStore` opened on the file sees that the process is gone (or, for a run on another host,
that its heartbeat is stale) and marks it `interrupted`.

Everything here speaks plain Python types (no torch). A NaN metric reads back as NaN (SQLite
stores a NaN REAL as NULL).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import sqlite3
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from sqlite_utils import Database

from fp4cli.store.host import git_revision, gone_runs, new_id, now
from fp4cli.store.paths import path_exists
from fp4cli.store.schema import (
    STATUSES,
    StoreError,
    connect,
    connect_read_only,
    store_path,
    write,
)
from fp4cli.store.sweeps import STALE_AFTER_S, Row, SweepRecords


class RunStore(SweepRecords):
    """The run store at `path` (default: $FP4_STORE, else runs/fp4.db), created if missing.

    Opening migrates an older file and marks the runs whose process is gone as interrupted.
    `create=False` refuses a missing file instead of creating it. `wal=False` keeps a rollback
    journal instead of WAL: for a shard that one process on a cluster node writes on a shared
    filesystem, where WAL's shared memory does not reach the other machines (unset: WAL unless
    $FP4_STORE_WAL is 0, as a multi-node training job sets it for its shard).

    `read_only=True`, for the commands that only read: the file must exist, is opened with
    SQLite's mode=ro (a read-only file or mount reads too) and is never written, not even
    migrated; a run whose process is gone reads as `interrupted` without being marked so.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        create: bool = True,
        wal: bool | None = None,
        read_only: bool = False,
    ):
        if wal is None:
            wal = os.environ.get("FP4_STORE_WAL", "1") != "0"
        self.path = store_path(path)
        self.read_only = read_only
        if not path_exists(self.path) and (read_only or not create):
            raise StoreError(f"no run store at {self.path}")
        self.host = socket.gethostname()
        self.db = connect_read_only(self.path) if read_only else connect(self.path, wal)
        self._gone: dict[str, str] = {}  # read-only: run id -> why its process is gone
        try:
            self._identity = _file_identity(self.path)
            _check_intact(self.db, self.path)
            if read_only:
                self._gone = dict(gone_runs(self._running(), self.host, STALE_AFTER_S))
            else:
                self.mark_interrupted()
        except (sqlite3.DatabaseError, OSError) as error:
            self.db.close()
            raise StoreError(f"cannot read run store {self.path}: {error}") from None
        except StoreError:
            self.db.close()
            raise

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[Database]:
        """One write transaction on the file this store opened: StoreError if the file was
        removed or replaced meanwhile (the rows would go nowhere) or cannot be written."""
        if self.read_only:
            raise StoreError(f"run store {self.path} is open for reading only")
        try:
            identity = _file_identity(self.path)
        except OSError:
            identity = None
        if identity != self._identity:
            raise StoreError(
                f"run store {self.path} was removed or replaced while this process used it"
            )
        try:
            with write(self.db) as db:
                yield db
        except sqlite3.OperationalError as error:
            raise StoreError(f"cannot write run store {self.path}: {error}") from None

    def transaction(self) -> contextlib.AbstractContextManager[Database]:
        """One write transaction, for the store's own modules that write several tables at
        once (shards.py folds a shard's run into this store atomically)."""
        return self._write()

    def _rows(self, sql: str, params: list[Any] | dict[str, Any] | None = None) -> list[Row]:
        try:
            return list(self.db.query(sql, params))
        except sqlite3.DatabaseError as error:
            raise StoreError(f"cannot read run store {self.path}: {error}") from None

    # Runs: written by the trainer.

    def create_run(
        self,
        task: str,
        recipe: str,
        seed: int,
        config: Mapping[str, Any],
        device: str,
        versions: Mapping[str, str | None],
        tags: Iterable[str] = (),
        sweep: str | None = None,
        name: str | None = None,
        world_size: int = 1,
        parallel: str = "none",
    ) -> str:
        """Record a new run as `running` by this process; returns its id (sortable by time).
        `versions` maps package -> version ('torch', 'triton' get columns of their own)."""
        tags = [tags] if isinstance(tags, str) else list(tags)
        started = now()
        row: Row = {
            "name": name, "task": task, "recipe": recipe, "seed": int(seed), "status": "running",
            "config": json.dumps(config, sort_keys=True), "tags": json.dumps(tags),
            "sweep": sweep, "started_at": started, "heartbeat_at": started, "device": device,
            **_version_columns(versions), "git_revision": git_revision(), "host": self.host,
            "pid": os.getpid(), "world_size": int(world_size), "parallel": parallel,
        }  # fmt: skip
        for _ in range(10):  # an id collides only with one made in the same second
            row["id"] = new_id("r")
            try:
                with self._write() as db:
                    db.table("runs").insert(row)
                return str(row["id"])
            except sqlite3.IntegrityError:
                continue
        raise StoreError(f"could not find an unused run id in {self.path}")

    def reopen_run(self, run_id: str, step: int) -> None:
        """Resume a run from `step` in this process: `running` again, and the rows the earlier
        attempt wrote after `step` are dropped (the resumed run writes them again). A run that a
        live process is training is refused: one writer per run."""
        with self._write() as db:
            self._refuse_live(run_id)
            cursor = db.execute(
                "UPDATE runs SET status = 'running', step = ?, heartbeat_at = ?, ended_at = NULL, "
                "message = NULL, diverged_step = NULL, host = ?, pid = ? WHERE id = ?",
                [step, now(), self.host, os.getpid(), run_id],
            )
            self._found(cursor.rowcount, run_id)
            for table in ("metrics", "quant_stats", "checkpoints"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ? AND step > ?", [run_id, step])

    def check_resumable(self, run_id: str) -> None:
        """StoreError if a live process other than this one trains `run_id` (checked again,
        atomically, by reopen_run)."""
        with self._write():
            self._refuse_live(run_id)

    def _refuse_live(self, run_id: str) -> None:
        """Inside a write: StoreError if `run_id` is running in a live process other than this."""
        row = self.db.execute(
            "SELECT status, host, pid, started_at, heartbeat_at FROM runs WHERE id = ?", [run_id]
        ).fetchone()
        if row is None or row[0] != "running":
            return
        status, host, pid, started_at, heartbeat_at = row
        if host == self.host and pid == os.getpid():
            return
        holder = {"id": run_id, "host": host, "pid": pid, "started_at": started_at,
                  "heartbeat_at": heartbeat_at}  # fmt: skip
        if not gone_runs([holder], self.host, STALE_AFTER_S):
            raise StoreError(
                f"run {run_id} is being trained by process {pid} on {host} (last heard of at "
                f"{heartbeat_at}); wait for it to end or stop it first"
            )

    def log_metrics(self, run_id: str, step: int, values: Mapping[str, float]) -> None:
        """One row per named value at `step`, in one transaction (a value logged again at the
        same step replaces the first)."""
        rows = [(run_id, step, name, float(value)) for name, value in values.items()]
        with self._write() as db:
            self._touch(run_id, step)
            db.table("metrics").insert_all(
                [("run_id", "step", "name", "value"), *rows], replace=True
            )

    def log_quant_stats(
        self, run_id: str, step: int, rows: Iterable[tuple[str, str, str, float]]
    ) -> None:
        """(layer, operand, metric, value) rows at `step`, in one transaction."""
        records = [(run_id, step, la, op, me, float(value)) for la, op, me, value in rows]
        columns = ("run_id", "step", "layer", "operand", "metric", "value")
        with self._write() as db:
            self._touch(run_id, step)
            db.table("quant_stats").insert_all([columns, *records], replace=True)

    def log_layers(self, run_id: str, layers: Iterable[tuple[str, int, int, int, bool]]) -> None:
        """(layer, tokens, in_features, out_features, quantized) of each linear layer, once per
        run (a resumed run keeps the first attempt's rows)."""
        rows = [(run_id, name, m, k, n, int(q)) for name, m, k, n, q in layers]
        columns = ("run_id", "layer", "tokens", "in_features", "out_features", "quantized")
        with self._write() as db:
            if db.execute("SELECT 1 FROM layers WHERE run_id = ?", [run_id]).fetchone():
                return
            db.table("layers").insert_all([columns, *rows])

    def layers(self, run_id: str) -> list[Row]:
        """{layer, tokens, in_features, out_features, quantized} rows of a run."""
        rows = self._rows(
            "SELECT layer, tokens, in_features, out_features, quantized FROM layers "
            "WHERE run_id = ? ORDER BY rowid",
            [run_id],
        )
        for row in rows:
            row["quantized"] = bool(row["quantized"])
        return rows

    def add_checkpoint(self, run_id: str, step: int, path: str | os.PathLike[str]) -> None:
        row = {"run_id": run_id, "step": step, "path": str(path), "created_at": now()}
        with self._write() as db:
            self._touch(run_id, step)
            db.table("checkpoints").insert(row)

    def heartbeat(self, run_id: str, step: int) -> None:
        """The run is alive and has reached `step`."""
        with self._write():
            self._touch(run_id, step)

    def _touch(self, run_id: str, step: int) -> None:
        """Inside a write: record `step` and a heartbeat. A run marked interrupted while the
        process that writes it was alive (a stale heartbeat on another host) is running again."""
        cursor = self.db.execute(
            "UPDATE runs SET step = MAX(COALESCE(step, :step), :step), heartbeat_at = :now, "
            "ended_at = CASE WHEN status = 'interrupted' AND host = :host AND pid = :pid "
            "THEN NULL ELSE ended_at END, "
            "message = CASE WHEN status = 'interrupted' AND host = :host AND pid = :pid "
            "THEN NULL ELSE message END, "
            "status = CASE WHEN status = 'interrupted' AND host = :host AND pid = :pid "
            "THEN 'running' ELSE status END WHERE id = :id",
            {"step": step, "now": now(), "host": self.host, "pid": os.getpid(), "id": run_id},
        )
        self._found(cursor.rowcount, run_id)

    def _found(self, rowcount: int, run_id: str) -> None:
        if rowcount == 0:
            raise StoreError(f"unknown run {run_id!r} in {self.path}")

    def finish_run(
        self,
        run_id: str,
        status: str,
        step: int | None = None,
        message: str | None = None,
        diverged_step: int | None = None,
    ) -> None:
        """End a run with `status` (finished, failed, diverged, interrupted); None keeps a field."""
        if status not in STATUSES[1:]:
            raise StoreError(f"a run cannot end as {status!r}: one of {', '.join(STATUSES[1:])}")
        with self._write() as db:
            cursor = db.execute(
                "UPDATE runs SET status = ?, ended_at = ?, step = COALESCE(?, step), "
                "message = COALESCE(?, message), diverged_step = COALESCE(?, diverged_step) "
                "WHERE id = ?",
                [status, now(), step, message, diverged_step, run_id],
            )
            self._found(cursor.rowcount, run_id)

    def mark_interrupted(self, stale_after: float = STALE_AFTER_S) -> list[str]:
        """Mark `interrupted` every running run whose process is gone: on this host, its pid
        is not alive; on another, its heartbeat is older than `stale_after` seconds. The run's
        ended_at is its last heartbeat. Returns the ids marked."""
        running = self._running()
        gone = gone_runs(running, self.host, stale_after)
        if gone:
            heartbeats = {run["id"]: run["heartbeat_at"] for run in running}
            with self._write() as db:
                for run_id, why in gone:  # unless it sent a heartbeat meanwhile
                    db.execute(
                        "UPDATE runs SET status = 'interrupted', message = ?, "
                        "ended_at = COALESCE(heartbeat_at, started_at) "
                        "WHERE id = ? AND status = 'running' AND heartbeat_at IS ?",
                        [why, run_id, heartbeats[run_id]],
                    )
        return [run_id for run_id, _ in gone]

    def _running(self) -> list[Row]:
        return self._rows(
            "SELECT id, host, pid, started_at, heartbeat_at FROM runs WHERE status = 'running'"
        )

    def _as_run(self, row: Row) -> Row:
        """A runs row decoded; in a read-only store, a running run whose process is gone
        reads as what opening the store for writing would have made it: interrupted."""
        run = _decode_run(row)
        why = self._gone.get(run["id"])
        if why is not None and run["status"] == "running":
            ended = run["heartbeat_at"] or run["started_at"]
            run.update(status="interrupted", message=why, ended_at=ended)
        return run

    def _status_condition(self, status: str) -> tuple[str, list[Any]]:
        """SQL that keeps the runs of `status`, counting the runs of self._gone as
        interrupted."""
        gone = list(self._gone)
        if not gone or status not in ("running", "interrupted"):
            return "status = ?", [status]
        marks = ", ".join("?" for _ in gone)
        if status == "running":
            return f"(status = ? AND id NOT IN ({marks}))", [status, *gone]
        return f"(status = ? OR id IN ({marks}))", [status, *gone]

    def delete_run(self, run_id: str) -> str:
        """Delete a run (id or unique prefix) and all its rows; checkpoint files stay on disk.
        Returns the full id."""
        full_id = self.get_run(run_id)["id"]
        with self._write() as db:
            for table in ("metrics", "quant_stats", "checkpoints", "layers"):
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", [full_id])
            db.execute("DELETE FROM runs WHERE id = ?", [full_id])
        return str(full_id)

    # Runs: read by the analysis commands. Ids are full ids; get_run also takes a prefix.

    def get_run(self, run_id: str) -> Row:
        """A run by id or unique id prefix, config and tags decoded."""
        rows = self._rows("SELECT * FROM runs WHERE id = ?", [run_id])
        if not rows and run_id:
            rows = self._rows(
                "SELECT * FROM runs WHERE substr(id, 1, ?) = ? ORDER BY id LIMIT 5",
                [len(run_id), run_id],
            )
        if not rows:
            raise StoreError(f"unknown run {run_id!r} in {self.path}")
        if len(rows) > 1:
            ids = ", ".join(row["id"] for row in rows)
            raise StoreError(f"run prefix {run_id!r} is ambiguous: {ids}")
        return self._as_run(rows[0])

    def list_runs(
        self,
        status: str | None = None,
        task: str | None = None,
        recipe: str | None = None,
        sweep: str | None = None,
        tag: str | None = None,
        limit: int | None = None,
    ) -> list[Row]:
        """Runs matching every filter given, newest first."""
        if status is not None and status not in STATUSES:
            raise StoreError(f"unknown status {status!r}: one of {', '.join(STATUSES)}")
        where: list[str] = []
        params: list[Any] = []
        if status is not None:
            condition, values = self._status_condition(status)
            where.append(condition)
            params.extend(values)
        for column, value in (
            ("task", task),
            ("recipe", recipe),
            ("sweep", sweep),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if tag is not None:
            where.append("EXISTS (SELECT 1 FROM json_each(runs.tags) WHERE value = ?)")
            params.append(tag)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [self._as_run(row) for row in self._rows(sql, params)]

    def metrics(self, run_id: str, name: str | None = None) -> list[Row]:
        """{step, name, value} rows of a run (or of one metric), by name then step."""
        sql = "SELECT step, name, value FROM metrics WHERE run_id = ?"
        params: list[Any] = [run_id]
        if name is not None:
            sql += " AND name = ?"
            params.append(name)
        rows = self._rows(sql + " ORDER BY name, step, rowid", params)
        for row in rows:
            row["value"] = _value(row["value"])
        return rows

    def final_metrics(self, run_id: str, names: Iterable[str] | None = None) -> dict[str, float]:
        """Each metric's value at its last step (of the given names, where logged)."""
        if names is None:  # distinct names by index seeks, not a scan of every row
            names = [
                row["name"]
                for row in self._rows(
                    "WITH RECURSIVE n(name) AS (SELECT MIN(name) FROM metrics WHERE run_id = :r "
                    "UNION ALL SELECT (SELECT MIN(name) FROM metrics WHERE run_id = :r AND "
                    "name > n.name) FROM n WHERE n.name IS NOT NULL) "
                    "SELECT name FROM n WHERE name IS NOT NULL",
                    {"r": run_id},
                )
            ]
        final = {}
        for name in names:
            rows = self._rows(
                "SELECT value FROM metrics WHERE run_id = ? AND name = ? "
                "ORDER BY step DESC, rowid DESC LIMIT 1",
                [run_id, name],
            )
            if rows:
                final[name] = _value(rows[0]["value"])
        return final

    def quant_stats(
        self,
        run_id: str,
        step: int | None = None,
        layer: str | None = None,
        operand: str | None = None,
        metric: str | None = None,
    ) -> list[Row]:
        """{step, layer, operand, metric, value} rows of a run, filtered by the fields given."""
        sql = "SELECT step, layer, operand, metric, value FROM quant_stats WHERE run_id = ?"
        params: list[Any] = [run_id]
        filters = {"step": step, "layer": layer, "operand": operand, "metric": metric}
        for column, value in filters.items():
            if value is not None:
                sql += f" AND {column} = ?"
                params.append(value)
        rows = self._rows(sql + " ORDER BY step, layer, operand, metric", params)
        for row in rows:
            row["value"] = _value(row["value"])
        return rows

    def quant_stats_summary(self, run_id: str) -> Row | None:
        """The last statistics step of a run: {step, rows: [{operand, metric, layers, mean,
        min, max}]} over its layers; None if the run has no quant stats."""
        (found,) = self._rows(
            "SELECT MAX(step) AS last FROM quant_stats WHERE run_id = ?", [run_id]
        )
        last = found["last"]
        if last is None:
            return None
        rows = self._rows(
            "SELECT operand, metric, COUNT(*) AS layers, AVG(value) AS mean, MIN(value) AS min, "
            "MAX(value) AS max FROM quant_stats WHERE run_id = ? AND step = ? "
            "GROUP BY operand, metric ORDER BY operand, metric",
            [run_id, last],
        )
        return {"step": last, "rows": rows}

    def checkpoints(self, run_id: str) -> list[Row]:
        """{step, path, created_at} rows of a run, oldest first."""
        return self._rows(
            "SELECT step, path, created_at FROM checkpoints WHERE run_id = ? ORDER BY step, rowid",
            [run_id],
        )

    def latest_checkpoint(self, run_id: str) -> Row | None:
        """The checkpoint at the highest step (the newest of equals), or None."""
        rows = self.checkpoints(run_id)
        return rows[-1] if rows else None

    # Benchmarks and sweeps.

    def log_benchmark(
        self,
        kind: str,
        device: str,
        versions: Mapping[str, str | None],
        config: Mapping[str, Any],
        name: str,
        value: float,
        unit: str,
    ) -> int:
        """One measurement (e.g. kind 'gemm', name 'tflops', unit 'TFLOP/s'); returns its id."""
        row = {
            "created_at": now(), "kind": kind, "device": device, **_version_columns(versions),
            "config": json.dumps(config, sort_keys=True), "name": name, "value": float(value),
            "unit": unit,
        }  # fmt: skip
        with self._write() as db:
            rowid = db.table("benchmarks").insert(row).last_rowid
        assert rowid is not None
        return rowid

    def benchmarks(self, kind: str | None = None) -> list[Row]:
        """Benchmark rows (of one kind), oldest first, config decoded."""
        sql, params = "SELECT * FROM benchmarks", []
        if kind is not None:
            sql, params = sql + " WHERE kind = ?", [kind]
        rows = self._rows(sql + " ORDER BY created_at, id", params)
        for row in rows:
            row.update(config=json.loads(row["config"]), versions=json.loads(row["versions"]))
            row["value"] = _value(row["value"])
        return rows


def _file_identity(path: Any) -> tuple[int, int]:
    stat = os.stat(path)
    return stat.st_dev, stat.st_ino


def _check_intact(db: Database, path: Any) -> None:
    """StoreError naming the first problem SQLite's quick check finds in the file."""
    problems = [row[0] for row in db.execute("PRAGMA quick_check(3)").fetchall()]
    if problems != ["ok"]:
        found = " ".join("; ".join(str(p) for p in problems).split())[:200]
        raise StoreError(
            f"run store {path} is damaged ({found}); copy what still reads with "
            f"`sqlite3 {path} .recover` and use a new store"
        )


def _value(value: float | None) -> float:
    return math.nan if value is None else value


def _decode_run(row: Row) -> Row:
    decoded = {key: json.loads(row[key]) for key in ("config", "tags", "versions")}
    return {**row, **decoded}


def _version_columns(versions: Mapping[str, str | None]) -> Row:
    columns = {f"{key}_version": versions.get(key) for key in ("torch", "triton")}
    return {**columns, "versions": json.dumps(dict(versions), sort_keys=True)}
