"""The element and scale formats by name, as DESIGN's numerics contract states them."""

from __future__ import annotations

from dataclasses import dataclass

from fp4cli.formats.minifloat import Minifloat

# Element formats (signed). Codes: sign << (ebits + mbits) | exponent << mbits | mantissa.
E2M1 = Minifloat("e2m1", ebits=2, mbits=1, bias=1, max_code=0b111)  # +-{0,.5,1,1.5,2,3,4,6}
E3M0 = Minifloat("e3m0", ebits=3, mbits=0, bias=3, max_code=0b111)  # +-{0,.25,.5,...,16}
INT4 = Minifloat("int4", ebits=0, mbits=3, bias=0, max_code=0b111)  # sign-magnitude +-{0..7}
# E1M2 (bias 0, as Wang et al.'s code takes it: max 3.5): the uniform grid +-{0, 0.5, .., 3.5},
# INT4's grid halved, so under a block scale both quantize alike (UFP4's uniform 4-bit grids).
E1M2 = Minifloat("e1m2", ebits=1, mbits=2, bias=0, max_code=0b111)
E4M3 = Minifloat("e4m3", ebits=4, mbits=3, bias=7, max_code=0x7E, nan_code=0x7F)  # max 448
E5M2 = Minifloat(
    "e5m2", ebits=5, mbits=2, bias=15, max_code=0x7B, nan_code=0x7F, inf_code=0x7C
)  # max 57344

ELEMENT_FORMATS: dict[str, Minifloat] = {f.name: f for f in (E2M1, E3M0, INT4, E1M2, E4M3, E5M2)}
FOUR_BIT_ELEMENTS = frozenset(name for name, f in ELEMENT_FORMATS.items() if f.bits == 4)


@dataclass(frozen=True)
class ScaleFormat:
    """How a block scale is stored.

    kind "pow2": an E8M0 exponent code, 2^(c - bias), c = nan_code is NaN.
    kind "minifloat": an unsigned minifloat (UE5M3, UE4M3) stored as a uint8 code.
    kind "float": stored as a float tensor of `dtype_name` (fp32, bf16).
    """

    name: str
    kind: str
    minifloat: Minifloat | None = None
    exponent_bias: int = 127
    min_exponent: int = -127
    max_exponent: int = 127
    nan_code: int = 255
    dtype_name: str = "float32"

    @property
    def storage_bytes(self) -> int:
        """Bytes one stored scale takes: a uint8 code, or a float32 / bfloat16 value."""
        if self.kind != "float":
            return 1
        return {"float32": 4, "bfloat16": 2}[self.dtype_name]

    @property
    def max_value(self) -> float:
        if self.kind == "pow2":
            return 2.0**self.max_exponent
        if self.kind == "minifloat":
            assert self.minifloat is not None
            return self.minifloat.max_value
        return 3.4028234663852886e38 if self.dtype_name == "float32" else 3.3895313892515355e38

    @property
    def min_value(self) -> float:
        """The smallest positive scale the format stores."""
        if self.kind == "pow2":
            return 2.0**self.min_exponent
        if self.kind == "minifloat":
            assert self.minifloat is not None
            return self.minifloat.min_positive
        return 2.0**-149 if self.dtype_name == "float32" else 2.0**-133

    @property
    def is_code(self) -> bool:
        """True when scales are stored as uint8 codes."""
        return self.kind != "float"


# UE5M3: 5 exponent bits (bias 15), 3 mantissa bits, subnormals, exponent field 31 reserved.
UE5M3 = Minifloat(
    "ue5m3", ebits=5, mbits=3, bias=15, max_code=(30 << 3) | 7, signed=False, nan_code=0xFF
)
# UE4M3: the positive half of FP8 E4M3.
UE4M3 = Minifloat("ue4m3", ebits=4, mbits=3, bias=7, max_code=0x7E, signed=False, nan_code=0x7F)

SCALE_FORMATS: dict[str, ScaleFormat] = {
    "e8m0": ScaleFormat("e8m0", "pow2"),
    "ue5m3": ScaleFormat("ue5m3", "minifloat", minifloat=UE5M3, nan_code=0xFF),
    "ue4m3": ScaleFormat("ue4m3", "minifloat", minifloat=UE4M3, nan_code=0x7F),
    "fp32": ScaleFormat("fp32", "float", dtype_name="float32"),
    "bf16": ScaleFormat("bf16", "float", dtype_name="bfloat16"),
}
