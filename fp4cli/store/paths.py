"""Paths the user names (a store, a folder of shards) that the operating system may refuse: a
name too long, a permission, a file where a folder was wanted. Each refusal becomes one
StoreError line that names the path, shortened, and the system's reason."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fp4cli.pathtext import refused_path_message
from fp4cli.store.schema import StoreError


def refused_path_error(path: str | os.PathLike[Any], error: OSError) -> StoreError:
    """The one-line error for `path` that the system refused with `error`."""
    return StoreError(refused_path_message(path, error))


@contextlib.contextmanager
def refusals_as_store_errors(path: str | os.PathLike[Any]) -> Iterator[None]:
    """Inside the block, an OSError about `path` is a StoreError naming it."""
    try:
        yield
    except OSError as error:
        raise refused_path_error(path, error) from None


def path_exists(path: str | os.PathLike[Any]) -> bool:
    """Whether `path` exists; StoreError when the system refuses to look (a name too long)."""
    with refusals_as_store_errors(path):
        return Path(path).exists()


def is_folder(path: str | os.PathLike[Any]) -> bool:
    """Whether `path` is a folder; StoreError when the system refuses to look."""
    with refusals_as_store_errors(path):
        return Path(path).is_dir()
