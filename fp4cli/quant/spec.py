"""QuantSpec: one frozen, validated description of how a tensor is quantized."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from fp4cli.formats import ELEMENT_FORMATS, SCALE_FORMATS, Minifloat, ScaleFormat

BLOCK_KINDS = ("row", "column", "tensor")
SCALE_RULES = ("floor", "ceil", "rms", "std")
FITTED_RULES = ("rms", "std")  # scales fitted to the block's spread (QuEST), not its amax
RMS_CLIP_MAX = 64.0
ROUNDINGS = ("rne", "sr", "away", "ties_up", "eden")
SR_BITS = (8, 16, 24)
FOUR_OVER_SIX_METRICS = ("mse", "mae")
CARRY_ELEMENTS = ("e2m1", "e1m2")  # the grids the carry rule of 8 or 16 bits is defined on
EDEN_GROUP_MAX = 1024
OUTER_BLOCK_MAX = 4096
MIN_BLOCK, MAX_BLOCK = 8, 256


class SpecError(ValueError):
    """An impossible quantizer configuration; the message names the field."""


@dataclass(frozen=True)
class QuantSpec:
    """How to quantize a tensor along one axis.

    element: element format: e2m1 (FP4), e3m0, int4 (sign-magnitude), e1m2 (the uniform grid
        0..3.5 in steps of 0.5), e4m3, e5m2.
    scale: block-scale format: e8m0 (power of two), ue5m3, ue4m3, fp32, bf16.
    block: values per scale, 8..256 (an even number), or "row" (one scale for the whole axis:
        per-token / per-channel), "column" (one scale per position along the axis, shared by
        every line: the per-input-channel scale of an (out, in) weight quantized along `in`,
        as Wang et al.'s code scales weights) or "tensor" (one scale for the whole tensor).
    tile2d: blocks are block x block squares over a 2-D tensor (both dimensions), so a weight
        and its transpose quantize identically (NVFP4's 16x16 weight blocks).
    scale_rule: "floor" (OCP: 2^(floor(log2 amax) - emax), elements saturate) or "ceil"
        (truncation-free: the smallest scale with amax / scale <= element max). For non power of
        two scale formats, "floor" rounds amax / emax_value to nearest even, "ceil" rounds it up.
        "rms" or "std" (QuEST's Gaussian fit, `scales.fitted_block_scales`): the block's RMS, or
        its standard deviation, times rms_clip / emax_value, to the largest power of two at or
        below it for e8m0 (Quartet's 2^floor(log2 s)), else to nearest even; values beyond
        the grid saturate.
    rounding: "rne", "sr" (stochastic, seeded), "away" (ties away from zero), "ties_up" (ties
        toward +inf: 5 -> 6, -5 -> -4, as Wang et al.'s E2M1 kernel rounds) or "eden"
        (Quartet II's MS-EDEN, `fp4cli.quant.ms_eden`: elements rounded ties away from zero,
        then per group of `eden_group` values the correction <u, u> / <u, q> (u: the values in
        grid units, q: their rounded values) multiplies the group's block scales, each rounded
        stochastically onto the scale format; seeded). Needs a tensor scale and integer blocks.
    sr_prescale: multiply values by this before rounding and divide after (Tseng et al.: 0.75,
        so that stochastic rounding with the floor rule never clips; with "eden" up to 2:
        Quartet II's backward maps a block's amax to 6 / (17/16 * 0.93), a pre-scale of 1.012).
    tensor_scale: two-level scaling: an FP32 per-tensor scale maps the tensor's amax onto the
        largest block scale times the element max (NVFP4: 448 * 6 / amax).
    four_over_six: each block is quantized twice, its amax scaled to 6 and to 4 (by the
        scale rule, with element max 6 or 4), and keeps the one whose decoded values are
        nearer the block's (squared error; 6 on a tie). E2M1 only; with a tensor scale the
        largest block scale is the largest power of two below scale max / 1.5 (NVFP4: 256),
        so that a block scaled to 4 still fits (Cook et al., Four Over Six).
    four_over_six_metric: the error four-over-six compares: "mse" (the squared error, the
        default and Four Over Six's code's) or "mae" (the absolute error, TransformerEngine's
        default); both exact integer sums (`fp4cli.quant.four_over_six`).
    outer_block: with tensor_scale, the FP32 second-level scale is one per `outer_block`
        values along the axis (from their amax) instead of one per tensor: TetraJet-v2's
        "double-block" NVFP4 (128 over blocks of 16). 0 (the default): one per tensor.
    eden_group: values per MS-EDEN correction group (rounding "eden"): a multiple of the block,
        at most 1024; Quartet II's released kernels correct per 128 values, the size of their
        Hadamard transform.
    sr_bits: the random bits a stochastically rounded value takes (rounding "sr"): 24 (the
        default: up when a 24-bit uniform number is below the distance from the lower grid
        point), or 8 or 16 (Blackwell's `cvt.rs`: the bits are added below the grid step and
        the carry rounds up; E2M1 and E1M2 elements). docs/numerics.md has both rules.
    rms_clip: with scale_rule "rms" or "std", where the grid's largest value sits, in RMS (or
        standard deviation) units: the scale is rms_clip * RMS / emax_value before its rounding
        (QuEST's and Quartet's E2M1 fit: 2.92247856). 0 (the default) with the other rules.
    """

    element: str = "e2m1"
    scale: str = "e8m0"
    block: int | str = 32
    tile2d: bool = False
    scale_rule: str = "floor"
    rounding: str = "rne"
    sr_prescale: float = 1.0
    tensor_scale: bool = False
    # left out of a resolved recipe while false, so recipes resolved before it keep their form
    four_over_six: bool = dataclasses.field(default=False, metadata={"omit_default": True})
    eden_group: int = dataclasses.field(default=128, metadata={"omit_default": True})
    outer_block: int = dataclasses.field(default=0, metadata={"omit_default": True})
    sr_bits: int = dataclasses.field(default=24, metadata={"omit_default": True})
    four_over_six_metric: str = dataclasses.field(default="mse", metadata={"omit_default": True})
    scale_bf16: bool = dataclasses.field(default=False, metadata={"omit_default": True})
    rms_clip: float = dataclasses.field(default=0.0, metadata={"omit_default": True})

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "mxfp4": {},
        "mxfp4-ceil": {"scale_rule": "ceil"},
        "mxfp4-sr": {"rounding": "sr"},
        "mxfp4-ue5m3": {"scale": "ue5m3", "tensor_scale": True},
        "nvfp4": {"scale": "ue4m3", "block": 16, "tensor_scale": True},
        "nvfp4-2d": {"scale": "ue4m3", "block": 16, "tensor_scale": True, "tile2d": True},
        "nvfp4-4over6": {
            "scale": "ue4m3",
            "block": 16,
            "tensor_scale": True,
            "four_over_six": True,
        },
        # Quartet II's backward quantizer: MS-EDEN, a block's amax mapped to 6 / (17/16 * 0.93)
        "nvfp4-eden": {
            "scale": "ue4m3",
            "block": 16,
            "tensor_scale": True,
            "rounding": "eden",
            "sr_prescale": 16 / (17 * 0.93),
        },
        # TetraJet-v2's double-block NVFP4: an FP32 scale per 128 values over E4M3 ones per 16
        "nvfp4-outer128": {
            "scale": "ue4m3",
            "block": 16,
            "tensor_scale": True,
            "outer_block": 128,
        },
        # Quartet's forward quantizer: MXFP4 whose scale is fitted to the block's standard
        # deviation, the grid's 6 at 2.92247856 sigma (QuEST's E2M1 fit), rounded down to 2^k
        "mxfp4-quest": {"scale_rule": "std", "rms_clip": 2.92247856},
        # QuEST's FP4 quantizer: one FP32 scale per row, the grid's 6 at 2.92247856 RMS
        "fp4-row-rms": {
            "scale": "fp32",
            "block": "row",
            "scale_rule": "rms",
            "rms_clip": 2.92247856,
        },
        "fp4-row": {"block": "row", "scale_rule": "ceil"},
        "fp4-column": {"block": "column", "scale_rule": "ceil"},
        "fp8-e4m3": {"element": "e4m3", "scale": "fp32", "block": "row"},
        "fp8-e5m2": {"element": "e5m2", "scale": "fp32", "block": "row"},
        "fp8-e4m3-tensor": {"element": "e4m3", "block": "tensor", "scale_rule": "ceil"},
        "fp8-e5m2-tensor": {"element": "e5m2", "block": "tensor", "scale_rule": "ceil"},
    }

    def __post_init__(self) -> None:
        _check_choice("element", self.element, tuple(ELEMENT_FORMATS))
        _check_choice("scale", self.scale, tuple(SCALE_FORMATS))
        _check_choice("scale_rule", self.scale_rule, SCALE_RULES)
        _check_choice("rounding", self.rounding, ROUNDINGS)
        if isinstance(self.block, bool) or not isinstance(self.block, (int, str)):
            raise SpecError(
                f"block: must be an integer {MIN_BLOCK}..{MAX_BLOCK}, 'row' or 'tensor'"
            )
        if isinstance(self.block, str):
            _check_choice("block", self.block, BLOCK_KINDS)
        elif not (MIN_BLOCK <= self.block <= MAX_BLOCK) or self.block % 2:
            raise SpecError(
                f"block: must be an even integer in {MIN_BLOCK}..{MAX_BLOCK} (got {self.block})"
            )
        if self.tile2d and not isinstance(self.block, int):
            raise SpecError("tile2d: needs an integer block size (the tile is block x block)")
        self._check_prescale()
        if self.tensor_scale and self.scale_format.kind != "minifloat":
            raise SpecError(
                f"tensor_scale: only with a ue5m3 or ue4m3 block scale (got scale {self.scale!r})"
            )
        for flag in ("tile2d", "tensor_scale", "four_over_six", "scale_bf16"):
            if not isinstance(getattr(self, flag), bool):
                raise SpecError(f"{flag}: must be true or false")
        if self.four_over_six and self.element != "e2m1":
            raise SpecError(f"four_over_six: only with e2m1 elements (got {self.element!r})")
        self._check_four_over_six_metric()
        self._check_scale_bf16()
        self._check_fitted_scale()
        self._check_eden()
        self._check_outer_block()
        self._check_sr_bits()

    def _check_four_over_six_metric(self) -> None:
        _check_choice("four_over_six_metric", self.four_over_six_metric, FOUR_OVER_SIX_METRICS)
        if self.four_over_six_metric != "mse" and not self.four_over_six:
            raise SpecError("four_over_six_metric: only applies with four_over_six")

    def _check_scale_bf16(self) -> None:
        if not self.scale_bf16:
            return
        vector_wise = self.block in ("row", "column", "tensor")
        if not (self.element == "e2m1" and self.scale == "e8m0" and vector_wise):
            raise SpecError(
                "scale_bf16: MS-AMP's scale is for e2m1 elements with an e8m0 scale and block "
                "row, column or tensor"
            )
        if self.scale_rule != "ceil":
            raise SpecError("scale_bf16: needs scale_rule ceil (MS-AMP's 2^-floor(log2(6 / amax)))")

    def _check_fitted_scale(self) -> None:
        clip = self.rms_clip
        if isinstance(clip, bool) or not isinstance(clip, (int, float)):
            raise SpecError(f"rms_clip: must be a number (got {clip!r})")
        if self.scale_rule not in FITTED_RULES:
            if clip != 0:
                raise SpecError("rms_clip: only applies with scale_rule rms or std")
            return
        if not 0 < clip <= RMS_CLIP_MAX:
            unit = "RMS" if self.scale_rule == "rms" else "standard deviation"
            raise SpecError(
                f"rms_clip: scale_rule {self.scale_rule} needs where the grid's largest value "
                f"sits, in {unit} units, in (0, {RMS_CLIP_MAX:g}] (got {clip!r})"
            )
        for flag in ("tensor_scale", "four_over_six"):
            if getattr(self, flag):
                raise SpecError(
                    f"scale_rule: {self.scale_rule} cannot be combined with {flag} (which scales "
                    "from the amax)"
                )

    def _check_sr_bits(self) -> None:
        bits = self.sr_bits
        if isinstance(bits, bool) or bits not in SR_BITS:
            choices = ", ".join(map(str, SR_BITS))
            raise SpecError(f"sr_bits: must be one of {choices} (got {bits!r})")
        if bits == 24:
            return
        if self.rounding != "sr":
            raise SpecError("sr_bits: only applies with rounding 'sr'")
        if self.element not in CARRY_ELEMENTS:
            raise SpecError(
                f"sr_bits {bits}: rounds {' or '.join(CARRY_ELEMENTS)} elements "
                f"(got {self.element!r}); use 24"
            )

    def _check_outer_block(self) -> None:
        outer = self.outer_block
        if isinstance(outer, bool) or not isinstance(outer, int):
            raise SpecError(f"outer_block: must be an integer (got {outer!r})")
        if outer == 0:
            return
        if not self.tensor_scale:
            raise SpecError("outer_block: needs tensor_scale (it replaces the tensor's scale)")
        if not isinstance(self.block, int) or self.tile2d:
            raise SpecError("outer_block: needs an integer block size without tile2d")
        if not (self.block <= outer <= OUTER_BLOCK_MAX) or outer % self.block:
            raise SpecError(
                f"outer_block: must be 0 or a multiple of the block ({self.block}) up to "
                f"{OUTER_BLOCK_MAX} (got {outer})"
            )

    def _check_prescale(self) -> None:
        top = 2.0 if self.rounding == "eden" else 1.0
        if isinstance(self.sr_prescale, bool) or not isinstance(self.sr_prescale, (int, float)):
            raise SpecError(f"sr_prescale: must be a number (got {self.sr_prescale!r})")
        if not 0 < self.sr_prescale <= top:
            raise SpecError(f"sr_prescale: must be in (0, {top:g}] (got {self.sr_prescale!r})")
        if self.sr_prescale != 1.0 and self.rounding not in ("sr", "eden"):
            raise SpecError("sr_prescale: only applies with rounding 'sr' or 'eden'")

    def _check_eden(self) -> None:
        group = self.eden_group
        if isinstance(group, bool) or not isinstance(group, int):
            raise SpecError(f"eden_group: must be an integer (got {group!r})")
        if self.rounding != "eden":
            if group != 128:
                raise SpecError("eden_group: only applies with rounding 'eden'")
            return
        if not self.tensor_scale:
            raise SpecError("rounding eden: needs tensor_scale (a ue4m3 or ue5m3 block scale)")
        if not isinstance(self.block, int) or self.tile2d:
            raise SpecError("rounding eden: needs an integer block size without tile2d")
        if self.four_over_six:
            raise SpecError("rounding eden: cannot be combined with four_over_six")
        if not (self.block <= group <= EDEN_GROUP_MAX) or group % self.block:
            raise SpecError(
                f"eden_group: must be a multiple of the block ({self.block}) up to "
                f"{EDEN_GROUP_MAX} (got {group})"
            )

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> QuantSpec:
        """A named spec (mxfp4, mxfp4-ceil, nvfp4, mxfp4-ue5m3, ...), with optional overrides."""
        if name not in cls.PRESETS:
            raise SpecError(f"unknown preset {name!r}; known: {', '.join(cls.PRESETS)}")
        return cls(**{**cls.PRESETS[name], **overrides})

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> QuantSpec:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def element_format(self) -> Minifloat:
        return ELEMENT_FORMATS[self.element]

    @property
    def scale_format(self) -> ScaleFormat:
        return SCALE_FORMATS[self.scale]

    @property
    def whole_tensor_scale(self) -> bool:
        """Whether one FP32 scale covers the whole tensor (two-level without an outer block):
        its amax takes a pass over the tensor of its own."""
        return self.tensor_scale and not self.outer_block

    @property
    def fitted_scale(self) -> bool:
        """Whether block scales are fitted to the block's RMS or standard deviation."""
        return self.scale_rule in FITTED_RULES

    @property
    def packed(self) -> bool:
        """Whether codes are stored two per byte."""
        return self.element_format.bits == 4

    def short(self) -> str:
        """A compact label, e.g. 'e2m1/e8m0/32/ceil/sr'."""
        parts = [self.element, self.scale, str(self.block) + ("x2d" if self.tile2d else "")]
        parts += [self.scale_rule, self.rounding]
        if self.sr_prescale != 1.0:
            parts.append(f"pre{self.sr_prescale:g}")
        if self.tensor_scale:
            parts.append("ts")
        if self.four_over_six:
            parts.append("4over6" if self.four_over_six_metric == "mse" else "4over6mae")
        if self.scale_bf16:
            parts.append("bf16scale")
        if self.rounding == "eden":
            parts.append(f"group{self.eden_group}")
        if self.outer_block:
            parts.append(f"outer{self.outer_block}")
        if self.sr_bits != 24:
            parts.append(f"{self.sr_bits}bits")
        if self.rms_clip:
            parts.append(f"clip{self.rms_clip:g}")
        return "/".join(parts)


def _check_choice(field: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise SpecError(f"{field}: must be one of {', '.join(choices)} (got {value!r})")
