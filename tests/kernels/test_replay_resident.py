"""Resident graphs (fp4cli/replay/resident.py): when the cache replays a program from a graph
captured on its caller's own tensors, and when it must not (the last results still held, the
inputs elsewhere, a refused or mismatched graph, the bounds); and how a resident graph tells
that its last results are free. The captures run on a GPU
(tests/gpu/test_gpu_resident_graphs.py); here a stand-in graph replays the program."""

import weakref

import pytest
import torch

from fp4cli.recipes import load_recipe
from fp4cli.replay import ProgramCache, cache, graphs
from fp4cli.replay.graphed import _Input, _Made
from fp4cli.replay.resident import (
    CheckedCall,
    ResidentGraph,
    SharedInputs,
    _returns_shared,
    _storage_counts,
    pointers_key,
)
from tests.kernels.test_replay import inputs, scaled_sum
from tests.linear_runs import seeded_layer

CUDA = torch.device("cuda", 0)


class StandInResident:
    """Replays the program as a resident graph would, counting its calls; free once the
    tensors of its last call are gone. `refuse` fails the capture, `other_bits` the check."""

    built: list["StandInResident"] = []
    refuse = False
    other_bits = False

    def __init__(self, program, inputs, shared):
        if StandInResident.refuse:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.program, self.calls, self.held = program, 0, []
        self.key = pointers_key(inputs, tuple(shared.buffers))
        self.shared = shared
        StandInResident.built.append(self)

    def is_free(self):
        return all(ref() is None for ref in self.held)

    def __call__(self, inputs):
        self.calls += 1
        result = self.program(inputs)
        self.held = [weakref.ref(t) for t in result]
        return result

    def checked_call(self, inputs):
        result = self(inputs)
        if StandInResident.other_bits:
            return CheckedCall(scaled_sum(*inputs), False)
        return CheckedCall(result, True)


@pytest.fixture
def resident_cache(monkeypatch):
    """A cache whose programs count as CUDA programs, with stand-in resident graphs."""
    StandInResident.built, StandInResident.refuse, StandInResident.other_bits = [], False, False
    monkeypatch.setattr(cache, "ResidentGraph", StandInResident)
    monkeypatch.setattr(cache, "graph_gap", lambda program: None)
    monkeypatch.setattr(cache, "_device", lambda inputs: CUDA)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with graphs("resident"):
        yield ProgramCache()


def steps(programs, count, tensors, resident=(0,), keep=False):
    """`count` calls on the same tensors, the first copied into the graph's buffer; each
    result dropped unless `keep`."""
    kept = []
    for _ in range(count):
        result = programs.run("k", scaled_sum, tensors, resident)
        assert all(torch.equal(a, b) for a, b in zip(result, scaled_sum(*tensors), strict=True))
        if keep:
            kept.append(result)
        del result  # a caller's variable would hold it into the next call
    return kept


def test_a_program_goes_resident_on_its_second_replay_at_the_same_addresses(resident_cache):
    tensors = inputs(0)
    steps(resident_cache, 6, tensors)  # direct, recorded, replayed, captured and called
    (graph,) = StandInResident.built
    assert graph.calls == 3 and graph.key == pointers_key(tensors, (0,))
    assert graph.key[0] == 0 and graph.key[1] == tensors[1].data_ptr()
    assert list(graph.shared.buffers) == [0]  # x's buffer, shared by the program's graphs
    assert resident_cache.residents() == [graph] and resident_cache.resident_refusals() == []


def test_only_calls_that_ask_replay_from_a_resident_graph(resident_cache):
    steps(resident_cache, 6, inputs(0), resident=None)
    assert StandInResident.built == []
    with graphs("always"):  # another mode: its own graphs
        steps(resident_cache, 6, inputs(0), resident=True)
    assert StandInResident.built == []


def test_held_results_send_the_call_to_the_program(resident_cache):
    tensors = inputs(0)
    steps(resident_cache, 4, tensors)
    (graph,) = StandInResident.built
    held = steps(resident_cache, 3, tensors, keep=True)
    assert graph.calls == 2  # the first held result kept the graph from the next two calls
    del held
    steps(resident_cache, 2, tensors)
    assert graph.calls == 4


def test_each_set_of_addresses_but_the_copied_has_its_graph(resident_cache):
    first, second = inputs(0), inputs(1)
    moved = (second[0], first[1])  # x elsewhere, y where it was: the same graph
    for _ in range(4):
        steps(resident_cache, 1, first)
        steps(resident_cache, 1, second)
        steps(resident_cache, 1, moved)
    keys = [graph.key for graph in StandInResident.built]
    assert sorted(keys) == sorted([pointers_key(first, (0,)), pointers_key(second, (0,))])
    (shared,) = {id(graph.shared) for graph in StandInResident.built}


