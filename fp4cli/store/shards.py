"""Shards: run stores that jobs on other machines write, folded into the main store later.

SQLite's WAL mode needs every process that opens a file on one host (they share memory), so a
job on a cluster node never opens the main store. It trains into a shard of its own, a store
file with a rollback journal under a shared folder, and the coordinating process (`fp4 sweep`,
`fp4 runs merge DIR`) folds finished shards into the main store:

    DIR/<key>.claim          JSON: the host, pid and job that writes <key> (created exclusively)
    DIR/<key>.db.partial     the shard being written (one run); never read by the merge
    DIR/<key>-<run id>.db    a finished shard: renamed into place once its run has ended

A key is what the job trains (a sweep point's id). A claim whose holder is gone (on this host:
its pid is dead; on another: neither file changed for STALE_AFTER_S) is taken over, so a killed
job's point is trained again and never by two live jobs at once.

Merging a shard inserts its run and every row of it in one transaction and records the run in
the `merged_shards` table: merging again changes nothing, a shard that cannot be read yet (half
copied, damaged) is skipped and tried again next time, and a second finished run of a sweep
point that already has one is recorded but not inserted (no duplicate run).

A run the store already holds (a copy of a store among the shards) is replaced only by a copy
that holds every row of it and is at least as far: an older or a different copy is a conflict,
reported and left out, and the store's copy is kept. The store merged into is never read as a
shard of itself.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fp4cli.store.host import now, process_alive
from fp4cli.store.runstore import STALE_AFTER_S, RunStore
from fp4cli.store.schema import SCHEMA_VERSION, StoreError

RUN_TABLES = ("metrics", "quant_stats", "checkpoints", "layers")  # rows keyed by run_id
DONE_STATUSES = ("finished", "diverged")
POINT_TAG = "point:"


@dataclass(frozen=True)
class Claim:
    """The right to write the shard of `key` in `folder`."""

    folder: Path
    key: str

    @property
    def claim_file(self) -> Path:
        return self.folder / f"{self.key}.claim"

    @property
    def partial(self) -> Path:
        return self.folder / f"{self.key}.db.partial"

    def open_store(self) -> RunStore:
        """The shard's store (a rollback journal, no WAL), created empty."""
        return RunStore(self.partial, wal=False)

    def complete(self, run_id: str) -> Path:
        """The run has ended: rename the shard into place (merges see it from now on) and
        give up the claim."""
        final = self.folder / f"{self.key}-{run_id}.db"
        _sync(self.partial)  # on disk before it is named finished (it was written unsynced)
        os.replace(self.partial, final)
        _sync(self.folder)
        self.claim_file.unlink(missing_ok=True)
        return final

    def release(self) -> None:
        """Give up the claim without a shard (nothing was trained)."""
        self.clear_partial()
        self.claim_file.unlink(missing_ok=True)

    def clear_partial(self) -> None:
        """Remove a partial shard and its journal (a dead holder's, or an untrained one)."""
        self.partial.unlink(missing_ok=True)
        for journal in self.folder.glob(f"{self.key}.db.partial-*"):
            journal.unlink(missing_ok=True)


def _sync(path: Path) -> None:
    """fsync a file, or a folder (its entries); a filesystem that cannot sync folders is left
    as it is."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def claim(folder: str | os.PathLike[str], key: str, job: str = "") -> Claim | None:
    """Claim `key` in `folder` for this process; None if a live process holds it. A stale claim
    (its holder gone) and its partial shard are removed and claimed afresh."""
    folder = Path(folder).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    taken = Claim(folder, key)
    holder = {"host": socket.gethostname(), "pid": os.getpid(), "job": job, "at": now()}
    for _ in range(3):
        try:
            fd = os.open(taken.claim_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if holder_alive(taken):
                return None
            _take_over(taken)
            continue
        with os.fdopen(fd, "w") as file:
            json.dump(holder, file)
        taken.clear_partial()  # a dead holder's file, if any
        return taken
    return None


def break_claim(folder: str | os.PathLike[str], key: str) -> None:
    """Remove the claim of `key` and its partial shard: for a holder known to be gone (its
    Slurm job ended) whose claim still looks alive by its recent writes."""
    stale = Claim(Path(folder).resolve(), key)
    _take_over(stale)
    stale.clear_partial()


def _take_over(stale: Claim) -> None:
    """Move a dead holder's claim aside; of several processes doing this at once, one wins."""
    aside = stale.claim_file.with_name(f"{stale.claim_file.name}.stale-{os.getpid()}")
    try:
        os.replace(stale.claim_file, aside)
    except FileNotFoundError:
        return
    aside.unlink(missing_ok=True)


