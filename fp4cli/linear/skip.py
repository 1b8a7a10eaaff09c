"""Which layers a recipe keeps in high precision: its `skip` patterns on module names."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable


def matches_skip(module_name: str, patterns: Iterable[str]) -> bool:
    """Whether a skip pattern (fnmatch) matches the module's full dotted name or its last part."""
    last = module_name.rsplit(".", 1)[-1]
    return any(fnmatch.fnmatchcase(n, p) for p in patterns for n in (module_name, last))
