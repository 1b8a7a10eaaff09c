"""Element and scale formats: exact encode, decode, rounding and nibble packing."""

from fp4cli.formats.minifloat import (
    Minifloat,
    decode,
    encode,
    float32,
    grid_interval,
    magnitude_grid,
    round_to_grid,
)
from fp4cli.formats.packing import pack_nibbles, unpack_nibbles
from fp4cli.formats.registry import (
    E1M2,
    E2M1,
    E3M0,
    E4M3,
    E5M2,
    ELEMENT_FORMATS,
    FOUR_BIT_ELEMENTS,
    INT4,
    SCALE_FORMATS,
    UE4M3,
    UE5M3,
    ScaleFormat,
)

__all__ = [
    "E1M2",
    "E2M1",
    "E3M0",
    "E4M3",
    "E5M2",
    "ELEMENT_FORMATS",
    "FOUR_BIT_ELEMENTS",
    "INT4",
    "SCALE_FORMATS",
    "UE4M3",
    "UE5M3",
    "Minifloat",
    "ScaleFormat",
    "decode",
    "encode",
    "float32",
    "grid_interval",
    "magnitude_grid",
    "pack_nibbles",
    "round_to_grid",
    "unpack_nibbles",
]
