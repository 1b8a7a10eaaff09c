"""kernels/elementwise/call_seed.py: a layer's call seed drawn and the call counted in one launch,
with the bits of the definition (`fp4cli.linear.seeds.draw_call_seed`), int64 wrapping included;
and its launch recorded as writing `calls` (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from fp4cli.linear.seeds import SEED_STRIDE, draw_call_seed, draw_call_seed_launched
from fp4cli.replay.graphed import _inputs_written
from fp4cli.replay.program import HostProgram
from fp4cli.replay.recorder import record
from tests.kernel_cases import on_device  # skips without kernels

CASES = [(0, 0), (5, 1), (123_456_789, 77), (2**47 - 1, 2**40 + 3), (2**62 + 3, 2**59),
         (2**63 - 1, 2**60), (2**63 - 1, 2**63 - 1)]  # fmt: skip


@pytest.mark.parametrize("counts", [True, False])
def test_the_launched_draw_is_the_definitions(counts):
    """Seeds and counts equal `draw_call_seed`'s, where rng_seed + calls * 16 wraps too."""
    for rng_seed, calls in CASES:
        want_calls, got_calls = on_device(torch.tensor(calls)), on_device(torch.tensor(calls))
        want = draw_call_seed(on_device(torch.tensor(rng_seed)), want_calls, counts)
        seed_buffer = on_device(torch.tensor(rng_seed))
        got = draw_call_seed_launched(seed_buffer, got_calls, counts)
        assert got.item() == want.item(), (rng_seed, calls)
        assert got_calls.item() == want_calls.item(), (rng_seed, calls)
        assert (got_calls.item() - calls) % 2**64 == counts
        assert got is not seed_buffer and seed_buffer.item() == rng_seed  # a new tensor
        assert got.dtype == torch.int64 and got.dim() == 0


def test_consecutive_calls_step_the_seed():
    rng_seed, calls = on_device(torch.tensor(1000)), on_device(torch.tensor(0))
    seeds = [draw_call_seed_launched(rng_seed, calls, True).item() for _ in range(3)]
    assert seeds == [1000, 1000 + SEED_STRIDE, 1000 + 2 * SEED_STRIDE] and calls.item() == 3


def test_only_0_dim_int64_buffers_are_taken():
    good = on_device(torch.tensor(1))
    for bad in (on_device(torch.tensor(1, dtype=torch.int32)), on_device(torch.tensor([1]))):
        with pytest.raises(ValueError, match="must be a 0-dim int64 tensor"):
            draw_call_seed_launched(bad, good, True)
        with pytest.raises(ValueError, match="must be a 0-dim int64 tensor"):
            draw_call_seed_launched(good, bad, True)


@pytest.mark.parametrize("counts", [True, False])
def test_a_recorded_draw_names_calls_as_written_and_replays(counts):
    """The recording marks `calls` written (where the call counts), so a graph of the program
    copies it back; the replay draws and counts as the direct call did."""
    rng_seed, calls = on_device(torch.tensor(40)), on_device(torch.tensor(2))

    def draw(rng_seed, calls):
        return draw_call_seed_launched(rng_seed, calls, counts)

    _, recording, refusal = record(draw, [rng_seed, calls])
    assert refusal is None
    program = HostProgram(recording, rng_seed.device if rng_seed.is_cuda else None)
    assert _inputs_written(program) == ({1} if counts else set())
    before = calls.item()
    assert program([rng_seed, calls]).item() == 40 + before * SEED_STRIDE
    assert calls.item() == before + counts


@pytest.mark.parametrize("length", [1, 1023, 1025, 3001])
def test_the_call_start_rounds_the_bias_as_torchs_cast(length):
    """Under bfloat16 autocast the seed's launch also rounds the float32 bias: the bits of
    `bias.to(torch.bfloat16)` (ties both ways, overflow to Inf, subnormals; NaN stays NaN),
    over ragged lengths of several programs; the seed as the seed alone draws it."""
    from fp4cli.kernels.elementwise.call_seed import launch_call_start

    words = torch.randint(-(2**31), 2**31 - 1, (length,), generator=torch.Generator()
                          .manual_seed(length), dtype=torch.int64).to(torch.int32)  # fmt: skip
    bias = words.view(torch.float32).clone()
    specials = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, 2**-134, 1e-45, float("inf")]
    bias[: min(length, len(specials))] = torch.tensor(specials[:length])
    bias = on_device(bias)
    calls = on_device(torch.tensor(3))
    start = launch_call_start(on_device(torch.tensor(7)), calls, SEED_STRIDE, True, bias)
    assert start.seed.item() == 7 + 3 * SEED_STRIDE and calls.item() == 4
    want = bias.to(torch.bfloat16)
    assert start.bias is not None and start.bias.dtype == torch.bfloat16
    assert torch.equal(start.bias.isnan(), want.isnan())
    finite = ~want.isnan()
    assert torch.equal(start.bias[finite].view(torch.int16), want[finite].view(torch.int16))


def test_only_a_float32_bias_under_bfloat16_is_rounded_in_the_launch():
    """`start_call_launched` rounds a contiguous float32 bias where the compute dtype is
    bfloat16, and returns any other bias as given (the executor casts it)."""
    from fp4cli.linear.seeds import start_call_launched

    rng_seed, calls = on_device(torch.tensor(1)), on_device(torch.tensor(0))
    bias = on_device(torch.linspace(-1, 1, 10))
    rounded = start_call_launched(rng_seed, calls, True, bias, torch.bfloat16)[1]
    assert rounded is not None and rounded.dtype == torch.bfloat16
    for other, dtype in [
        (bias, None),
        (bias, torch.float16),
        (bias[::2], torch.bfloat16),
        (bias.to(torch.bfloat16), torch.bfloat16),
        (None, torch.bfloat16),
    ]:
        assert start_call_launched(rng_seed, calls, True, other, dtype)[1] is other
    from fp4cli.kernels.elementwise.call_seed import launch_call_start

    with pytest.raises(ValueError, match="contiguous 1-D float32"):
        launch_call_start(rng_seed, calls, SEED_STRIDE, True, bias.to(torch.bfloat16))
