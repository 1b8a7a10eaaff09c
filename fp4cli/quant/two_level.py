"""Two-level scaling (NVFP4's): an FP32 tensor scale from the tensor's amax, and block scales
relative to it, in the order of operations of TransformerEngine's NVFP4 reference quantizer.

For a tensor whose largest finite |x| is A (with `QuantSpec.outer_block`, A is each block's
outer block's: every formula below holds per block), a scale format of largest value S (448
for UE4M3) and an element format of largest value E (6 for E2M1), every step a float32
operation:

    G = min(S * E / A, FLT_MAX)            the global encode scale (FLT_MAX when A is 0)
    D = 1 / G                              the global decode scale
    s = round(min(a * (G * (1 / E)), S))   each block's scale from its amax a, onto the scale
                                           grid (nearest even, or up under the ceil rule);
                                           may round to 0
    e = min(1 / (s * D), FLT_MAX)          the block's encode multiplier: elements are x * e
    x ~ q * ((s * A) * (1 / (S * E)))      dequantization (the decode kernel's order)

`1 / E` and `1 / (S * E)` are float32 constants (rounded once). A block whose scale rounds to 0
encodes with FLT_MAX (its elements saturate) and decodes to 0, as the reference does.

Four-over-six (`QuantSpec.four_over_six`) and MS-EDEN (rounding "eden") take S as the largest
power of two at most S / 1.5 (256 for UE4M3); four-over-six's "scaled to 4" candidate uses
1 / 4 in place of 1 / E in the block scale.
"""

from __future__ import annotations

import math

import torch

from fp4cli.formats import encode, round_to_grid
from fp4cli.quant.spec import QuantSpec

FLOAT32_MAX = torch.finfo(torch.float32).max


def second_level_amax(block_amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """A: the tensor's amax (0-d) from its blocks' finite amaxes (*lead, n_blocks); with
    `outer_block`, each block's outer block's amax instead (shaped like `block_amax`)."""
    if not spec.outer_block:
        return block_amax.amax()
    assert isinstance(spec.block, int)
    per_outer = spec.outer_block // spec.block
    n_blocks = block_amax.shape[-1]
    padded = torch.nn.functional.pad(block_amax, (0, -n_blocks % per_outer))
    outer = padded.unflatten(-1, (-1, per_outer)).amax(dim=-1)
    return outer.repeat_interleave(per_outer, dim=-1)[..., :n_blocks]


def finite_amax(x: torch.Tensor) -> torch.Tensor:
    """The largest finite |x| (0-d float32; 0 when none is): a whole-tensor-scaled spec's
    tensor amax, as `second_level_amax` finds it from the blocks (NaN and +-Inf count as 0)."""
    finite = torch.nan_to_num(x.to(torch.float32), nan=0.0, posinf=0.0, neginf=0.0)
    return finite.abs().amax() if finite.numel() else finite.new_zeros(())


def _constant(like: torch.Tensor, value: float) -> torch.Tensor:
    """`value` rounded to float32, made on like's device (no host copy per call)."""
    return torch.full_like(like, value, dtype=torch.float32)


def scale_max(spec: QuantSpec) -> float:
    """S: the largest block scale the tensor scale maps the tensor's amax onto."""
    largest = spec.scale_format.max_value
    # room for a block scaled to 4 (1.5 times its scale to 6), or for MS-EDEN's correction
    if spec.four_over_six or spec.rounding == "eden":
        return float(2 ** math.floor(math.log2(largest / 1.5)))
    return largest


def constants(spec: QuantSpec) -> tuple[float, float, float]:
    """(S * E, 1 / E, 1 / (S * E)): the global encode scale's numerator and the reciprocals the
    steps multiply by, before their one rounding to float32 (here and in the kernels)."""
    target = scale_max(spec) * spec.element_format.max_value
    return target, 1.0 / spec.element_format.max_value, 1.0 / target


def global_encode_scale(tensor_amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """G = min(S * E / A, FLT_MAX), float32 (FLT_MAX for an all-zero tensor)."""
    target = _constant(tensor_amax, constants(spec)[0])
    return torch.clamp(target / tensor_amax, max=FLOAT32_MAX)


def block_scales(
    block_amax: torch.Tensor,
    tensor_amax: torch.Tensor,
    spec: QuantSpec,
    element_max: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale values as float32, stored uint8 codes) of each block's finite amax, scaled onto
    the element format's largest value (or `element_max`, four-over-six's 4)."""
    fmt = spec.scale_format.minifloat
    assert fmt is not None, "two-level scaling needs a minifloat block scale"
    g = global_encode_scale(tensor_amax, spec)
    element_inverse = 1.0 / element_max if element_max else constants(spec)[1]
    multiplier = g * _constant(g, element_inverse)
    raw = torch.clamp(block_amax * multiplier, max=FLOAT32_MAX)
    raw = torch.clamp(raw, max=fmt.max_value)
    values = round_to_grid(raw, fmt, "up" if spec.scale_rule == "ceil" else "rne")
    return values, encode(values, fmt)


def encode_multipliers(
    scale_values: torch.Tensor, tensor_amax: torch.Tensor, spec: QuantSpec
) -> torch.Tensor:
    """e = min(1 / (s * D), FLT_MAX) for each block scale s: elements are rounded from x * e."""
    g = global_encode_scale(tensor_amax, spec)
    decode = _constant(g, 1.0) / g
    return torch.clamp(_constant(scale_values, 1.0) / (scale_values * decode), max=FLOAT32_MAX)


def decode_factors(
    scale_values: torch.Tensor, tensor_amax: torch.Tensor, spec: QuantSpec
) -> torch.Tensor:
    """(s * A) * (1 / (S * E)) for each block scale s: a value decodes as q times this."""
    inverse = _constant(scale_values, constants(spec)[2])
    return (scale_values * tensor_amax) * inverse
