"""How a path the user named appears in a one-line error: long parts, and the whole, with their
middles cut out; and the message for a path the operating system refused."""

from __future__ import annotations

import os
from typing import Any

MAX_PART_CHARS = 40
MAX_PATH_CHARS = 160


def _cut_middle(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    keep = (limit - 3) // 2
    return text[:keep] + "..." + text[-keep:]


def short_path(path: str | bytes | os.PathLike[Any]) -> str:
    """`path` as text, each long part of it (and the whole) with its middle cut out."""
    parts = os.fsdecode(path).split(os.sep)
    return _cut_middle(os.sep.join(_cut_middle(part, MAX_PART_CHARS) for part in parts),
                       MAX_PATH_CHARS)  # fmt: skip


def refused_path_message(path: str | bytes | os.PathLike[Any], error: OSError) -> str:
    """`cannot use <path>: <the system's reason>`, the path shortened."""
    reason = error.strerror or type(error).__name__
    return f"cannot use {short_path(path)}: {reason}"
