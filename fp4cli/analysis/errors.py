"""The analysis commands' error: a request the stored data cannot answer, in one line."""

from __future__ import annotations


class AnalysisError(ValueError):
    """An empty store, a run without the statistics asked for, a bad option; one line."""
