"""kernels/gradients.py: a quantized Linear's bfloat16 gradients widened to float32 and its bias
gradient added up from partial sums and rounded to bfloat16, in one launch, with the bits of
torch's casts (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from tests.kernel_cases import NAN, assert_bits, on_device, seeded_normal  # skips without kernels

gradients = pytest.importorskip("fp4cli.kernels.gradients")


def every_bfloat16() -> torch.Tensor:
    """All 65,536 bfloat16 bit patterns (NaNs with payloads, infinities, subnormals, -0)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def assert_words(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype == torch.float32, what
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), what


def test_widening_is_torchs_cast_bit_for_bit():
    """Every bfloat16 pattern (NaN payloads included) becomes `.float()`'s word, in two tensors
    of ragged lengths at once, with column sums in the same launch."""
    patterns = on_device(every_bfloat16().reshape(256, 256))
    ragged = on_device(seeded_normal((37, 129), 1).to(torch.bfloat16))
    partial = on_device(torch.randint(-50, 50, (4099, 3), generator=torch.Generator()).float())
    (wide_patterns, wide_ragged), sums = gradients.widen_gradients([patterns, ragged], partial)
    assert wide_patterns.shape == patterns.shape and wide_ragged.shape == ragged.shape
    assert_words(wide_patterns, patterns.float(), "every pattern")
    assert_words(wide_ragged, ragged.float(), "ragged")
    assert_words(sums, partial.sum(1), "integer sums: one result in any order")


@pytest.mark.parametrize("parts", [1, 64, 200])
def test_bias_sums_add_up_and_round_to_bfloat16_as_torch_rounds(parts):
    """Partial sums (one, one load's worth, several loads with a ragged last) added in float32
    and rounded: ties (to even, both ways), the largest finite values (to Inf past bfloat16's),
    tiny and subnormal sums, infinities; NaN stays NaN. Without rounding, the float32 sums."""
    partial = seeded_normal((3001, parts), 3) * torch.exp2(seeded_normal((3001, 1), 4) * 30)
    special = [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.39e38, 2**-134, 1e-45,
               float("inf"), NAN]  # fmt: skip
    partial[: len(special)] = 0.0
    partial[: len(special), 0] = torch.tensor(special)
    partial = on_device(partial)
    exact, magnitude = partial.double().sum(1), partial.double().abs().sum(1)
    for rounded in (False, True):
        sums = gradients.widen_gradients([], partial, rounded)[1]
        assert torch.equal(sums.isnan(), exact.isnan())
        finite = exact.isfinite() & (magnitude < 3e38)
        bound = parts * (2.0**-23 * magnitude + 2.0**-149)  # float32 additions, subnormals
        if rounded:  # bfloat16's half step, relative or (subnormal) absolute
            bound = bound + 2.0**-8 * (exact.abs() + bound) + 2.0**-133
        assert ((sums.double() - exact).abs() <= bound)[finite].all()
        if rounded:  # the float32 sums rounded exactly as torch rounds them
            unrounded = gradients.widen_gradients([], partial)[1]
            want = unrounded.to(torch.bfloat16).float()
            assert_bits(torch.nan_to_num(sums), torch.nan_to_num(want), "rounded sums")
            assert_words(
                sums[:7], torch.tensor(special[:7]).to(torch.bfloat16).float().to(sums), "ties"
            )


@pytest.mark.parametrize("present", [(True, False), (False, True), (False, False)])
def test_any_part_may_be_left_out(present):
    """A missing gradient stays None and takes no programs; nothing at all launches nothing."""
    grads = [on_device(seeded_normal((5, 70), i).to(torch.bfloat16)) if p else None
             for i, p in enumerate(present)]  # fmt: skip
    widened, sums = gradients.widen_gradients(grads)
    assert sums is None
    for grad, wide in zip(grads, widened, strict=True):
        assert (wide is None) == (grad is None)
        if grad is not None:
            assert_words(wide, grad.float(), "widened")


def test_wrong_inputs_are_refused():
    bf16 = on_device(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16 gradients"):
        gradients.widen_gradients([on_device(torch.zeros(4))])
    with pytest.raises(ValueError, match="at most two"):
        gradients.widen_gradients([bf16, bf16, bf16])
    with pytest.raises(ValueError, match="partial sums"):
        gradients.widen_gradients([], on_device(torch.zeros(4)))
    with pytest.raises(ValueError, match="partial sums"):
        gradients.widen_gradients([], on_device(torch.zeros(4, 2, dtype=torch.bfloat16)))