def read_holder(taken: Claim) -> dict[str, Any] | None:
    try:
        holder = json.loads(taken.claim_file.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def holder_alive(taken: Claim) -> bool:
    """Whether the process that claimed `taken` still writes it: on this host, its pid lives;
    on another, its claim or partial shard changed within STALE_AFTER_S. A claim being written
    right now (no holder readable yet) counts as alive."""
    holder = read_holder(taken)
    last = _last_change(taken)
    if holder is None:
        return last is not None and time.time() - last < 5.0
    if holder.get("host") == socket.gethostname():
        return process_alive(holder.get("pid"), last or 0.0)
    return last is not None and time.time() - last < STALE_AFTER_S


def _last_change(taken: Claim) -> float | None:
    times = []
    for path in (taken.claim_file, taken.partial):
        try:
            times.append(path.stat().st_mtime)
        except OSError:
            continue
    return max(times) if times else None


def live_claims(folder: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """key -> holder of every claim in `folder` whose holder is alive."""
    folder = Path(folder)
    found = {}
    for path in sorted(folder.glob("*.claim")) if folder.is_dir() else []:
        taken = Claim(folder, path.name.removesuffix(".claim"))
        if holder_alive(taken):
            found[taken.key] = read_holder(taken) or {}
    return found


def finished_shards(folder: str | os.PathLike[str]) -> list[Path]:
    """The shards in `folder` whose run has ended, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    shards = [p for p in folder.glob("*.db") if p.is_file()]
    return sorted(shards, key=lambda p: (p.stat().st_mtime, p.name))


MERGED = "merged"  # inserted, or replaced an older copy that it holds whole
MERGED_BEFORE = "merged before"  # in the merged_shards table: nothing done
ALREADY_THERE = "already there"  # the store holds the same run: nothing done
LEFT_OUT = "left out"  # a second finished run of a sweep point: recorded, not inserted
CONFLICT = "conflict"  # the store holds another copy of the run: kept, nothing done


@dataclass(frozen=True)
class RunMerge:
    """What merging did with one run of a shard file."""

    run_id: str
    file: str
    outcome: str  # one of MERGED, MERGED_BEFORE, ALREADY_THERE, LEFT_OUT, CONFLICT
    why: str = ""  # a conflict's reason


@dataclass
class MergeResult:
    runs: list[RunMerge] = field(default_factory=list)  # in the order merged
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (file, why): tried later
    target: str | None = None  # the store's own file, found in the folder and not read

    def _ids(self, outcome: str) -> list[str]:
        return [run.run_id for run in self.runs if run.outcome == outcome]

    @property
    def merged(self) -> list[str]:  # run ids now in the store
        return self._ids(MERGED)

    @property
    def already(self) -> list[str]:
        return self._ids(MERGED_BEFORE)

    @property
    def present(self) -> list[str]:
        return self._ids(ALREADY_THERE)

    @property
    def duplicates(self) -> list[str]:
        return self._ids(LEFT_OUT)

    @property
    def conflicts(self) -> list[RunMerge]:
        return [run for run in self.runs if run.outcome == CONFLICT]


def merge_shards(
    store: RunStore, folder: str | os.PathLike[str], sweep: str | None = None
) -> MergeResult:
    """Fold every finished shard of `folder` into `store` (see the module's docstring); with
    `sweep`, only the runs of that sweep (a folder may hold an older store's shards)."""
    result = MergeResult()
    merged = {row["run_id"] for row in store.db.query("SELECT run_id FROM merged_shards")}
    for path in finished_shards(folder):
        if _same_file(path, store.path):
            result.target = path.name
            continue
        run_id = run_of_file(path)
        if run_id in merged:  # merged before: not read again
            result.runs.append(RunMerge(str(run_id), path.name, MERGED_BEFORE))
            continue
        try:
            shard = read_shard(path)
        except StoreError as error:
            result.skipped.append((path.name, str(error)))
            continue
        for run in shard.runs:
            if sweep is None or run.get("sweep") == sweep:
                result.runs.append(_merge_run(store, path, run, shard.rows_of(run["id"])))
    return result


def _same_file(path: Path, other: Path) -> bool:
    try:
        return os.path.samefile(path, other)
    except OSError:
        return False


def run_of_file(path: Path) -> str | None:
    """The run id in a finished shard's name (<key>-<run id>.db; keys hold no '-')."""
    key, sep, run_id = path.name.removesuffix(".db").partition("-")
    return run_id if sep else None


@dataclass
class Shard:
    runs: list[dict[str, Any]]
    rows: dict[str, list[dict[str, Any]]]  # table -> rows (every run's)

    def rows_of(self, run_id: str) -> dict[str, list[dict[str, Any]]]:
        return {t: [r for r in rows if r["run_id"] == run_id] for t, rows in self.rows.items()}


def read_shard(path: Path) -> Shard:
    """Every row of a finished shard, read without locking or writing it (it is never written
    again); StoreError if it is not a complete run store."""
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as error:
        raise StoreError(f"cannot open shard {path.name}: {error}") from None
    try:
        conn.row_factory = sqlite3.Row
        check = [row[0] for row in conn.execute("PRAGMA quick_check(1)").fetchall()]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if check != ["ok"] or not 4 <= version <= SCHEMA_VERSION:
            raise StoreError(f"shard {path.name} is not a complete run store ({check[0]})")
        runs = [dict(row) for row in conn.execute("SELECT * FROM runs")]
        rows = {t: [dict(r) for r in conn.execute(f"SELECT * FROM {t}")] for t in RUN_TABLES}
    except sqlite3.Error as error:
        raise StoreError(f"cannot read shard {path.name}: {error}") from None
    finally:
        conn.close()
    if any(run["status"] == "running" for run in runs):
        raise StoreError(f"shard {path.name} holds a run that has not ended")
    return Shard(runs, rows)


def _merge_run(
    store: RunStore, path: Path, run: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> RunMerge:
    """Insert one run of a shard in one transaction (see RunMerge)."""
    run_id, point = run["id"], point_of(run.get("tags"))
    with store.transaction() as db:
        if db.execute("SELECT 1 FROM merged_shards WHERE run_id = ?", [run_id]).fetchone():
            return RunMerge(run_id, path.name, MERGED_BEFORE)
        outcome, why = _against_stored_copy(db, run, rows)
        if outcome != MERGED:
            return RunMerge(run_id, path.name, outcome, why)
        duplicate = point is not None and _has_done_run(db, run, point)
        if not duplicate:
            for table in (*RUN_TABLES, "runs"):
                db.execute(f"DELETE FROM {table} WHERE {_id_column(table)} = ?", [run_id])
            _insert(db, "runs", [run])
            for table, table_rows in rows.items():
                _insert(db, table, table_rows)
        status = "duplicate" if duplicate else run["status"]
        ledger = {"run_id": run_id, "file": path.name, "point": point, "status": status,
                  "merged_at": now()}  # fmt: skip
        db.table("merged_shards").insert(ledger)
    return RunMerge(run_id, path.name, LEFT_OUT if duplicate else MERGED)


def _against_stored_copy(
    db: Any, run: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> tuple[str, str]:
    """(outcome, why) of merging `run` over the store's copy of it, if any: MERGED where the
    store has none, or where this copy holds every row of the store's and is at least as far;
    ALREADY_THERE for the same copy; CONFLICT otherwise."""
    stored_run = db.execute("SELECT step, status FROM runs WHERE id = ?", [run["id"]]).fetchone()
    if stored_run is None:
        return MERGED, ""
    tables = {"runs": [run], **rows}
    stored = {table: _stored_rows(db, table, run["id"]) for table in tables}
    shard = {table: _row_counts(db, table, table_rows) for table, table_rows in tables.items()}
    if stored == shard:
        return ALREADY_THERE, ""
    stored_step, step = stored_run[0] or 0, run.get("step") or 0
    lacking = sum(sum((stored[t] - shard[t]).values()) for t in rows)
    if step < stored_step:
        return CONFLICT, f"the store's copy reached step {stored_step}, this one step {step}"
    if stored_run[1] == "running":
        return CONFLICT, "the store's copy is still running"
    if lacking:
        return CONFLICT, f"the store's copy has {_plural(lacking, 'row')} that this one lacks"
    return MERGED, ""


def _stored_rows(db: Any, table: str, run_id: str) -> Counter[tuple[Any, ...]]:
    """The store's rows of `run_id` in `table`, as tuples of the table's columns."""
    columns = ", ".join(f'"{c}"' for c in db.table(table).columns_dict)
    found = db.execute(f"SELECT {columns} FROM {table} WHERE {_id_column(table)} = ?", [run_id])
    return Counter(map(tuple, found))


def _row_counts(db: Any, table: str, rows: list[dict[str, Any]]) -> Counter[tuple[Any, ...]]:
    """A shard's rows as tuples of the store's columns of `table` (None where it has none)."""
    columns = list(db.table(table).columns_dict)
    return Counter(tuple(row.get(c) for c in columns) for row in rows)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def _has_done_run(db: Any, run: dict[str, Any], point: str) -> bool:
    """Whether the run's sweep already holds another finished or diverged run of `point`."""
    found = db.execute(
        "SELECT 1 FROM runs WHERE sweep IS ? AND id != ? AND status IN ('finished', 'diverged') "
        "AND EXISTS (SELECT 1 FROM json_each(runs.tags) WHERE value = ?)",
        [run.get("sweep"), run["id"], POINT_TAG + point],
    ).fetchone()
    return found is not None


def _id_column(table: str) -> str:
    return "id" if table == "runs" else "run_id"


def _insert(db: Any, table: str, rows: Iterable[dict[str, Any]]) -> None:
    """Insert rows, keeping the columns this store's table has (a shard of the same schema
    has the same ones)."""
    rows = list(rows)
    if not rows:
        return
    columns = [c for c in rows[0] if c in db.table(table).columns_dict]
    marks = ", ".join("?" for _ in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    db.conn.executemany(
        f"INSERT OR REPLACE INTO {table} ({names}) VALUES ({marks})",
        [[row[c] for c in columns] for row in rows],
    )


def point_of(tags: Any) -> str | None:
    """The sweep point a run's tags name (`point:<id>`), if any."""
    if isinstance(tags, str):
        try:
            tags = json.loads(tags)
        except ValueError:
            return None
    for tag in tags or []:
        if isinstance(tag, str) and tag.startswith(POINT_TAG):
            return tag[len(POINT_TAG) :]
    return None
