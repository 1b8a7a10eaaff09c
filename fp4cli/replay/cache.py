"""Host programs by call signature: `ProgramCache.run(key, function, inputs)`.

The first call of a signature runs directly (it compiles kernels, autotunes, fills the host
code's own caches), the second is recorded (`recorder.record`), and every later one replays
the recording (`program.HostProgram`), on CUDA from a graph of it where `graphs` asks for it
(`graphed.GraphedProgram`). A signature (`_signature`) is the caller's key
(everything non-tensor the function decides by) and each input tensor's shape, strides, dtype,
device and 16-byte alignment (what Triton specializes a kernel on). A recording that is
refused leaves its signature on direct calls, with the reason kept (`refusals`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from fp4cli.replay.graphed import GraphedProgram, GraphRefused, graph_gap
from fp4cli.replay.program import HostProgram, ReplayMismatch
from fp4cli.replay.recorder import record
from fp4cli.replay.resident import ResidentGraph, SharedInputs, pointers_key

CAPACITY = 512  # signatures kept; the least recently used goes first
GRAPH_AFTER = 2  # replays of a program before it is captured in a graph
GRAPH_CAPACITY = 64  # graphs held at once: each holds one call's inputs, outputs, temporaries
RESIDENT_PER_PROGRAM = 32  # resident graphs of one program (by its inputs' addresses)
RESIDENT_CAPACITY = 256  # resident graphs held at once: each holds one call's results, temporaries


@dataclass
class _Entry:
    calls: int = 0
    program: HostProgram | None = None
    refusal: str | None = None
    replays: int = 0
    graph: GraphedProgram | None = None
    graph_refusal: str | None = None
    residents: OrderedDict[Hashable, ResidentGraph] = field(default_factory=OrderedDict)
    sightings: dict[Hashable, int] = field(default_factory=dict)  # addresses not yet graphed
    resident_refusal: str | None = None
    shared: SharedInputs | None = None  # the copied inputs' buffers of its resident graphs


_SWITCH = threading.local()
GRAPH_MODES = ("off", "auto", "always", "resident")
_GRAPHS = {"mode": "off"}  # for the whole process: a backward pass runs in autograd's thread


def graph_mode() -> str:
    """How recorded programs on CUDA use CUDA graphs (`graphs`)."""
    return _GRAPHS["mode"]


@contextlib.contextmanager
def graphs(mode: str) -> Iterator[None]:
    """Within, in every thread, a recorded program on CUDA replays from a CUDA graph of it:

    - "auto": while the device waits on the host, that is where the device has run all the
      work issued up to the previous program's call;
    - "always": on every call;
    - "resident": the calls that ask for it (`ProgramCache.run(resident=...)`: a layer's
      forward) from a graph captured on their own input tensors but the moving ones (copied
      into its buffers), where those sit where they did at the capture and nobody holds the
      last replay's results (`resident.ResidentGraph`); the other calls as "off";
    - "off" (the default): never; its steps launch one by one.

    A graph's call costs the host three calls and the device a copy of the inputs and outputs;
    each graph holds the memory of one call's inputs, outputs and temporaries. A resident
    graph's call costs the host a copy of each moving input, one launch and an alias a result;
    each holds the memory of one call's results and temporaries.
    """
    if mode not in GRAPH_MODES:
        raise ValueError(f"graphs: mode {mode!r} is none of {', '.join(GRAPH_MODES)}")
    previous = graph_mode()
    _GRAPHS["mode"] = mode
    try:
        yield
    finally:
        _GRAPHS["mode"] = previous


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
        self._ends: dict[int | None, torch.cuda.Event] = {}  # the last CUDA replay's, by device

    def run(
        self,
        key: Hashable,
        function: Callable[..., Any],
        inputs: Sequence[torch.Tensor | None],
        resident: tuple[int, ...] | None = None,
    ) -> Any:
        """function(*inputs), replayed where this signature has been recorded. resident: the
        call may replay from a resident graph (`graphs("resident")`), the inputs at these
        indices copied into the program's shared buffers (those that move between calls)."""
        if not replay_enabled():
            return function(*inputs)
        signature = _signature(key, inputs)
        if signature is None:
            return function(*inputs)
        entry = self._entry(signature)
        if entry.program is not None:
            if entry.graph_refusal is None and _GRAPHS["mode"] != "off":
                return self._replay_on_cuda(entry, function, inputs, resident)
            return self._replay(entry, function, inputs)
        entry.calls += 1
        if entry.refusal is not None or entry.calls < 2:
            return function(*inputs)
        result, recording, refusal = record(function, inputs)
        if recording is None:
            entry.refusal = refusal
        else:
            entry.program = HostProgram(recording, _device(inputs))
            entry.graph_refusal = graph_gap(entry.program)
        return result

    def _replay(
        self, entry: _Entry, function: Callable[..., Any], inputs: Sequence[torch.Tensor | None]
    ) -> Any:
        assert entry.program is not None
        try:
            return entry.program(inputs)
        except ReplayMismatch as mismatch:  # a host step decided otherwise: call directly
            entry.program, entry.refusal = None, f"{mismatch} returned otherwise on a replay"
            return function(*inputs)

    def _replay_on_cuda(
        self,
        entry: _Entry,
        function: Callable[..., Any],
        inputs: Sequence[torch.Tensor | None],
        resident: tuple[int, ...] | None = None,
    ) -> Any:
        """The replay from the entry's graph or by its steps (`graphs`), the graph captured and
        checked on its GRAPH_AFTER-th call from one."""
        program = entry.program
        assert program is not None
        if torch.cuda.is_current_stream_capturing():
            return self._replay(entry, function, inputs)  # no graph launch inside a capture
        if _GRAPHS["mode"] == "resident":
            if resident is not None and entry.resident_refusal is None:
                return self._replay_resident(entry, function, inputs, resident)
            return self._replay(entry, function, inputs)
        assert program.device is not None
        ended = self._ends.get(program.device.index)
        auto = _GRAPHS["mode"] == "auto"
        if auto and ended is not None and not ended.query():
            result = self._replay(entry, function, inputs)  # the device is busy: no copies
        elif entry.graph is not None:
            result = entry.graph(inputs)
        else:
            entry.replays += 1
            if entry.replays < GRAPH_AFTER:
                result = self._replay(entry, function, inputs)
            else:
                result = self._first_graphed(entry, function, inputs)
        if auto:  # the mark the next call's choice reads
            if ended is None:
                ended = self._ends[program.device.index] = torch.cuda.Event()
            ended.record()
        return result

    def _first_graphed(
        self, entry: _Entry, function: Callable[..., Any], inputs: Sequence[torch.Tensor | None]
    ) -> Any:
        """The entry's graph captured, checked and called; its program's replay where that is
        refused."""
        assert entry.program is not None
        if len(self.graphs()) >= GRAPH_CAPACITY:
            entry.graph_refusal = f"{GRAPH_CAPACITY} graphs are held already"
            return self._replay(entry, function, inputs)
        try:
            graph = GraphedProgram(entry.program, inputs)
            result = graph.checked_call(inputs)
        except (GraphRefused, RuntimeError) as refused:
            entry.graph_refusal = str(refused)
            return self._replay(entry, function, inputs)
        entry.graph = graph
        return result

    def _replay_resident(
        self,
        entry: _Entry,
        function: Callable[..., Any],
        inputs: Sequence[torch.Tensor | None],
        copied: tuple[int, ...],
    ) -> Any:
        """The replay from the entry's resident graph on these inputs' addresses (but the
        `copied` ones) where its last results are free, else by its steps; the graph captured
        and checked on the GRAPH_AFTER-th call at the same addresses."""
        key = pointers_key(inputs, copied)
        graph = entry.residents.get(key)
        if graph is not None:
            if not graph.is_free():
                return self._replay(entry, function, inputs)
            entry.residents.move_to_end(key)
            return graph(inputs)
        seen = entry.sightings.get(key, 0) + 1
        if seen < GRAPH_AFTER or not self._room_for_resident(entry):
            if len(entry.sightings) >= 4 * RESIDENT_PER_PROGRAM:
                entry.sightings.clear()  # addresses that do not come back
            entry.sightings[key] = seen
            return self._replay(entry, function, inputs)
        entry.sightings.pop(key, None)
        assert entry.program is not None
        if entry.shared is None:
            entry.shared = SharedInputs(inputs, copied)
        try:
            graph = ResidentGraph(entry.program, inputs, entry.shared)
        except (GraphRefused, RuntimeError) as refused:  # nothing ran: the inputs are as given
            entry.resident_refusal = str(refused)
            return self._replay(entry, function, inputs)
        checked = graph.checked_call(inputs)
        if checked.same_bits:
            entry.residents[key] = graph
        else:
            entry.resident_refusal = "its resident graph gave other bits than the program"
        return checked.result

    def _room_for_resident(self, entry: _Entry) -> bool:
        """Whether one more resident graph may be held for the entry: under both limits, or
        once the entry's least recently used graph whose results are free is dropped."""
        held = sum(len(e.residents) for e in self._entries.values())
        if len(entry.residents) < RESIDENT_PER_PROGRAM and held < RESIDENT_CAPACITY:
            return True
        for key, graph in entry.residents.items():
            if graph.is_free():
                del entry.residents[key]
                return True
        return False

    def residents(self) -> list[ResidentGraph]:
        return [g for e in self._entries.values() for g in e.residents.values()]

    def resident_refusals(self) -> list[str]:
        """Why each refused program replays without resident graphs."""
        return [e.resident_refusal for e in self._entries.values() if e.resident_refusal]

    def graph_refusals(self) -> list[str]:
        """Why each recorded program replays without a graph."""
        return [e.graph_refusal for e in self._entries.values() if e.graph_refusal is not None]

    def graphs(self) -> list[GraphedProgram]:
        return [e.graph for e in self._entries.values() if e.graph is not None]

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
