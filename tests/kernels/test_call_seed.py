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
