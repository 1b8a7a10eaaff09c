"""The run store: one SQLite file (runs/fp4.db) with every run, metric, quant stat, checkpoint,
benchmark and sweep. `RunStore` is the way in; see runstore.py for how it stays consistent when
many processes write and some are killed, schema.py for the file and its migrations."""

from fp4cli.store.runstore import RunStore
from fp4cli.store.schema import DEFAULT_PATH, SCHEMA_VERSION, STATUSES, StoreError, store_path

__all__ = ["DEFAULT_PATH", "SCHEMA_VERSION", "STATUSES", "RunStore", "StoreError", "store_path"]
