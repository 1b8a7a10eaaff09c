"""Recorded host programs (fp4cli/replay): a call recorded once and replayed on new inputs gives
the direct call's results; what a replay could get wrong is refused and stays a direct call;
signatures, the switch and the cache's bound."""

import pytest
import torch
import triton
import triton.language as tl

from fp4cli.kernels.host.launch import launch
from fp4cli.replay import ProgramCache, host_step, replays
from fp4cli.replay.program import HostProgram
from fp4cli.replay.recorder import LaunchStep, OpStep, record
from tests.kernel_cases import DEVICE


@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, n, SCALE: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * SCALE + y, mask=mask)


def scaled_sum(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A host function of the kind a layer's executor is: allocations, tensor operations and a
    launch through `launch`, and a view of one result."""
    out = torch.empty_like(x)
    doubled = y * 2
    launch(scaled_add_kernel, (triton.cdiv(x.numel(), 64),), (x, doubled, out, x.numel()),
           dict(SCALE=3.0, BLOCK=64), 4)  # fmt: skip
    return out, out[0]


def inputs(seed: int, shape=(8, 24)) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=generator).to(DEVICE) for _ in range(2))


def test_a_replay_reruns_the_recorded_steps_on_new_inputs():
    result, recording, refusal = record(scaled_sum, inputs(0))
    assert refusal is None and recording is not None
    kinds = [type(step) for step in recording.steps]
    assert kinds.count(LaunchStep) == 1 and OpStep in kinds
    device = torch.device("cuda", torch.cuda.current_device()) if DEVICE.type == "cuda" else None
    program = HostProgram(recording, device)
    for seed in (1, 2):
        x, y = inputs(seed)
        replayed, expected = program((x, y)), scaled_sum(x, y)
        assert all(torch.equal(a, b) for a, b in zip(replayed, expected, strict=True))
    assert "scaled_add_kernel" in program.source and "aten.mul.Tensor" in program.source


def test_a_host_read_of_a_tensor_value_is_refused():
    def reads_a_value(x, y):
        return x * float(y.sum())

    _, recording, refusal = record(reads_a_value, inputs(0))
    assert recording is None and "on the host" in refusal


def test_a_tensor_from_outside_the_inputs_is_refused():
    captured = torch.ones(8, 24, device=DEVICE)  # another layer's buffer, say

    def closes_over_a_tensor(x, y):
        return x + captured

    _, recording, refusal = record(closes_over_a_tensor, inputs(0))
    assert recording is None and "no input holds" in refusal


def test_a_host_step_is_called_again_and_must_decide_as_recorded():
    decisions = []

    @host_step
    def maybe_double(x: torch.Tensor, out: torch.Tensor) -> bool:
        decisions.append(len(decisions))
        if x.shape[0] > 4 and len(decisions) < 3:
            out.copy_(x * 2)
            return True
        return False

    def uses_the_step(x, y):
        out = torch.empty_like(x)
        if not maybe_double(x, out):
            out.copy_(x)
        return out

    cache = ProgramCache()
    x, y = inputs(0)
    for _ in range(2):  # direct, then recorded
        assert torch.equal(cache.run("k", uses_the_step, (x, y)), x * 2)
    # the third call replays; its host step decides otherwise: a direct call gives the result
    assert torch.equal(cache.run("k", uses_the_step, (x, y)), x)
    assert cache.refusals() and "returned otherwise" in cache.refusals()[0]


def test_a_host_step_replays_what_its_bind_made_of_the_recorded_call():
    seen, bound_calls, plain_calls = [], [], []

    def bind(ran, x, out):
        seen.append((ran, x.shape))
        return lambda x, out: bound_calls.append(out.copy_(x * 3)) is None

    @host_step(bind=bind)
    def triple(x: torch.Tensor, out: torch.Tensor) -> bool:
        plain_calls.append(1)
        out.copy_(x * 3)
        return True

    def uses_the_step(x, y):
        out = torch.empty_like(x)
        assert triple(x, out)
        return out + y

    cache = ProgramCache()
    for seed in range(4):  # direct, recorded (the bind called once), then two replays
        x, y = inputs(seed)
        assert torch.equal(cache.run("k", uses_the_step, (x, y)), x * 3 + y)
    assert seen == [(True, x.shape)]
    assert len(plain_calls) == 2 and len(bound_calls) == 2
    assert cache.refusals() == []


def test_a_bind_that_keeps_nothing_leaves_the_function_to_the_replays():
    plain_calls = []

    @host_step(bind=lambda ran, x, out: None)
    def triple(x: torch.Tensor, out: torch.Tensor) -> bool:
        plain_calls.append(1)
        out.copy_(x * 3)
        return True

    def uses_the_step(x, y):
        out = torch.empty_like(x)
        triple(x, out)
        return out

    cache = ProgramCache()
    for seed in range(3):
        x, y = inputs(seed)
        assert torch.equal(cache.run("k", uses_the_step, (x, y)), x * 3)
    assert len(plain_calls) == 3


def test_allocations_replay_through_torch_with_their_sizes_one_by_one():
    def allocates(x, y):
        ones = torch.zeros([3, 5], device=x.device) + 1
        scalar = torch.zeros([], dtype=torch.int64, device=x.device)
        return ones, scalar, torch.empty(0, device=x.device)

    _, recording, refusal = record(allocates, inputs(0))
    assert refusal is None
    program = HostProgram(recording, DEVICE)
    assert "(3, 5, dtype=" in program.source and "([], dtype=" in program.source
    ones, scalar, empty = program(inputs(1))
    assert torch.equal(ones, torch.ones(3, 5, device=DEVICE))
    assert scalar.shape == () and scalar.dtype == torch.int64 and empty.shape == (0,)


def test_the_cache_calls_directly_records_then_replays():
    calls = []

    def counted(x, y):
        calls.append(1)
        return scaled_sum(x, y)[0]

    cache = ProgramCache()
    for seed in range(5):
        x, y = inputs(seed)
        assert torch.equal(cache.run(("k",), counted, (x, y)), scaled_sum(x, y)[0])
    assert len(calls) == 2 and len(cache.programs()) == 1
    with replays(False):
        cache.run(("k",), counted, inputs(6))
    assert len(calls) == 3


def test_each_shape_dtype_and_layout_gets_its_own_program():
    cache = ProgramCache()
    variants = [
        inputs(0),
        inputs(1, (5, 24)),
        tuple(t.to(torch.float64) for t in inputs(2)),
        tuple(t.t() for t in inputs(3, (24, 8))),  # the same shape, other strides
    ]
    for pair in variants * 3:
        expected = scaled_sum(*pair)[0]
        assert torch.equal(cache.run("k", lambda x, y: scaled_sum(x, y)[0], pair), expected)
    assert len(cache.programs()) == len(variants)


def test_one_tensor_given_twice_is_never_recorded():
    cache = ProgramCache()
    x, _ = inputs(0)
    for _ in range(3):
        assert torch.equal(cache.run("k", lambda a, b: a * b, (x, x)), x * x)
    assert len(cache) == 0


def test_the_cache_keeps_at_most_its_capacity():
    cache = ProgramCache(capacity=2)
    for rows in (3, 4, 5, 6):
        pair = inputs(rows, (rows, 24))
        for _ in range(3):
            cache.run("k", lambda x, y: x + y, pair)
    assert len(cache) == 2


@pytest.mark.parametrize("enabled", [True, False])
def test_the_switch_holds_in_its_block_only(enabled):
    from fp4cli.replay import replay_enabled

    with replays(enabled):
        assert replay_enabled() is enabled
    assert replay_enabled()
