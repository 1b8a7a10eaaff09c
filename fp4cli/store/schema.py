"""The store's file: where it is, how it is opened, and its versioned schema.

The schema version is `PRAGMA user_version`: `MIGRATIONS[v]` takes a file from version v to
v + 1. Pending migrations run when the file is opened, in the transaction that bumps the
version, so two processes opening an old file at once migrate it exactly once. A released
migration is frozen: a schema change is a new function appended to MIGRATIONS.

A file that lacks a table its version has is damaged: it is refused, never repaired. The
commands that only read open the file read-only (connect_read_only): they neither write nor
migrate it, and read a read-only file or mount.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

from sqlite_utils import Database

DEFAULT_PATH = "runs/fp4.db"
STATUSES = ("running", "finished", "failed", "diverged", "interrupted")
BUSY_TIMEOUT_MS = 30_000


class StoreError(ValueError):
    """An unreadable store, an unknown run or a bad argument; the message is one line."""


def store_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The store file: `path`, else $FP4_STORE, else runs/fp4.db (relative to the cwd)."""
    return Path(path or os.environ.get("FP4_STORE") or DEFAULT_PATH)


def _v1_tables(db: Database) -> None:
    db.table("runs").create(
        {
            "id": str, "name": str, "task": str, "recipe": str, "seed": int, "status": str,
            "config": str, "tags": str, "sweep": str, "started_at": str, "ended_at": str,
            "step": int, "diverged_step": int, "message": str, "device": str,
            "torch_version": str, "triton_version": str, "versions": str, "git_revision": str,
            "host": str, "pid": int, "heartbeat_at": str,
        },
        pk="id",
        not_null=["task", "recipe", "status", "config", "tags", "versions", "started_at"],
    )  # fmt: skip
    db.table("metrics").create(
        {"run_id": str, "step": int, "name": str, "value": float},
        not_null=["run_id", "step", "name"],  # value NULL is a NaN
    )
    db.table("metrics").create_index(["run_id", "name", "step"])
    db.table("quant_stats").create(
        {"run_id": str, "step": int, "layer": str, "operand": str, "metric": str, "value": float},
        not_null=["run_id", "step", "layer", "operand", "metric"],
    )
    db.table("quant_stats").create_index(["run_id", "step"])
    db.table("checkpoints").create(
        {"run_id": str, "step": int, "path": str, "created_at": str},
        not_null=["run_id", "step", "path", "created_at"],
    )
    db.table("checkpoints").create_index(["run_id", "step"])
    db.table("benchmarks").create(
        {
            "id": int, "created_at": str, "kind": str, "device": str, "torch_version": str,
            "triton_version": str, "versions": str, "config": str, "name": str, "value": float,
            "unit": str,
        },
        pk="id",
        not_null=["created_at", "kind", "versions", "config", "name"],
    )  # fmt: skip
    db.table("benchmarks").create_index(["kind", "created_at"])
    db.table("sweeps").create(
        {"id": str, "name": str, "spec": str, "created_at": str},
        pk="id",
        not_null=["spec", "created_at"],
    )


def _v2_distributed_runs(db: Database) -> None:
    runs = db.table("runs")
    runs.add_column("world_size", int, not_null_default=1)
    runs.add_column("parallel", str, not_null_default="none")


def _v3_layer_shapes(db: Database) -> None:
    """The shapes of a run's linear layers' GEMMs (for cost estimates): tokens = rows of the
    layer's input per step (M), in_features (K), out_features (N)."""
    db.table("layers").create(
        {
            "run_id": str, "layer": str, "tokens": int, "in_features": int, "out_features": int,
            "quantized": int,
        },
        not_null=["run_id", "layer", "tokens", "in_features", "out_features", "quantized"],
    )  # fmt: skip
    db.table("layers").create_index(["run_id"])
    db.table("sweeps").create_index(["name"])


