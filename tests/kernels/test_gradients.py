"""kernels/elementwise/gradients.py: a quantized Linear's bfloat16 gradients widened to float32 and
its bias sums added up from their tiles' partial sums and rounded to bfloat16, in one launch, with
the bits of torch's casts (interpreter on the CPU, or a GPU)."""

import pytest
import torch

from tests.kernel_cases import NAN, assert_bits, on_device, seeded_normal  # skips without kernels

gradients = pytest.importorskip("fp4cli.kernels.elementwise.gradients")
ColumnSums = pytest.importorskip("fp4cli.kernels.host.tiling").ColumnSums


def every_bfloat16() -> torch.Tensor:
    """All 65,536 bfloat16 bit patterns (NaNs with payloads, infinities, subnormals, -0)."""
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


def assert_words(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    assert got.dtype == want.dtype == torch.float32, what
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), what


def test_widening_is_torchs_cast_bit_for_bit():
    """Every bfloat16 pattern (NaN payloads included) becomes `.float()`'s word, in two tensors
    of ragged lengths at once, with bias sums in the same launch."""
    patterns = on_device(every_bfloat16().reshape(256, 256))
    ragged = on_device(seeded_normal((37, 129), 1).to(torch.bfloat16))
    sums = on_device(seeded_normal((4099,), 2))
    widened = gradients.widen_gradients([patterns, ragged], ColumnSums(4099, sums))
    wide_patterns, wide_ragged = widened.gradients
    assert wide_patterns.shape == patterns.shape and wide_ragged.shape == ragged.shape
    assert_words(wide_patterns, patterns.float(), "every pattern")
    assert_words(wide_ragged, ragged.float(), "ragged")
    assert_words(widened.sums, sums.to(torch.bfloat16).float(), "sums")


def test_bias_sums_round_to_bfloat16_as_torch_rounds():
    """Ties (to even, both ways), the largest finite values (to Inf past bfloat16's), tiny
    and subnormal sums, infinities; NaN stays NaN."""
    sums = seeded_normal((3001,), 3) * torch.exp2(seeded_normal((3001,), 4) * 30)
    sums[:9] = torch.tensor(
        [1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 3.4e38, -3.39e38, 2**-134, 1e-45,
         float("inf"), NAN]
    )  # fmt: skip
    sums = on_device(sums)
    want = sums.to(torch.bfloat16).float()
    got = gradients.widen_gradients([None, None], ColumnSums(3001, sums)).sums
    assert torch.equal(got.isnan(), want.isnan())
    assert_bits(torch.nan_to_num(got), torch.nan_to_num(want), "rounded sums")


@pytest.mark.parametrize("tiles", [1, 3, 32, 70])
def test_partial_sums_are_added_up_in_one_order(tiles):
    """Each column's partial sums (one per row tile of the pair kernel's read) add up in
    float32, ragged in columns and tiles: exactly on integers, whatever the order; within
    float32's rounding on others; the same bits on every call, rounded or not; and a column
    of negative zeros sums to -0.0, as IEEE addition keeps it."""
    integers = torch.randint(-1000, 1000, (45, tiles), generator=torch.Generator().manual_seed(5))
    partials = on_device(integers.float())
    totals = gradients.widen_gradients([], ColumnSums(45, partials), round_sums=False).sums
    assert_words(totals, partials.sum(1), "integer sums")
    partials = on_device(seeded_normal((45, tiles), 6) * 1000)
    partials[7] = -0.0
    first = gradients.widen_gradients([], ColumnSums(45, partials), round_sums=False).sums
    again = gradients.widen_gradients([], ColumnSums(45, partials), round_sums=False).sums
    assert_words(first, again, "the same order")
    bound = partials.abs().sum(1) * tiles * 2**-24  # float32's rounding in any order
    assert ((first - partials.double().sum(1)).abs() <= bound).all()
    assert first[7].item() == 0.0 and torch.signbit(first[7])
    rounded = gradients.widen_gradients([], ColumnSums(45, partials)).sums
    assert_words(rounded, first.to(torch.bfloat16).float(), "rounded totals")


@pytest.mark.parametrize("present", [(True, False), (False, True), (False, False)])
def test_any_part_may_be_left_out(present):
    """A missing gradient stays None and takes no programs; nothing at all launches nothing."""
    grads = [on_device(seeded_normal((5, 70), i).to(torch.bfloat16)) if p else None
             for i, p in enumerate(present)]  # fmt: skip
    widened = gradients.widen_gradients(grads)
    assert widened.sums is None
    for grad, wide in zip(grads, widened.gradients, strict=True):
        assert (wide is None) == (grad is None)
        if grad is not None:
            assert_words(wide, grad.float(), "widened")


def test_wrong_inputs_are_refused():
    bf16 = on_device(torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bfloat16 gradients"):
        gradients.widen_gradients([on_device(torch.zeros(4))])
    with pytest.raises(ValueError, match="at most two"):
        gradients.widen_gradients([bf16, bf16, bf16])
    with pytest.raises(ValueError, match="float32 partial sums"):
        bf16_sums = ColumnSums(4, on_device(torch.zeros(4, dtype=torch.bfloat16)))
        gradients.widen_gradients([], bf16_sums)
    with pytest.raises(ValueError, match="float32 partial sums"):
        gradients.widen_gradients([], ColumnSums(4))  # no launcher has written them
