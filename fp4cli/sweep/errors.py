"""The sweep's error: a sweep file that cannot be run, in one line naming the file and key."""

from __future__ import annotations


class SweepError(ValueError):
    """A bad sweep file or option; the message is one line."""
