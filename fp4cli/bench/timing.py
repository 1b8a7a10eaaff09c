"""Time of a call: CUDA events around a loop of calls on a GPU, perf_counter on the CPU, or the
replay of a CUDA graph holding the calls (the GPU's time alone, without Python or launches);
and a limit on the wall time of a block (for a compiler that may not finish)."""

from __future__ import annotations

import contextlib
import signal
import statistics
import threading
import time
from collections.abc import Callable, Iterator

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def loop_ms(call: Callable[[], object], iters: int, device: torch.device) -> float:
    """Milliseconds per call over one loop of `iters` calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    began = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - began) * 1e3 / iters


def _graph_ms(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    """Milliseconds per call over one replay of a graph holding `iters` calls."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


TIMINGS = ("loop", "graph")  # calls issued from Python; replayed from a CUDA graph


def check_timing(
    timing: str, device: torch.device | None, choices: tuple[str, ...] = TIMINGS
) -> None:
    """Raise BenchError for a timing not in `choices` (the first: the one without a graph), or
    "graph" off a CUDA device."""
    from fp4cli.bench.configs import BenchError

    if timing not in choices:
        raise BenchError(f"timing: {timing!r} is not one of {', '.join(choices)}")
    if timing == "graph" and device is not None and device.type != "cuda":
        raise BenchError(f"timing graph: CUDA graphs need a CUDA device; use --timing {choices[0]}")


def capture_note(error: BaseException) -> str | None:
    """The note of a call that CUDA graph capture refused (torch names the capture in its
    error), else None."""
    from fp4cli.bench.configs import error_line

    if "captur" not in str(error).lower():
        return None
    return f"cannot be captured in a CUDA graph ({error_line(error, 120)})"


def median_ms(
    call: Callable[[], object],
    device: torch.device,
    iters: int,
    warmup: int = 2,
    repeats: int = 5,
    timing: str = "loop",
) -> float:
    """The median over `repeats` loops of milliseconds per call, after `warmup` calls. timing
    "graph" (CUDA only) captures the loop's `iters` calls in one CUDA graph and times its
    replays, so that the host's cost of issuing the calls does not count."""
    for _ in range(warmup):
        call()
    synchronize(device)
    if timing == "loop":
        return statistics.median(loop_ms(call, iters, device) for _ in range(repeats))
    check_timing(timing, device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            call()
    graph.replay()  # the first replay uploads the graph
    return statistics.median(_graph_ms(graph, iters) for _ in range(repeats))


def host_us(
    call: Callable[[], object], device: torch.device, iters: int, repeats: int = 5
) -> float:
    """Microseconds of host time per call: the median over `repeats` loops of the time taken
    to issue `iters` calls, the device synchronized before each loop and not within it (the
    GPU runs behind the host; a loop's launches fit its queue). On the CPU the call's whole
    time."""
    times = []
    for _ in range(repeats):
        synchronize(device)
        began = time.perf_counter()
        for _ in range(iters):
            call()
        times.append((time.perf_counter() - began) * 1e6 / iters)
    synchronize(device)
    return statistics.median(times)


class TimeLimitExceeded(BaseException):
    """Raised in the main thread when a `time_limit` expires (a BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way out swallows it)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Interrupt the body with TimeLimitExceeded after `seconds` of wall time. Only in the main
    thread of a platform with SIGALRM; elsewhere, or for seconds <= 0, there is no limit."""
    in_main = threading.current_thread() is threading.main_thread()
    if seconds <= 0 or not in_main or not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeLimitExceeded(f"gave up after {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
