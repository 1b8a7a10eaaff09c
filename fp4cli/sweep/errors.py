"""The sweep's errors: a sweep file that cannot be run (one line naming the file and key), and
a sweep stopped by a signal."""

from __future__ import annotations


class SweepError(ValueError):
    """A bad sweep file or option; the message is one line."""


class SweepStopped(Exception):
    """The sweep was stopped (Ctrl-C, SIGTERM); what finished is in the store."""
