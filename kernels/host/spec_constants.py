"""The compile-time constants (tl.constexpr values) a QuantSpec gives the kernels.

`spec_constants(spec)` is the one place a spec becomes constexprs: the quantize kernel takes
them as they are, the pair kernel once per direction (prefixed ROW_ or COL_). kernels/README.md
has the table of QuantSpec fields and the constexprs they set. The helpers below are its parts,
and the encode-table kernel's own (`table_constants`).
"""

from __future__ import annotations

import functools

from fp4cli.formats import float32
from fp4cli.kernels.tiles.four_over_six import (
    FOUR_OVER_SIX_ESTIMATE,
    FOUR_OVER_SIX_MAE,
    FOUR_OVER_SIX_OFF,
)
from fp4cli.kernels.tiles.prescale import prescale_constants
from fp4cli.quant import two_level
from fp4cli.quant.spec import QuantSpec


def _scale_constants(spec: QuantSpec) -> dict[str, object]:
    """The scale format's constexprs (the quantize kernels' SCALE_*)."""
    fmt = spec.scale_format
    if fmt.kind == "pow2":
        return dict(POW2_SCALE=True, SCALE_MBITS=0, SCALE_MIN_EXP=0, SCALE_MAX=0.0, SCALE_NAN=255)
    mini = fmt.minifloat
    assert mini is not None
    return dict(
        POW2_SCALE=False,
        SCALE_MBITS=mini.mbits,
        SCALE_MIN_EXP=mini.min_exponent,
        SCALE_MAX=mini.max_value,
        SCALE_NAN=fmt.nan_code,
    )


def two_level_constants(spec: QuantSpec) -> dict[str, float]:
    """DECODE_INV, the quantize and dequantize kernels' two-level constant: 1 / (scale max *
    element max) as a float32 value (`fp4cli.quant.two_level.constants`). The encode side's
    constants live in the tensor's table (`encode_tables`)."""
    return dict(DECODE_INV=float32(two_level.constants(spec)[2]))


@functools.lru_cache(maxsize=64)
def outer_constants(spec: QuantSpec) -> dict[str, object]:
    """The quantize kernels' outer-block constexprs: OUTER, the blocks in one of
    `spec.outer_block`'s outer blocks (0 without), and the encode formulas' S * E and 1 / E
    (`two_level.outer_block_scales`) as float32 values."""
    if not spec.outer_block:
        return dict(OUTER=0, TWO_LEVEL_TARGET=0.0, ELEM_INV=0.0)
    target, element_inverse, _ = two_level.constants(spec)
    return dict(
        OUTER=spec.outer_block // int(spec.block),
        TWO_LEVEL_TARGET=float32(target),
        ELEM_INV=float32(element_inverse),
    )


def rounding_constants(spec: QuantSpec) -> dict[str, object]:
    """SR (stochastic rounding's bits a value, `sr_bits`: 24, 16 or 8; 0 without), AWAY and
    EDEN (MS-EDEN's group in blocks, 0 without; its elements round to nearest with ties away)
    of the quantize kernels."""
    eden = spec.rounding == "eden"
    return dict(
        SR=spec.sr_bits if spec.rounding == "sr" else 0,
        AWAY=spec.rounding == "away" or eden,
        EDEN=spec.eden_group // int(spec.block) if eden else 0,
    )


@functools.lru_cache(maxsize=64)
def table_constants(spec: QuantSpec) -> dict[str, object]:
    """The constexprs of `encode_table.encode_table_kernel` for `spec`'s two-level scaling: the
    scale format's, and S * E and 1 / E as float32 values."""
    mini = spec.scale_format.minifloat
    assert mini is not None, "two-level scaling needs a minifloat block scale"
    target, element_inverse, _ = two_level.constants(spec)
    return dict(
        SCALE_MBITS=mini.mbits,
        SCALE_MIN_EXP=mini.min_exponent,
        SCALE_MAX_CODE=mini.max_code,
        TWO_LEVEL_TARGET=float32(target),
        ELEM_INV=float32(element_inverse),
    )


def four_over_six_mode(spec: QuantSpec) -> int:
    """The single-direction kernel's FOUR_OVER_SIX: off, the float32 estimate first (squared
    errors) or the exact absolute errors."""
    if not spec.four_over_six:
        return FOUR_OVER_SIX_OFF.value
    absolute = spec.four_over_six_metric == "mae"
    return (FOUR_OVER_SIX_MAE if absolute else FOUR_OVER_SIX_ESTIMATE).value


def spec_constants(spec: QuantSpec) -> dict[str, object]:
    """Every constexpr a QuantSpec alone decides, by name:

    - BLOCK (elements a block scale covers) and CEIL (scale_rule ceil);
    - SR, AWAY, EDEN (`rounding_constants`);
    - POW2_SCALE, SCALE_MBITS, SCALE_MIN_EXP, SCALE_MAX, SCALE_NAN (the block scale's format);
    - TENSOR_SCALE, DECODE_INV, OUTER, TWO_LEVEL_TARGET, ELEM_INV (two-level scaling);
    - E1M2 (the element grid) and FOUR_OVER_SIX (`four_over_six_mode`);
    - PRESCALE, PRESCALE_INV, PRESCALE_FIX, PRESCALE_FIX_RATIO, PRESCALE_REMAINDER
      (`kernels.tiles.prescale`).

    A launch adds what the call decides: tiles, seeds' sources, the transform, the outputs."""
    return dict(
        BLOCK=int(spec.block),
        CEIL=spec.scale_rule == "ceil",
        **rounding_constants(spec),
        **_scale_constants(spec),
        TENSOR_SCALE=spec.tensor_scale,
        **two_level_constants(spec),
        **outer_constants(spec),
        E1M2=spec.element == "e1m2",
        FOUR_OVER_SIX=four_over_six_mode(spec),
        **prescale_constants(spec),
    )
