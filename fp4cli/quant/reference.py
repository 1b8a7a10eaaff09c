"""The reference quantizer: the definition of correct for every kernel in fp4cli.

For a tensor x, a QuantSpec and an axis, in float32:
  1. move `axis` last, zero-pad it to whole blocks, view as blocks;
  2. each block's scale s from its amax (floor/ceil rule, rounded to the scale format);
  3. v = x / s (times sr_prescale), rounded onto the element grid (rne / sr / away), saturated;
  4. a block holding NaN or Inf gets the NaN scale and decodes to NaN.
With rounding "eden" (MS-EDEN), step 3 rounds to nearest (ties away) and the block scales are
then corrected per group and rounded stochastically (`fp4cli.quant.ms_eden`).
Dequantization is (q * s) / sr_prescale. Two-level specs (NVFP4) scale blocks relative to the
tensor's finite amax A instead, in the order of operations `fp4cli.quant.two_level` states:
v = x * e(s, A) before the pre-scale, and x ~ (q * d(s, A)) / sr_prescale.

With `hadamard=n`, x is first transformed by the random Hadamard transform along the axis
(`fp4cli.techniques.hadamard.rht`, zero-padded to whole n-blocks) and that is what is quantized.
`backend` picks the reference below or the fused Triton kernels (`fp4cli.quant.backend`); both
give the same bits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fp4cli.formats import decode, encode, pack_nibbles, round_to_grid, unpack_nibbles
from fp4cli.quant import four_over_six, ms_eden, random_bits, two_level
from fp4cli.quant.backend import use_kernels
from fp4cli.quant.blocking import BlockLayout, transformed_length
from fp4cli.quant.scales import (
    block_scales,
    divide,
    fitted_block_scales,
    nan_scales,
    scale_values,
)
from fp4cli.quant.spec import QuantSpec
from fp4cli.quant.two_level import encode_multipliers

if TYPE_CHECKING:
    from fp4cli.techniques.hadamard import FixedSigns


@dataclass
class QuantizedTensor:
    """A tensor in a block format.

    codes: uint8 element codes in the axis-last, padded layout (two per byte, low nibble first,
        for 4-bit formats). scales: one per block (uint8 codes, or floats for fp32/bf16 scales).
    tensor_amax: the largest finite |x| of a two-level spec's tensor (0-d float32), from which
        its tensor scale derives (`two_level`); with `outer_block`, each block's outer block's
        (float32, shaped like the scales); None for one-level specs.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    tensor_amax: torch.Tensor | None
    shape: torch.Size
    spec: QuantSpec
    axis: int
    dtype: torch.dtype
    layout: BlockLayout

    def element_values(self) -> torch.Tensor:
        """The decoded elements q (float32, padded axis-last layout, before scaling)."""
        codes = unpack_nibbles(self.codes) if self.spec.packed else self.codes
        return decode(codes, self.spec.element_format)

    def scale_values(self) -> torch.Tensor:
        """The block scales as float32 (NaN for non-finite blocks)."""
        return scale_values(self.scales, self.spec.scale_format)

    def grid_units(self, x: torch.Tensor) -> torch.Tensor:
        """x (the quantized tensor's source) in the units its grid is rounded in: x over the
        block scale (two-level: times its encode multiplier), times the SR pre-scale, as float32
        in x's shape."""
        blocks = self.layout.to_blocks(self.layout.pad(x.to(torch.float32).movedim(self.axis, -1)))
        if self.tensor_amax is not None:
            multipliers = encode_multipliers(self.scale_values(), self.tensor_amax, self.spec)
            units = blocks * multipliers.unsqueeze(-1)
        else:
            units = blocks / self.scale_values().unsqueeze(-1)
        if self.spec.sr_prescale != 1.0:
            units = units * self.spec.sr_prescale
        return self.layout.unpad(self.layout.from_blocks(units)).movedim(-1, self.axis)

    def dequantize(self, dtype: torch.dtype | None = None, backend: str = "auto") -> torch.Tensor:
        """The represented tensor, in the original shape and dtype (or `dtype`)."""
        return self._decoded(self.tensor_amax, dtype, backend)

    def block_values(self, dtype: torch.dtype | None = None, backend: str = "auto") -> torch.Tensor:
        """q * s of every element, without a two-level spec's tensor scale (the dequantized
        values of a one-level spec): what a block-scaled MMA multiplies before its epilogue
        applies the tensor scales (`fp4cli.gemm.nvfp4`); exact in bfloat16 for E2M1 elements
        with E4M3 scales. Original shape, in `dtype` (default: the tensor's)."""
        return self._decoded(None, dtype, backend)

    def _decoded(
        self, t_amax: torch.Tensor | None, dtype: torch.dtype | None, backend: str
    ) -> torch.Tensor:
        if use_kernels(backend, self.spec, self.codes.device):
            from fp4cli.kernels.quantization.launch import dequantize_e2m1

            return dequantize_e2m1(
                self.codes, self.scales, t_amax, self.spec, self.shape, self.axis,
                dtype or self.dtype,
            )  # fmt: skip
        blocks = self.layout.to_blocks(self.element_values())
        values = _dequantize_blocks(blocks, self.scale_values(), t_amax, self.spec)
        moved = self.layout.unpad(self.layout.from_blocks(values))
        return moved.movedim(-1, self.axis).to(dtype or self.dtype)


def quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    seed: random_bits.Seed | None = None,
    guide: torch.Tensor | None = None,
    *,
    hadamard: int | None = None,
    hadamard_seed: random_bits.Seed | FixedSigns = 0,
    backend: str = "auto",
    signed_zero: bool = False,
    tensor_amax: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Quantize `x` along `axis` with `spec`.

    seed: for stochastic rounding; None draws one from torch's random state. The random number
        for each element depends only on the seed and the element's index in `x` (row-major).
    guide: Q-EMA rounding: of the two grid points bracketing each value, take the one nearer the
        guide tensor (same shape as x, same scales); None rounds by `spec.rounding`.
    hadamard, hadamard_seed: quantize the random Hadamard transform of x (size n, signs drawn
        from hadamard_seed, or fixed: `FixedSigns`) along the axis instead; the result has the
        padded length.
    backend: "torch" (reference), "triton" (fused kernels) or "auto".
    signed_zero: a value whose element rounds to zero keeps its sign in the codes: a negative
        one (or -0.0) is written with the sign bit set (E2M1 code 8, -0), as torchao's
        NVFP4Tensor and Blackwell's conversion write it; False writes every zero as code 0.
        The values are the same either way (-0 == 0); only the bytes differ.
    tensor_amax: a whole-tensor-scaled spec's tensor amax (0-d float32) given instead of
        found: that of a larger tensor `x` is a part of (`two_level.finite_amax` of each part,
        their maximum), so that each part is quantized as the whole tensor would be.
    """
    axis = _check_input(x, axis)
    seed = _seed_for(spec, seed)
    if tensor_amax is not None and not spec.whole_tensor_scale:
        raise ValueError("tensor_amax: only for a spec with one tensor scale")
    if use_kernels(backend, spec, x.device, x.dtype):
        from fp4cli.kernels.quantization.launch import quantize_e2m1

        codes, scales, t_amax, _ = quantize_e2m1(
            x, spec, axis, seed, hadamard, hadamard_seed, guide=_guide_for(guide, x),
            t_amax=tensor_amax, signed_zero=signed_zero,
        )  # fmt: skip
        assert codes is not None and scales is not None
        shape = _transformed_shape(x, axis, hadamard)
        layout = BlockLayout.for_tensor(_moved(shape, axis), spec)
        dtype = torch.float32 if hadamard else x.dtype
        return QuantizedTensor(codes, scales, t_amax, shape, spec, axis, dtype, layout)
    x, guide = _transform(x, guide, axis, hadamard, hadamard_seed)
    q, stored_scales, t_amax, layout = _reference_blocks(x, spec, axis, seed, guide, tensor_amax)
    codes = encode(layout.from_blocks(q), spec.element_format)
    if signed_zero:
        codes = signed_zero_codes(codes, layout.from_blocks(q), spec)
    if spec.packed:
        codes = pack_nibbles(codes)
    return QuantizedTensor(codes, stored_scales, t_amax, x.shape, spec, axis, x.dtype, layout)


def fake_quantize(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int = -1,
    seed: random_bits.Seed | None = None,
    guide: torch.Tensor | None = None,
    *,
    hadamard: int | None = None,
    hadamard_seed: random_bits.Seed | FixedSigns = 0,
    out_dtype: torch.dtype | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """quantize(x, ...).dequantize() without encoding and packing, in `out_dtype` (default: x's
    dtype; float32 with a Hadamard transform, whose output is float32)."""
    axis = _check_input(x, axis)
    seed = _seed_for(spec, seed)
    dtype = out_dtype or (torch.float32 if hadamard else x.dtype)
    if use_kernels(backend, spec, x.device, x.dtype):
        from fp4cli.kernels.quantization.launch import quantize_e2m1

        values = quantize_e2m1(
            x, spec, axis, seed, hadamard, hadamard_seed, values_dtype=dtype,
            guide=_guide_for(guide, x),
        )[3]  # fmt: skip
        assert values is not None
        return values
    x, guide = _transform(x, guide, axis, hadamard, hadamard_seed)
    q, stored_scales, t_amax, layout = _reference_blocks(x, spec, axis, seed, guide)
    values = _dequantize_blocks(q, scale_values(stored_scales, spec.scale_format), t_amax, spec)
    return layout.unpad(layout.from_blocks(values)).movedim(-1, axis).to(dtype)


def signed_zero_codes(codes: torch.Tensor, q: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """`codes` (uint8, unpacked) with the sign bit set where the element value q is -0.0 (a
    negative value, or -0.0, rounded to zero; a non-finite block's elements are +0)."""
    fmt = spec.element_format
    if not fmt.signed:
        return codes
    negative_zero = (q == 0) & torch.signbit(q)
    return codes | (negative_zero.to(torch.uint8) * fmt.sign_bit)


def _reference_blocks(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    seed: random_bits.Seed | None,
    guide: torch.Tensor | None,
    tensor_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, BlockLayout]:
    """The reference's steps 1-4: (element values q in blocks, stored scales, tensor amax,
    layout) of x along `axis`; `tensor_amax` given or found."""
    blocks, layout = _blocks_of(x.to(torch.float32), spec, axis)
    uniform = _uniform_blocks(x, spec, axis, layout, seed)
    guide_blocks = _blocks_of(guide.to(torch.float32), spec, axis)[0] if guide is not None else None
    real = _real_values(layout, x.device) if spec.fitted_scale else None
    return (*_quantize_blocks(blocks, spec, uniform, guide_blocks, real, tensor_amax), layout)


def _real_values(layout: BlockLayout, device: torch.device) -> torch.Tensor:
    """Which of the blocks' values are the tensor's, not padding (bool, in blocks)."""
    ones = torch.ones(layout.moved_shape, dtype=torch.bool, device=device)
    return layout.to_blocks(layout.pad(ones))


def _guide_for(guide: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor | None:
    if guide is not None and guide.shape != x.shape:
        raise ValueError(f"guide has shape {tuple(guide.shape)}, x {tuple(x.shape)}")
    return guide


def _seed_for(spec: QuantSpec, seed: random_bits.Seed | None) -> random_bits.Seed | None:
    """The seed to use: drawn from torch's random state when SR (of elements, or of MS-EDEN's
    scales) needs one and none is given."""
    if spec.rounding in ("sr", "eden") and seed is None:
        return random_bits.draw_seed()
    return seed


def _transform(
    x: torch.Tensor,
    guide: torch.Tensor | None,
    axis: int,
    hadamard: int | None,
    seed: random_bits.Seed | FixedSigns,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    if not hadamard:
        return x, guide
    from fp4cli.techniques.hadamard import rht

    guide = rht(guide, axis, hadamard, seed) if guide is not None else None
    return rht(x, axis, hadamard, seed), guide


def _transformed_shape(x: torch.Tensor, axis: int, hadamard: int | None) -> torch.Size:
    if not hadamard:
        return x.shape
    shape = list(x.shape)
    shape[axis] = transformed_length(shape[axis], hadamard)
    return torch.Size(shape)


def _moved(shape: torch.Size, axis: int) -> tuple[int, ...]:
    return (*shape[:axis], *shape[axis + 1 :], shape[axis])


def _check_input(x: torch.Tensor, axis: int) -> int:
    if not torch.is_floating_point(x):
        raise TypeError(f"quantize needs a floating-point tensor (got {x.dtype})")
    if x.dim() == 0 or x.numel() == 0:
        raise ValueError(f"cannot quantize a tensor of shape {tuple(x.shape)}")
    if not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis} is out of range for a {x.dim()}-D tensor")
    return axis % x.dim()


def _blocks_of(x: torch.Tensor, spec: QuantSpec, axis: int) -> tuple[torch.Tensor, BlockLayout]:
    moved = x.movedim(axis, -1)
    layout = BlockLayout.for_tensor(tuple(moved.shape), spec)
    return layout.to_blocks(layout.pad(moved)), layout


def _uniform_blocks(
    x: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    layout: BlockLayout,
    seed: random_bits.Seed | None,
) -> torch.Tensor | None:
    """Uniform numbers for stochastic rounding, keyed by each element's index in x (MS-EDEN:
    one per block, keyed by the index of the block's first element)."""
    if spec.rounding not in ("sr", "eden"):
        return None
    assert seed is not None
    index = torch.arange(x.numel(), device=x.device, dtype=torch.int64).reshape(x.shape)
    moved_index = layout.to_blocks(layout.pad(index.movedim(axis, -1)))
    if spec.rounding == "eden":  # MS-EDEN's scale rounding: 24 bits
        moved_index = moved_index[..., 0]
        return random_bits.uniform(seed, moved_index, x.numel())
    # padding draws at index 0
    return random_bits.uniform_at(seed, moved_index, x.numel(), spec.sr_bits)


def _quantize_blocks(
    blocks: torch.Tensor,
    spec: QuantSpec,
    uniform: torch.Tensor | None,
    guide: torch.Tensor | None,
    real: torch.Tensor | None = None,
    given_amax: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(element values q on the grid, stored scales, tensor amax) for float32 blocks; `real`
    (which values are not padding) for the scales fitted to the block's spread; `given_amax`:
    the tensor amax of a whole tensor these blocks are part of."""
    # a block holding NaN or +-Inf has a non-finite largest magnitude (amax keeps NaN)
    finite_block = torch.isfinite(blocks.abs().amax(dim=-1))
    blocks = torch.nan_to_num(blocks, nan=0.0, posinf=0.0, neginf=0.0)
    block_amax = blocks.abs().amax(dim=-1)
    t_amax = two_level.second_level_amax(block_amax, spec) if spec.tensor_scale else None
    if given_amax is not None:
        t_amax = given_amax.to(torch.float32)
    fitted = fitted_block_scales(blocks, real, spec) if real is not None else None
    q, stored, scales = _candidate(blocks, block_amax, t_amax, spec, uniform, guide, fitted=fitted)
    if spec.rounding == "eden":
        assert t_amax is not None and uniform is not None
        _, stored = ms_eden.correct_scales(blocks, q, scales, t_amax, spec, uniform)
    if spec.four_over_six:
        q4, stored4, scales4 = _candidate(
            blocks, block_amax, t_amax, spec, uniform, guide, four_over_six.FOUR
        )
        four = four_over_six.prefer_four(
            blocks,
            block_amax,
            _dequantize_blocks(q, scales, t_amax, spec),
            _dequantize_blocks(q4, scales4, t_amax, spec),
            spec.four_over_six_metric,
        )
        q = torch.where(four.unsqueeze(-1), q4, q)
        stored = torch.where(four, stored4, stored)
    q = torch.where(finite_block.unsqueeze(-1), q, torch.zeros_like(q))
    stored = torch.where(finite_block, stored, nan_scales(stored, spec.scale_format))
    return q, stored, t_amax


def _candidate(
    blocks: torch.Tensor,
    block_amax: torch.Tensor,
    t_amax: torch.Tensor | None,
    spec: QuantSpec,
    uniform: torch.Tensor | None,
    guide: torch.Tensor | None,
    element_max: float | None = None,
    fitted: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(element values q, stored scales, scale values) of finite blocks, each block's amax
    scaled onto the element format's largest value (or `element_max`), or with `fitted` (scale
    values, stored scales) those scales."""
    if t_amax is not None:
        scales, stored = two_level.block_scales(block_amax, t_amax, spec, element_max)
        multipliers = encode_multipliers(scales, t_amax, spec).unsqueeze(-1)
        scaled = blocks * multipliers
        guide = guide * multipliers if guide is not None else None
    else:
        scales, stored = fitted or block_scales(block_amax, spec, element_max)
        scaled = blocks / scales.unsqueeze(-1)
        guide = guide / scales.unsqueeze(-1) if guide is not None else None
    if spec.sr_prescale != 1.0:
        scaled = scaled * spec.sr_prescale
    if guide is not None:
        q = round_to_grid(scaled, spec.element_format, "guided", guide=guide)
    else:
        q = round_to_grid(scaled, spec.element_format, _grid_rounding(spec), uniform=uniform)
    return q, stored, scales


def _grid_rounding(spec: QuantSpec) -> str:
    """`round_to_grid`'s rounding for the spec's elements: MS-EDEN's to nearest (ties away),
    stochastic rounding by carry at 8 or 16 bits ("sr_carry"), else the spec's own."""
    if spec.rounding == "eden":
        return "away"
    if spec.rounding == "sr" and spec.sr_bits != 24:
        return "sr_carry"
    return spec.rounding


def _dequantize_blocks(
    q: torch.Tensor, scales: torch.Tensor, t_amax: torch.Tensor | None, spec: QuantSpec
) -> torch.Tensor:
    if t_amax is not None:
        values = q * two_level.decode_factors(scales, t_amax, spec).unsqueeze(-1)
    else:
        values = q * scales.unsqueeze(-1)  # NaN scales make whole blocks NaN
    if spec.sr_prescale != 1.0:
        values = divide(values, spec.sr_prescale)
    return values
