"""The cost model's domain error."""

from __future__ import annotations


class CostError(ValueError):
    """An impossible cost request (unknown device, malformed shape): a one-line message."""
