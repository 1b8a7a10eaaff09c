"""Host programs by call signature: `ProgramCache.run(key, function, inputs)`.

The first call of a signature runs directly (it compiles kernels, autotunes, fills the host
code's own caches), the second is recorded (`recorder.record`), and every later one replays
the recording (`program.HostProgram`). A signature (`_signature`) is the caller's key
(everything non-tensor the function decides by) and each input tensor's shape, strides, dtype,
device and 16-byte alignment (what Triton specializes a kernel on). A recording that is
refused leaves its signature on direct calls, with the reason kept (`refusals`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.replay.program import HostProgram, ReplayMismatch
from fp4cli.replay.recorder import record

CAPACITY = 512  # signatures kept; the least recently used goes first


@dataclass
class _Entry:
    calls: int = 0
    program: HostProgram | None = None
    refusal: str | None = None


_SWITCH = threading.local()


def replay_enabled() -> bool:
    """Whether calls may replay (on unless turned off in this thread by `replays(False)`)."""
    return getattr(_SWITCH, "on", True)


@contextlib.contextmanager
def replays(enabled: bool) -> Iterator[None]:
    """Within: calls replay recorded programs (True, the default) or always run directly."""
    previous = replay_enabled()
    _SWITCH.on = enabled
    try:
        yield
    finally:
        _SWITCH.on = previous


class ProgramCache:
    """Recorded host programs by signature (see the module), at most `capacity` of them."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def run(
        self,
        key: Hashable,
        function: Callable[..., Any],
        inputs: Sequence[torch.Tensor | None],
    ) -> Any:
        """function(*inputs), replayed where this signature has been recorded."""
        if not replay_enabled():
            return function(*inputs)
        signature = _signature(key, inputs)
        if signature is None:
            return function(*inputs)
        entry = self._entry(signature)
        if entry.program is not None:
            try:
                return entry.program(inputs)
            except ReplayMismatch as mismatch:  # a host step decided otherwise: call directly
                entry.program, entry.refusal = None, f"{mismatch} returned otherwise on a replay"
                return function(*inputs)
        entry.calls += 1
        if entry.refusal is not None or entry.calls < 2:
            return function(*inputs)
        result, recording, refusal = record(function, inputs)
        if recording is None:
            entry.refusal = refusal
        else:
            entry.program = HostProgram(recording, _device(inputs))
        return result

    def _entry(self, signature: Hashable) -> _Entry:
        with self._lock:
            entry = self._entries.get(signature)
            if entry is None:
                entry = self._entries[signature] = _Entry()
                while len(self._entries) > self.capacity:
                    self._entries.popitem(last=False)
            else:
                self._entries.move_to_end(signature)
            return entry

    def refusals(self) -> list[str]:
        """Why each refused signature runs directly."""
        return [e.refusal for e in self._entries.values() if e.refusal is not None]

    def programs(self) -> list[HostProgram]:
        return [e.program for e in self._entries.values() if e.program is not None]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def _signature(key: Hashable, inputs: Sequence[torch.Tensor | None]) -> Hashable | None:
    """(key, each input's shape, strides, dtype, device and 16-byte alignment, the current CUDA
    device or -1), or None where one tensor is given as two inputs (a recording names each
    input once)."""
    metas: list[Hashable] = [key]
    seen: set[int] = set()
    cuda = False
    for tensor in inputs:
        if tensor is None:
            metas.append(None)
            continue
        if id(tensor) in seen:
            return None
        seen.add(id(tensor))
        cuda = cuda or tensor.is_cuda
        metas.append(
            (tensor.shape, tensor.stride(), tensor.dtype, tensor.device,
             tensor.data_ptr() % 16 == 0)
        )  # fmt: skip
    # compiled kernels are loaded on the device current at the recording
    metas.append(torch.cuda.current_device() if cuda else -1)
    return tuple(metas)


def _device(inputs: Sequence[torch.Tensor | None]) -> torch.device | None:
    for tensor in inputs:
        if tensor is not None and tensor.device.type == "cuda":
            return torch.device("cuda", torch.cuda.current_device())
    return None