def _v4_one_writer(db: Database) -> None:
    """One row per (run, step, name) of metrics and per (run, step, layer, operand, metric) of
    statistics (a duplicate written before: the last one is kept), and the sweeps' holders: the
    coordinating process (host, pid) and its heartbeat."""
    db.execute(
        "DELETE FROM metrics WHERE rowid NOT IN "
        "(SELECT MAX(rowid) FROM metrics GROUP BY run_id, step, name)"
    )
    db.execute("DROP INDEX IF EXISTS idx_metrics_run_id_name_step")
    db.table("metrics").create_index(["run_id", "name", "step"], unique=True)
    db.execute(
        "DELETE FROM quant_stats WHERE rowid NOT IN (SELECT MAX(rowid) FROM quant_stats "
        "GROUP BY run_id, step, layer, operand, metric)"
    )
    db.table("quant_stats").create_index(
        ["run_id", "step", "layer", "operand", "metric"], unique=True
    )
    sweeps = db.table("sweeps")
    sweeps.add_column("holder_host", str)
    sweeps.add_column("holder_pid", int)
    sweeps.add_column("holder_heartbeat", str)


def _v5_merged_shards(db: Database) -> None:
    """The shard files (one run each, written by a remote job) already folded into this store:
    merging a shard again is a no-op."""
    db.table("merged_shards").create(
        {"run_id": str, "file": str, "point": str, "status": str, "merged_at": str},
        pk="run_id",
        not_null=["file", "status", "merged_at"],
    )


MIGRATIONS: list[Callable[[Database], None]] = [
    _v1_tables,
    _v2_distributed_runs,
    _v3_layer_shapes,
    _v4_one_writer,
    _v5_merged_shards,
]
SCHEMA_VERSION = len(MIGRATIONS)
TABLES_ADDED = {  # version -> the tables its migration created
    1: ("runs", "metrics", "quant_stats", "checkpoints", "benchmarks", "sweeps"),
    3: ("layers",),
    5: ("merged_shards",),
}


def tables_at(version: int) -> list[str]:
    """The tables a store of schema `version` has."""
    return [table for v, added in TABLES_ADDED.items() if v <= version for table in added]


@contextlib.contextmanager
def write(db: Database) -> Iterator[Database]:
    """One short write transaction. BEGIN IMMEDIATE takes the write lock up front (waiting for it
    up to the busy timeout) instead of upgrading a read lock mid-transaction, which fails at
    once with "database is locked" when another process wrote in between."""
    conn = db.conn
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def connect(path: Path, wal: bool = True) -> Database:
    """Open (creating if missing) the store at `path`: WAL mode (or, with `wal=False`, a
    rollback journal: a shard file on a shared filesystem), busy timeout, migrated."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = Database(path, execute_plugins=False)
    except (OSError, sqlite3.Error) as error:
        raise StoreError(f"cannot open run store {path}: {error}") from None
    try:
        _retry_while_locked(lambda: _set_up(db, path, wal))
    except BaseException as error:
        db.close()
        if isinstance(error, sqlite3.DatabaseError):
            raise StoreError(f"cannot open run store {path}: {error}") from None
        raise
    return db


def connect_read_only(path: Path) -> Database:
    """Open the existing store at `path` for reading only (see read_only_uri): nothing is
    written to it, even where it could be. An older schema is migrated in a copy held in
    memory; the file stays as it is."""
    try:
        db = Database(sqlite3.connect(read_only_uri(path), uri=True), execute_plugins=False)
    except (OSError, sqlite3.Error) as error:
        raise StoreError(f"cannot open run store {path}: {error}") from None
    try:
        db.conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        _check_readable(db, path)
        if _version(db) < SCHEMA_VERSION:
            db = _migrated_copy(db, path)
    except BaseException as error:
        db.close()
        if isinstance(error, sqlite3.DatabaseError):
            raise StoreError(f"cannot open run store {path}: {error}") from None
        raise
    return db


def read_only_uri(path: Path) -> str:
    """SQLite's URI of `path` opened read-only (mode=ro), and immutable=1 where its folder
    cannot be written (a read-only mount): there, SQLite could not create the -wal and -shm
    files that reading a WAL file needs."""
    resolved = path.resolve()
    uri = f"file:{urllib.parse.quote(str(resolved))}?mode=ro"
    if not os.access(resolved.parent, os.W_OK):
        uri += "&immutable=1"
    return uri


def _check_readable(db: Database, path: Path) -> None:
    """StoreError unless `db` is a whole run store this fp4cli can read."""
    version = _version(db)
    _refuse_newer(version, path)
    if version == 0 and db.table_names():
        raise StoreError(f"{path} is an SQLite database but not a run store")
    if version == 0:
        raise StoreError(f"{path} is empty: not a run store yet")
    check_tables(db, path)


def _migrated_copy(db: Database, path: Path) -> Database:
    """A copy of `db` in memory, migrated to this fp4cli's schema (`db` is closed)."""
    memory = sqlite3.connect(":memory:")
    try:
        db.conn.backup(memory)
    finally:
        db.close()
    copy = Database(memory, execute_plugins=False)
    _migrate(copy, path)
    return copy


