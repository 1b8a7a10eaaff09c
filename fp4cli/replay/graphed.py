"""A host program replayed from a CUDA graph: one graph launch instead of its steps' launches.

`GraphedProgram(program, inputs)` captures one run of a `HostProgram` on buffers of the
inputs' layouts. A call copies its inputs into those buffers, replays the graph, and returns
the result with every tensor the program made copied out of the graph's memory. So each call
gets tensors of its own, as a replay of the program does, and one graph serves every layer of
a signature. The copies cost device time, the launches they replace cost host time: the
cache (`cache.ProgramCache`) replays graphs only where `cache.graphs` asks for them.

A program is graphed only where a graph replays it exactly:

- every step is an aten operation, a compiled kernel's launch or a host step that only
  enqueues device work (`recorder.HostStepOptions.graphable`; another host step may decide on
  the host, which a graph would not repeat);
- the only inputs it changes are those an aten step writes in place or a launch names as
  written (a layer's count of calls): a call copies their buffers back into them, with what
  the graph made;
- the graph's first replay gives the program's bits, in its result and in the inputs it
  writes (`GraphedProgram.checked_call`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.replay.program import HostProgram
from fp4cli.replay.recorder import CallStep, LaunchStep, OpStep, Slot


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
        if isinstance(step, CallStep) and not step.graphable:
            return f"its host step {step.function.__qualname__} runs on the host"
        if isinstance(step, LaunchStep) and step.compiled is None:
            return "it launches under the Triton interpreter"
    return None


def captured(
    program: HostProgram, inputs: Sequence[torch.Tensor | None]
) -> tuple[torch.cuda.CUDAGraph, Any]:
    """A CUDA graph of one run of `program` on `inputs`, captured on a side stream (nothing
    runs), and the run's result: the tensors it made live in the graph's memory."""
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph.capture_begin(capture_error_mode="thread_local")
        try:
            result = program(inputs)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return graph, result


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
        read_buffers = [(i, b) for i, b in enumerate(self._buffers) if b is not None]
        self._read = [i for i, _ in read_buffers]
        self._buffers_read = ByteCopies([b for _, b in read_buffers])
        self._copy_in(inputs)
        self._graph, result = captured(program, self._buffers)
        self._made: list[torch.Tensor] = []
        self._result = _leaves(result, self._buffers, self._made)
        self._written = sorted(_inputs_written(program))
        written_buffers = [self._buffers[i] for i in self._written]
        self._copies_out = ByteCopies([*self._made, *written_buffers])  # type: ignore[list-item]

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        self._copy_in(inputs)
        self._graph.replay()
        made = [torch.empty_like(t) for t in self._made]  # dense, in the made tensor's order
        written = [inputs[i] for i in self._written]
        self._copies_out.copy_out([*made, *written])  # type: ignore[list-item]
        return _rebuilt(self._result, inputs, made)

    def _copy_in(self, inputs: Sequence[torch.Tensor | None]) -> None:
        """The inputs into the buffers."""
        self._buffers_read.copy_in([inputs[i] for i in self._read])  # type: ignore[misc]

    def checked_call(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        """One call, once the graph has been checked against the program, each run on copies
        of `inputs`. Raises GraphRefused, with `inputs` untouched, where the bits differ or the
        program writes into an input that no step names as written (`_inputs_written`). This
        waits for the device: it runs once a program."""
        expected_inputs = [_copy_of(t) for t in inputs]
        expected = self.program(expected_inputs)
        for index, (copy, tensor) in enumerate(zip(expected_inputs, inputs, strict=True)):
            if index not in self._written and not _same_or_none(copy, tensor):
                raise GraphRefused("the program writes into its inputs")
        graphed_inputs = [_copy_of(t) for t in inputs]
        got = self(graphed_inputs)
        pairs = zip(graphed_inputs, expected_inputs, strict=True)
        if not _same_results(got, expected) or not all(_same_or_none(g, e) for g, e in pairs):
            raise GraphRefused("its graph gave other bits than the program")
        return self(inputs)


class ByteCopies:
    """Copies between a graph's own tensors and a call's tensors of the same sizes and strides,
    both ways. A multi-tensor copy launches once only where all its tensors share a dtype, so
    the dense ones (no gaps, no overlaps: all a graph's buffers, nearly all it makes) are copied
    as flat bytes in one copy; any others in a second."""

    def __init__(self, own: list[torch.Tensor]) -> None:
        self.own = own
        dense = [is_dense(t) for t in own]
        self._dense = [i for i, d in enumerate(dense) if d]
        self._strided = [i for i, d in enumerate(dense) if not d]
        self._own_bytes = [as_bytes(own[i]) for i in self._dense]

    def copy_in(self, sources: Sequence[torch.Tensor]) -> None:
        """`sources` into the own tensors."""
        if self._dense:
            torch._foreach_copy_(self._own_bytes, [as_bytes(sources[i]) for i in self._dense])
        if self._strided:
            own = [self.own[i] for i in self._strided]
            torch._foreach_copy_(own, [sources[i] for i in self._strided])

    def copy_out(self, targets: Sequence[torch.Tensor]) -> None:
        """The own tensors into `targets`."""
        if self._dense:
            torch._foreach_copy_([as_bytes(targets[i]) for i in self._dense], self._own_bytes)
        if self._strided:
            own = [self.own[i] for i in self._strided]
            torch._foreach_copy_([targets[i] for i in self._strided], own)


def is_dense(tensor: torch.Tensor) -> bool:
    """Whether the tensor's elements fill one block of memory, each once (its strides, sorted,
    are a contiguous tensor's)."""
    if tensor.numel() == 0:
        return True
    extent = 1
    dims = zip(tensor.stride(), tensor.shape, strict=True)
    for stride, size in sorted((stride, size) for stride, size in dims if size > 1):
        if stride != extent:
            return False
        extent *= size
    return True


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A dense tensor's memory as one flat uint8 view: it spans exactly its elements, in
    whatever order its strides lay them."""
    return tensor.as_strided((tensor.numel(),), (1,)).view(torch.uint8)


def _inputs_written(program: HostProgram) -> set[int]:
    """The inputs a step writes in place: an aten step's in-place operation or `out=` (its
    output is the input's slot), a launch's arguments that it names `written`."""
    written: set[int] = set()
    for step in program.recording.steps:
        if isinstance(step, OpStep):
            outputs = step.outputs if isinstance(step.outputs, tuple) else (step.outputs,)
        elif isinstance(step, LaunchStep):
            outputs = tuple(step.args[i] for i in step.written)
        else:
            continue
        written.update(s.index for s in outputs if isinstance(s, Slot) and s.is_input)
    return written


def _copy_of(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """A copy of `tensor` with its strides (a program is recorded for its inputs' strides)."""
    if tensor is None:
        return None
    copy = _buffer_like(tensor)
    copy.copy_(tensor)
    return copy


def _same_or_none(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return same_bits(a, b)


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
