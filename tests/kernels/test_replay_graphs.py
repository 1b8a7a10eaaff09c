"""Recorded programs replayed from CUDA graphs (fp4cli/replay/graphed.py): which programs a
graph may replay, how a graphed call rebuilds its result, and when the cache calls a graph
(`graphs` modes, the device's wait, captures, refusals, the bound). The captures themselves
run on a GPU (tests/gpu/test_gpu_graphed_programs.py); here a stand-in graph replays the
program."""

import pytest
import torch

from fp4cli.replay import ProgramCache, cache, graph_mode, graphs
from fp4cli.replay.graphed import (
    ByteCopies,
    GraphRefused,
    _inputs_read,
    _inputs_written,
    _leaves,
    _rebuilt,
    graph_gap,
    same_bits,
)
from fp4cli.replay.program import HostProgram
from fp4cli.replay.recorder import CallStep, Recording, record
from tests.kernels.test_replay import inputs, scaled_sum

CUDA = torch.device("cuda", 0)


def program_of(function, device=CUDA):
    _, recording, refusal = record(function, inputs(0))
    assert refusal is None
    return HostProgram(recording, device)


def test_graph_gap_names_what_a_graph_would_not_replay():
    assert graph_gap(program_of(scaled_sum, None)) == "it does not run on CUDA"
    assert graph_gap(program_of(scaled_sum)) == "it launches under the Triton interpreter"
    steps = [CallStep(len, (), {}, None)]
    host = HostProgram(Recording(0, steps, 0, None), CUDA)
    assert graph_gap(host) == "its host step len runs on the host"
    enqueues = [CallStep(len, (), {}, None, graphable=True)]  # `host_step(graphable=True)`
    assert graph_gap(HostProgram(Recording(0, enqueues, 0, None), CUDA)) is None
    plain = program_of(lambda x, y: (x * 2, y + x))
    assert graph_gap(plain) is None


def test_only_the_inputs_a_program_reads_or_returns_get_buffers():
    assert _inputs_read(program_of(lambda x, y: x * 2)) == {0}
    assert _inputs_read(program_of(lambda x, y: (x * 2, y))) == {0, 1}
    assert _inputs_read(program_of(scaled_sum)) == {0, 1}


def test_the_inputs_an_aten_step_writes_in_place_are_known():
    assert _inputs_written(program_of(lambda x, y: x * 2)) == set()
    assert _inputs_written(program_of(lambda x, y: x * y.add_(1))) == {1}
    assert _inputs_written(program_of(lambda x, y: torch.mul(x, 2, out=x))) == {0}


def test_a_graphed_result_returns_inputs_as_given_and_copies_what_it_made():
    x, y = inputs(0)
    buffers = [x.clone(), None]
    made_by_graph = torch.arange(12.0).reshape(3, 4)
    strided = torch.arange(24.0).reshape(4, 6)[:, :3]
    made: list[torch.Tensor] = []
    template = _leaves((made_by_graph, [buffers[0], 7], {"k": 1}, strided), buffers, made)
    assert len(made) == 2 and made[1] is strided
    copies = [torch.empty_like(t) for t in made]  # as a graphed call makes them
    torch._foreach_copy_(copies, made)
    assert copies[1].is_contiguous() and torch.equal(copies[1], strided)
    rebuilt = _rebuilt(template, (x, y), copies)
    assert rebuilt[0] is copies[0] and rebuilt[1][0] is x and rebuilt[1][1] == 7
    assert rebuilt[2] == {"k": 1} and rebuilt[3] is copies[1]


@pytest.mark.parametrize(
    ("tensor", "dense"),
    [
        (torch.empty(4, 6), True),
        (torch.empty(4, 6).t(), True),
        (torch.empty(1, 6), True),
        (torch.empty(4, 6)[:, :3], False),
        (torch.empty(4, 1, 6).expand(4, 3, 6), False),
    ],
)
def test_dense_layouts_are_the_ones_a_copy_keeps(tensor, dense):
    assert (torch.empty_like(tensor).stride() == tensor.stride()) is dense


def test_same_bits_tells_nan_payloads_and_signed_zeros_apart():
    a = torch.tensor([0.0, 1.5, float("nan")])
    assert same_bits(a, a.clone())
    assert not same_bits(a, torch.tensor([-0.0, 1.5, float("nan")]))
    other_nan = a.clone()
    other_nan.view(torch.int32)[2] = 0x7FC00001
    assert not same_bits(a, other_nan)
    assert not same_bits(a, a.to(torch.float64)) and not same_bits(a, a[:2])


def test_an_unknown_mode_is_a_one_line_error_and_modes_hold_in_their_block():
    match = "mode 'sometimes' is none of off, auto, always, resident"
    with pytest.raises(ValueError, match=match), graphs("sometimes"):
        pass
    assert graph_mode() == "off"
    with graphs("auto"):
        assert graph_mode() == "auto"
    assert graph_mode() == "off"