def _set_up(db: Database, path: Path, wal: bool) -> None:
    conn = db.conn
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    check_tables(db, path)  # before anything is written: a damaged file is left as it is
    mode = "wal" if wal else "delete"  # WAL needs every process on one host (shared memory)
    if conn.execute("PRAGMA journal_mode").fetchone()[0] != mode:
        conn.execute(f"PRAGMA journal_mode = {mode.upper()}")  # persistent: once per file
    # Both survive a killed process. WAL: durable when a process dies. A shard (rollback
    # journal) is written by one process and synced once, when its run ends (shards.py): a
    # sync per transaction would cost one round trip to a network filesystem per metric row.
    conn.execute(f"PRAGMA synchronous = {'NORMAL' if wal else 'OFF'}")
    _migrate(db, path)


def _retry_while_locked(action: Callable[[], None]) -> None:
    """Run `action`, again after a short random pause while SQLite says the file is locked, up
    to the busy timeout. Switching a new file to WAL can fail at once, without waiting, when
    several processes open it together (SQLite does not call the busy handler there)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            action()
            return
        except sqlite3.OperationalError as error:
            locked = "locked" in str(error) or "busy" in str(error)
            if not locked or time.monotonic() > deadline:
                raise
            time.sleep(0.01 + 0.04 * random.random())


def _migrate(db: Database, path: Path) -> None:
    if _version(db) == SCHEMA_VERSION:
        return
    with write(db):  # read the version again under the lock: another process may have migrated
        version = _version(db)
        _refuse_newer(version, path)
        if version == 0 and db.table_names():
            raise StoreError(f"{path} is an SQLite database but not a run store")
        for migration in MIGRATIONS[version:]:
            migration(db)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def check_tables(db: Database, path: Path) -> None:
    """StoreError if the file lacks a table that its recorded schema version has (a store
    damaged by hand or by a tool): such a file is refused, never repaired."""
    version = _version(db)
    if version > SCHEMA_VERSION:  # a newer fp4cli's file: _migrate refuses it
        return
    present = set(db.table_names())
    missing = [table for table in tables_at(version) if table not in present]
    if len(missing) == 1:
        raise StoreError(f"run store {path} is damaged: its table {missing[0]} is missing")
    if missing:
        names = ", ".join(missing)
        raise StoreError(f"run store {path} is damaged: its tables {names} are missing")


def _refuse_newer(version: int, path: Path) -> None:
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"run store {path} has schema version {version}, newer than this fp4cli "
            f"knows ({SCHEMA_VERSION}): upgrade fp4cli"
        )


def _version(db: Database) -> int:
    return int(db.conn.execute("PRAGMA user_version").fetchone()[0])
