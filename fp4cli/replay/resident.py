"""A host program replayed from a CUDA graph on its caller's own tensors, its results left
in the graph's memory.

`graphed.GraphedProgram` copies each call's inputs into its buffers and what the graph made
out of its memory, so that one graph serves any tensors. In a training loop a layer's forward
call reads the same parameters and buffers at every step: they do not move. A `ResidentGraph`
is captured on those tensors themselves. The inputs that move (`copied`: the activations) are
copied into buffers that the program's resident graphs share (`SharedInputs`). A call whose
other inputs sit at the captured addresses copies those, replays the graph, and returns aliases
of the tensors the graph made. So a call costs the host a copy an activation, the replay and an
alias a result, where a replayed program costs each of its steps.

The graph writes its results into the same memory on every replay. So a replay waits until
nobody holds the last call's results: each result tensor's storage is referenced by the graph's
own tensors alone (`is_free`). Where a result is still held (the autograd graph of a step not yet
run backward, a tensor kept by the caller), the call replays the program's steps instead
(`cache.ProgramCache`). Each resident graph holds the memory of one call's results and
temporaries for as long as it lives.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

import torch

from fp4cli.replay.graphed import (
    GraphRefused,
    _buffer_like,
    _copy_of,
    _Input,
    _inputs_written,
    _leaves,
    _rebuilt,
    _same_or_none,
    _same_results,
    captured,
    graph_gap,
)
from fp4cli.replay.program import HostProgram


def pointers_key(inputs: Sequence[torch.Tensor | None], copied: Sequence[int] = ()) -> Hashable:
    """Where each input's memory starts (0 for None and for the `copied` inputs): a resident
    graph's key beside the program's signature (which holds the shapes, strides and dtypes)."""
    return tuple(0 if t is None or i in copied else t.data_ptr() for i, t in enumerate(inputs))


class SharedInputs:
    """The buffers a program's resident graphs read their copied inputs from, one an input,
    made like the first call's. Each call copies its input in just before its replay, in the
    stream's order, so graphs of one program may share them: none returns them
    (`ResidentGraph` refuses a program that does)."""

    def __init__(self, inputs: Sequence[torch.Tensor | None], copied: Sequence[int]) -> None:
        self.buffers: dict[int, torch.Tensor] = {
            index: _buffer_like(tensor) for index in copied if (tensor := inputs[index]) is not None
        }

    def inputs(self, inputs: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """`inputs` with each copied one replaced by its buffer (not yet filled)."""
        return [self.buffers.get(i, t) for i, t in enumerate(inputs)]

    def fill(self, inputs: Sequence[torch.Tensor | None]) -> None:
        for index, buffer in self.buffers.items():
            source = inputs[index]
            assert source is not None  # the signature holds which inputs are None
            buffer.copy_(source)


class CheckedCall(NamedTuple):
    """A resident graph's first call: its result, and whether the graph gave the program's
    bits (else the result is the program's)."""

    result: Any
    same_bits: bool


class ResidentGraph:
    """`program` captured in a CUDA graph on `inputs` themselves, but for those `shared`
    holds buffers for (see the module)."""

    def __init__(
        self,
        program: HostProgram,
        inputs: Sequence[torch.Tensor | None],
        shared: SharedInputs,
    ) -> None:
        gap = graph_gap(program)
        if gap is not None:
            raise GraphRefused(gap)
        self.program, self.shared = program, shared
        self.key = pointers_key(inputs, tuple(shared.buffers))
        self.replays = 0
        graph_inputs = shared.inputs(inputs)
        self._graph, result = captured(program, graph_inputs)
        made: list[torch.Tensor] = []
        self._result = _leaves(result, graph_inputs, made)
        del result
        if _returns_shared(self._result, made, shared):
            raise GraphRefused("its result holds an input copied into a shared buffer")
        self._made = made
        self._written = sorted(_inputs_written(program))
        self._storages = _storage_counts(made)

    def is_free(self) -> bool:
        """Whether nobody but the graph holds the tensors its last replay made."""
        return all(torch._C._storage_Use_Count(c) == n for c, n in self._storages.items())

    def __call__(self, inputs: Sequence[torch.Tensor | None]) -> Any:
        """The replay on `inputs` (those not copied at the addresses it was captured on;
        `is_free`)."""
        self.shared.fill(inputs)
        self._graph.replay()
        self.replays += 1
        return _rebuilt(self._result, inputs, [t.detach() for t in self._made])

    def checked_call(self, inputs: Sequence[torch.Tensor | None]) -> CheckedCall:
        """The first call: the program on copies of `inputs`, then the graph on `inputs`,
        compared in their results and in the inputs the program writes. Where they differ,
        the result is the program's and the written inputs hold what the program wrote. Waits
        for the device: once a graph."""
        expected_inputs = [_copy_of(t) for t in inputs]
        expected = self.program(expected_inputs)
        got = self(inputs)
        written = all(_same_or_none(inputs[i], expected_inputs[i]) for i in self._written)
        if _same_results(got, expected) and written:
            return CheckedCall(got, True)
        for index in self._written:
            target, source = inputs[index], expected_inputs[index]
            if target is not None and source is not None:
                target.copy_(source)
        return CheckedCall(expected, False)


def _storage_counts(made: list[torch.Tensor]) -> dict[int, int]:
    """Each made tensor's storage and how many references it has while only the graph's own
    tensors hold it: the count `is_free` expects."""
    counts: dict[int, int] = {}
    for tensor in made:
        cdata = tensor.untyped_storage()._cdata
        counts[cdata] = torch._C._storage_Use_Count(cdata)
    return counts


def _returns_shared(template: Any, made: list[torch.Tensor], shared: SharedInputs) -> bool:
    """Whether a result leaf is a shared buffer, or a made tensor lies in one's memory."""
    copied = set(shared.buffers)
    if _input_leaves(template) & copied:
        return True
    spans = [_span(buffer) for buffer in shared.buffers.values()]
    return any(_overlaps(_span(t), span) for t in made for span in spans)


def _input_leaves(template: Any) -> set[int]:
    if isinstance(template, _Input):
        return {template.index}
    if isinstance(template, (list, tuple)):
        return set().union(*(_input_leaves(t) for t in template)) if template else set()
    return set()


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]
