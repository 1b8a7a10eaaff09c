"""The stop signals of a run: Ctrl-C (SIGINT) and SIGTERM raise once, a second signal while
the first is handled is ignored, and a run remembers that one came (a library may catch what
the handler raised)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any


class Stop(Exception):
    """Raised from a signal handler to end the loop cleanly (status `interrupted`)."""


PEER_STOP_WAIT_S = 10.0  # torchrun ends the other ranks within its monitor interval


def stopped_within(seconds: float) -> bool:
    """Whether a stop signal (Ctrl-C, SIGTERM) reaches this process within `seconds`."""
    try:
        time.sleep(seconds)
    except (KeyboardInterrupt, Stop):
        return True
    return False


class Signals:
    """Whether a stop signal reached this process during the run (a library may catch the
    exception the signal raised: torch.distributed.checkpoint wraps what any rank raises),
    and whether the run is recording how it ended. Only the first signal raises, and none
    while the run ends: torchrun sends SIGINT, then SIGTERM, milliseconds apart."""

    received = False
    ending = False


def _stop_handler(stop: type[BaseException]) -> Any:
    """A signal handler that raises `stop` for the first signal only."""

    def handle(signum: int, frame: Any) -> None:
        first = not Signals.received
        Signals.received = True
        if first and not Signals.ending:
            raise stop()

    return handle


def install_stop_handler() -> Any:
    """SIGTERM raises Stop and Ctrl-C KeyboardInterrupt, once; both are remembered. Returns
    what to restore."""
    Signals.received = Signals.ending = False
    previous_interrupt = None
    if threading.current_thread() is threading.main_thread():
        previous_interrupt = signal.signal(signal.SIGINT, _stop_handler(KeyboardInterrupt))
    return signal.signal(signal.SIGTERM, _stop_handler(Stop)), previous_interrupt


def restore_handlers(previous: Any) -> None:
    term, interrupt = previous
    signal.signal(signal.SIGTERM, term)
    if interrupt is not None:
        signal.signal(signal.SIGINT, interrupt)


@contextlib.contextmanager
def stop_signals(on_term: type[BaseException] = KeyboardInterrupt) -> Iterator[None]:
    """For a command's whole life: the first SIGINT raises KeyboardInterrupt and the first
    SIGTERM `on_term` (a run in progress takes either as its own stop); later ones are
    ignored, so that a process already stopping ends without a traceback. SIGINT is handled
    even where it was inherited ignored. The previous handlers come back after, unless a
    stop signal came: the process is ending, and later signals stay ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    Signals.received = Signals.ending = False
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, _stop_handler(KeyboardInterrupt)),
        signal.SIGTERM: signal.signal(signal.SIGTERM, _stop_handler(on_term)),
    }
    try:
        yield
    finally:
        for sig, earlier in previous.items():
            signal.signal(sig, signal.SIG_IGN if Signals.received else earlier)
