"""The quantizer configurations a benchmark can name: a QuantSpec and an optional Hadamard size."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fp4cli.quant.spec import QuantSpec


class BenchError(ValueError):
    """An impossible benchmark request (unknown config, malformed shape, bad option)."""


# Upper bounds of the counts a benchmark times: a larger one only makes it run for hours.
ITERS_MAX = 10_000  # calls per timed loop
STEPS_MAX = 1_000  # training steps per timed loop
REP_MS_MAX = 60_000  # milliseconds of timed calls per GEMM


def check_count(name: str, value: int, limit: int) -> None:
    """Refuse, in one line, a count below 1 or above `limit`."""
    if not 1 <= value <= limit:
        raise BenchError(f"{name}: must be from 1 to {limit:,} (got {value})")


def check_layer_graphs(layer_graphs: Iterable[str], device_type: str, graphed: str) -> None:
    """Refuse layer graphs (`fp4cli.replay.graphs` modes other than "off") off CUDA, or beside
    `graphed`, the requested modes or timing whose calls are one CUDA graph already (named,
    with why; "" where none is)."""
    graphing = ", ".join(mode for mode in layer_graphs if mode != "off")
    if not graphing:
        return
    if device_type != "cuda":
        raise BenchError(f"layer graphs {graphing}: CUDA graphs need a CUDA device")
    if graphed:
        raise BenchError(f"layer graphs {graphing}: not with {graphed}")


def error_line(error: BaseException, limit: int | None = None) -> str:
    """`Type: first line of the message` (at most `limit` characters of it), or `Type` alone:
    how a benchmark row names the error that stopped it."""
    lines = str(error).strip().splitlines()
    return type(error).__name__ + (f": {lines[0][:limit]}" if lines else "")


@dataclass(frozen=True)
class BenchConfig:
    """A named quantizer configuration: `spec`, after a random Hadamard transform of size
    `hadamard` along the axis when set."""

    name: str
    spec: QuantSpec
    hadamard: int | None = None

    def describe(self) -> str:
        return self.spec.short() + (f"/rht{self.hadamard}" if self.hadamard else "")


def _config(
    name: str, preset: str, hadamard: int | None = None, **overrides: object
) -> BenchConfig:
    return BenchConfig(name, QuantSpec.preset(preset, **overrides), hadamard)


CONFIGS: dict[str, BenchConfig] = {
    config.name: config
    for config in (
        _config("mxfp4", "mxfp4"),
        _config("mxfp4-rht32-sr", "mxfp4", hadamard=32, rounding="sr", sr_prescale=0.75),
        # the same with 8 random bits a value (Blackwell's cvt.rs, sr_bits 8)
        _config(
            "mxfp4-rht32-sr8", "mxfp4", hadamard=32, rounding="sr", sr_prescale=0.75, sr_bits=8
        ),
        _config("nvfp4", "nvfp4"),
        _config("nvfp4-rht16-sr", "nvfp4", hadamard=16, rounding="sr"),
        _config("nvfp4-rht16-sr8", "nvfp4", hadamard=16, rounding="sr", sr_bits=8),
        _config("nvfp4-4over6", "nvfp4-4over6"),  # each block scaled to 4 or 6, the nearer
        # TetraJet-v2's: an FP32 scale per 128 values (found in the quantize pass)
        _config("nvfp4-outer128", "nvfp4-outer128"),
        _config("nvfp4-outer128-rht16-sr", "nvfp4-outer128", hadamard=16, rounding="sr"),
        # Quartet II's backward operands: MS-EDEN after a 128-point transform
        _config("nvfp4-eden-rht128", "nvfp4-eden", hadamard=128),
        _config("mxfp4-ceil", "mxfp4-ceil"),
        _config("mxfp4-ue5m3", "mxfp4-ue5m3"),
        _config(  # ue5m3-hadamard-sr's backward operands
            "mxfp4-ue5m3-rht32-sr", "mxfp4-ue5m3", hadamard=32, rounding="sr", scale_rule="ceil"
        ),
    )
}


def bench_configs(names: Iterable[str]) -> list[BenchConfig]:
    """The registered configs of these names, in order."""
    configs = []
    for name in names:
        if name not in CONFIGS:
            raise BenchError(f"unknown config {name!r}; known: {', '.join(CONFIGS)}")
        configs.append(CONFIGS[name])
    if not configs:
        raise BenchError("configs: name at least one")
    return configs