def test_a_refused_capture_leaves_the_program_replaying(resident_cache):
    StandInResident.refuse = True
    steps(resident_cache, 6, inputs(0))
    assert StandInResident.built == []
    refusal = "operation not permitted when stream is capturing"
    assert resident_cache.resident_refusals() == [refusal]


def test_a_graph_of_other_bits_is_dropped_and_its_call_gets_the_programs(resident_cache):
    StandInResident.other_bits = True
    steps(resident_cache, 6, inputs(0))
    (graph,) = StandInResident.built
    assert graph.calls == 1 and resident_cache.residents() == []
    assert resident_cache.resident_refusals() == [
        "its resident graph gave other bits than the program"
    ]


def test_resident_graphs_are_bounded_and_only_free_ones_are_dropped(resident_cache, monkeypatch):
    monkeypatch.setattr(cache, "RESIDENT_PER_PROGRAM", 1)
    first, second = inputs(0), inputs(1)
    held = steps(resident_cache, 4, first, keep=True)  # the first graph's results held
    steps(resident_cache, 3, second)
    assert [g.key for g in resident_cache.residents()] == [pointers_key(first, (0,))]
    del held
    steps(resident_cache, 3, second)  # the first graph is free: dropped for the second
    assert [g.key for g in resident_cache.residents()] == [pointers_key(second, (0,))]
    monkeypatch.setattr(cache, "RESIDENT_CAPACITY", 0)
    monkeypatch.setattr(cache, "RESIDENT_PER_PROGRAM", 8)
    steps(resident_cache, 3, first)  # over the total: the free second graph makes room
    assert [g.key for g in resident_cache.residents()] == [pointers_key(first, (0,))]


class NoGraph:
    def replay(self):
        pass


def made_by_a_graph(made):
    """A ResidentGraph whose graph has made `made` and replays nothing (its liveness alone)."""
    graph = ResidentGraph.__new__(ResidentGraph)
    graph._graph, graph._made, graph.replays = NoGraph(), made, 0
    graph.shared = SharedInputs([], ())
    graph._result = (_Made(0), (_Made(1), _Made(2)))
    graph._storages = _storage_counts(made)
    return graph


def test_a_resident_graph_is_free_once_nobody_holds_what_it_returned():
    whole = torch.zeros(16)
    made = [torch.zeros(4, 4), *whole.split(8)]  # two results share one storage
    graph = made_by_a_graph(made)
    assert graph.is_free()
    y, (first, second) = graph([])
    assert graph.replays == 1
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip((y, first, second), made, strict=True))
    assert y is not made[0]  # aliases: autograd marks what a call returns
    del y, first
    assert not graph.is_free()  # a half of the split storage is still held
    view = second.view(2, 4)
    del second
    assert not graph.is_free()  # through a view
    del view
    assert graph.is_free()
    saved = graph([])[0].reshape(16)
    assert not graph.is_free()
    del saved
    assert graph.is_free()


def test_shared_buffers_are_filled_and_never_returned():
    x, y = inputs(0)
    shared = SharedInputs([x, y, None], (0, 2))
    assert list(shared.buffers) == [0]  # None has no buffer
    buffer = shared.buffers[0]
    assert buffer.shape == x.shape and buffer.stride() == x.stride() and buffer.dtype == x.dtype
    assert shared.inputs([x, y, None]) == [buffer, y, None]
    shared.fill([x, y, None])
    assert torch.equal(buffer, x) and buffer.data_ptr() != x.data_ptr()
    own = torch.zeros(3)
    assert not _returns_shared((_Made(0), _Input(1)), [own], shared)
    assert _returns_shared((_Made(0), _Input(0)), [own], shared)  # x itself
    assert _returns_shared((_Made(0),), [buffer[1:].view(-1)], shared)  # a view of x's buffer


def test_a_fast_layers_autograd_node_holds_no_tensor_after_backward():
    """A resident graph's results are free once the backward pass has run, though the loss
    (and with it the layer's autograd node) lives on into the next step: so the node keeps its
    tensors, the call's seed included, as saved tensors, which autograd lets go."""
    layer = seeded_layer(load_recipe("tetrajet").linear, "triton", 64, 48)
    for _ in range(3):  # direct, recorded, replayed
        x = torch.randn(40, 64, requires_grad=True)
        y = layer(x)
        y.backward(torch.randn(y.shape))
    node = y.grad_fn
    while type(node).__name__ != "FastQuantLinearFunctionBackward":
        node = node.next_functions[0][0]
    held = []
    for name in dir(node):
        try:
            value = getattr(node, name)
        except (RuntimeError, AttributeError):  # saved tensors freed, attributes unreadable
            continue
        items = value if isinstance(value, (tuple, list)) else (value,)
        held += [name for item in items if isinstance(item, torch.Tensor)]
    assert held == []