def layouts_of_every_kind():
    """Tensors a graph may own: mixed dtypes, a permuted dense layout, a 0-dim seed, bools, an
    empty tensor, NaN payloads, and a strided slice (not dense: copied as itself)."""
    nan_payloads = torch.tensor([0x7FC00001, 0xFFC12345 - (1 << 32), 0x7F800000], dtype=torch.int32)
    return [
        torch.randn(4, 6).to(torch.bfloat16),
        torch.randn(3, 5).t(),
        torch.tensor(12345678901, dtype=torch.int64),
        torch.tensor([True, False, True]),
        torch.empty(0, 7),
        torch.randint(0, 256, (9,), dtype=torch.uint8),
        nan_payloads.view(torch.float32),
        torch.randn(4, 6)[:, ::2],
    ]


def test_byte_copies_carry_every_layout_bit_for_bit_both_ways():
    own = [torch.empty_like(t) for t in layouts_of_every_kind()]  # a graph's buffers
    own[-1] = torch.empty(4, 6)[:, ::2]  # a buffer of the slice's strides
    copies = ByteCopies(own)
    sources = layouts_of_every_kind()
    copies.copy_in(sources)
    pairs = zip(own, sources, strict=True)
    assert all(same_bits(o, s) and o.stride() == s.stride() for o, s in pairs)
    targets = [torch.empty_like(t) for t in own]  # as a graphed call makes them
    copies.copy_out(targets)
    assert all(same_bits(t, s) for t, s in zip(targets, sources, strict=True))
    assert targets[1].stride() == (1, 5) and targets[-1].is_contiguous()


class StandInGraph:
    """Replays the program as a graph would, counting its calls; `refuse` makes the first
    checked call fail as a graph that gave other bits does."""

    built: list["StandInGraph"] = []
    refuse = False

    def __init__(self, program, inputs):
        self.program, self.calls = program, 0
        StandInGraph.built.append(self)

    def __call__(self, inputs):
        self.calls += 1
        return self.program(inputs)

    def checked_call(self, inputs):
        if StandInGraph.refuse:
            raise GraphRefused("its graph gave other bits than the program")
        return self(inputs)


class StandInEvent:
    """A device that is busy (query False) while `busy` is set."""

    busy = False

    def record(self):
        pass

    def query(self):
        return not StandInEvent.busy


@pytest.fixture
def cuda_cache(monkeypatch):
    """A cache whose programs count as CUDA programs, with stand-in graphs and events."""
    StandInGraph.built, StandInGraph.refuse, StandInEvent.busy = [], False, False
    monkeypatch.setattr(cache, "GraphedProgram", StandInGraph)
    monkeypatch.setattr(cache, "graph_gap", lambda program: None)
    monkeypatch.setattr(cache, "_device", lambda inputs: CUDA)
    monkeypatch.setattr(torch.cuda, "Event", StandInEvent)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    with graphs("auto"):
        yield ProgramCache()


def calls(programs, count, seed=0):
    results = []
    for _ in range(count):
        x, y = inputs(seed)
        results.append(programs.run("k", scaled_sum, (x, y)))
    return results


def test_a_program_is_graphed_on_its_second_replay_and_called_from_it(cuda_cache):
    results = calls(cuda_cache, 6)
    expected = scaled_sum(*inputs(0))
    for got in results:
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    (graph,) = StandInGraph.built
    assert graph.calls == 3  # calls 4 (checked), 5 and 6
    assert cuda_cache.graphs() == [graph] and cuda_cache.graph_refusals() == []


def test_off_never_graphs_and_always_ignores_the_busy_device(cuda_cache):
    assert cache._GRAPHS["mode"] == "auto"  # the fixture's
    with graphs("off"):
        calls(cuda_cache, 6)
    assert StandInGraph.built == []
    StandInEvent.busy = True
    with graphs("always"):
        calls(cuda_cache, 2)
    assert len(StandInGraph.built) == 1 and StandInGraph.built[0].calls == 1


def test_auto_launches_step_by_step_while_the_device_is_busy(cuda_cache):
    calls(cuda_cache, 4)
    (graph,) = StandInGraph.built
    StandInEvent.busy = True
    calls(cuda_cache, 3)
    assert graph.calls == 1
    StandInEvent.busy = False
    calls(cuda_cache, 2)
    assert graph.calls == 3


def test_a_capture_replays_the_program(cuda_cache, monkeypatch):
    calls(cuda_cache, 4)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    calls(cuda_cache, 3)
    assert StandInGraph.built[0].calls == 1


def test_a_refused_graph_is_kept_refused_and_the_program_replays(cuda_cache):
    StandInGraph.refuse = True
    results = calls(cuda_cache, 6)
    expected = scaled_sum(*inputs(0))
    assert all(torch.equal(a, b) for a, b in zip(results[-1], expected, strict=True))
    assert len(StandInGraph.built) == 1 and StandInGraph.built[0].calls == 0
    assert cuda_cache.graph_refusals() == ["its graph gave other bits than the program"]


def test_graphs_are_bounded_in_number(cuda_cache, monkeypatch):
    monkeypatch.setattr(cache, "GRAPH_CAPACITY", 0)
    calls(cuda_cache, 5)
    assert StandInGraph.built == []
    assert cuda_cache.graph_refusals() == ["0 graphs are held already"]
