"""A host program replayed from a CUDA graph: one graph launch instead of its steps' launches.

`GraphedProgram(program, inputs)` captures one run of a `HostProgram` on buffers of the
inputs' layouts. A call copies its inputs into those buffers, replays the graph, and returns
the result with every tensor the program made copied out of the graph's memory. So each call
gets tensors of its own, as a replay of the program does, and one graph serves every layer of
a signature. The copies cost device time, the launches they replace cost host time: the
cache (`cache.ProgramCache`) replays graphs only where `cache.graphs` asks for them.

A program is graphed only where a graph replays it exactly:

- every step is an aten operation or a compiled kernel's launch (a host step may decide on
  the host, which a graph would not repeat);
- the program leaves its inputs as it found them (the buffers are copies);
- the graph's first replay gives the program's bits (`GraphedProgram.checked_call`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.replay.program import HostProgram
from fp4cli.replay.recorder import CallStep, LaunchStep, Slot


class GraphRefused(RuntimeError):
    """A program that a graph would not replay exactly."""


@dataclass(frozen=True)
class _Input:
    """A result leaf that is the call's input `index` itself."""

    index: int


@dataclass(frozen=True)
class _Made:
    """A result leaf the graph wrote: the `index`-th of its tensors, copied out on each call."""

    index: int


def graph_gap(program: HostProgram) -> str | None:
    """Why `program` cannot be replayed from a graph, or None."""
    if program.device is None or program.device.type != "cuda":
        return "it does not run on CUDA"
    for step in program.recording.steps:
        if isinstance(step, CallStep):
            return f"its host step {step.function.__qualname__} runs on the host"
        if isinstance(step, LaunchStep) and step.compiled is None:
            return "it launches under the Triton interpreter"
    return None


class GraphedProgram:
    """`program` captured in a CUDA graph (see the module)."""

    def __init__(self, program: HostProgram, inputs: Sequence[torch.Tensor | None]) -> None:
        gap = graph_gap(program)
        if gap is not None:
            raise GraphRefused(gap)
        self.program = program
        read = _inputs_read(program)
        self._buffers = [
            None if t is None or i not in read else _buffer_like(t) for i, t in enumerate(inputs)
        ]
        self._read = [i for i, b in enumerate(self._buffers) if b is not None]
        self._targets = [b for b in self._buffers if b is not None]
        self._copy_in(inputs)
        self._graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._graph.capture_begin(capture_error_mode="thread_local")
            try:
                result = program(self._buffers)
            finally:
                self._graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)
        self._made: list[torch.Tensor] = []
        self._result = _leaves(result, self._buffers, self._made)

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        self._copy_in(inputs)
        self._graph.replay()
        made = [torch.empty_like(t) for t in self._made]  # dense, in the made tensor's order
        torch._foreach_copy_(made, self._made)
        return _rebuilt(self._result, inputs, made)

    def _copy_in(self, inputs: Sequence[torch.Tensor | None]) -> None:
        """The inputs into the buffers, in one multi-tensor copy."""
        torch._foreach_copy_(self._targets, [inputs[i] for i in self._read])  # type: ignore[misc]

    def checked_call(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        """One call, checked against the program run directly on copies of `inputs`. Raises
        GraphRefused where the bits differ or the program wrote into its inputs. This waits
        for the device: it runs once a program."""
        copies = [None if t is None else t.clone() for t in inputs]
        expected = self.program(copies)
        for copy, tensor in zip(copies, inputs, strict=True):
            if copy is not None and tensor is not None and not same_bits(copy, tensor):
                raise GraphRefused("the program writes into its inputs")
        got = self(inputs)
        if not _same_results(got, expected):
            raise GraphRefused("its graph gave other bits than the program")
        return got


def _inputs_read(program: HostProgram) -> set[int]:
    """The inputs some step of the program reads or its result holds (the others need no
    buffer)."""
    read: set[int] = set()

    def visit(value: Any) -> None:
        if isinstance(value, Slot):
            if value.is_input:
                read.add(value.index)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item)

    for step in program.recording.steps:
        visit(step.args)
        visit(getattr(step, "kwargs", {}))
    visit(program.recording.result)
    return read


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shapes, dtypes and bits (NaNs by their bit patterns)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == torch.bool or a.element_size() not in (1, 2, 4, 8):
        return bool(torch.equal(a, b))
    as_int = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return bool(torch.equal(a.contiguous().view(as_int), b.contiguous().view(as_int)))


def _buffer_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.shape, tensor.stride(), dtype=tensor.dtype,
                               device=tensor.device)  # fmt: skip


def _leaves(result: Any, buffers: Sequence[torch.Tensor | None], made: list[torch.Tensor]) -> Any:
    """The result as a template: inputs by index, the tensors the graph made (appended to
    `made`), other values as they are."""
    if isinstance(result, torch.Tensor):
        for index, buffer in enumerate(buffers):
            if buffer is result:
                return _Input(index)
        made.append(result)
        return _Made(len(made) - 1)
    if isinstance(result, (list, tuple)):
        items = [_leaves(r, buffers, made) for r in result]
        return items if isinstance(result, list) else tuple(items)
    return result


def _rebuilt(template: Any, inputs: Sequence[torch.Tensor | None], made: list[torch.Tensor]) -> Any:
    if isinstance(template, _Made):
        return made[template.index]
    if isinstance(template, _Input):
        return inputs[template.index]
    if isinstance(template, list):
        return [_rebuilt(t, inputs, made) for t in template]
    if isinstance(template, tuple):
        return tuple(_rebuilt(t, inputs, made) for t in template)
    return template


def _same_results(got: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and same_bits(got, expected)
    if isinstance(expected, (list, tuple)):
        return (
            type(got) is type(expected)
            and len(got) == len(expected)
            and all(_same_results(g, e) for g, e in zip(got, expected, strict=True))
        )
    return bool(got == expected)
