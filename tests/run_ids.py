"""Run-id prefixes for the tests of commands that take a unique prefix of a run id."""

from __future__ import annotations

from collections.abc import Iterable


def unique_prefix(run_id: str, others: Iterable[str], drop: int = 2) -> str:
    """run_id less its last `drop` characters, or less fewer where another id of the store
    starts alike (ids made in the same second differ only in their 4 random hex digits); the
    whole id when no shorter prefix is unique."""
    others = [other for other in others if other != run_id]
    for length in range(len(run_id) - drop, len(run_id)):
        if not any(other.startswith(run_id[:length]) for other in others):
            return run_id[:length]
    return run_id
