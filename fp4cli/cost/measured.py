"""Quantize kernels measured by `fp4 bench quantize`, used in place of the model's bound.

`fp4 bench quantize` stores, per shape and config, each kernel's GB/s (bytes: the BF16 input
read once plus the codes and scales written) in the run store's benchmarks table: kind
'quantize', name 'gbps', its config holding the shape, dtype, kernel, backend and the spec as
`QuantSpec.short()` plus '/rht<n>' for a fused Hadamard transform. An operand's quantize pass
uses such a measurement when one exists for

    the same GPU (a stored device name the profile stands for: any H100 for h100),
    the Triton quantize kernel (backend 'triton', kernel 'quantize') on a bf16 input,
    the same spec and Hadamard size (the same key),

taking the measured shape nearest in element count (by ratio; the newest of equals), whatever
its axis. Its time is then the pass's bytes / the measured GB/s; the call it measured includes
the tensor amax pass, the transform and the rounding, which then cost nothing more.

`fp4 bench gemm` stores each implementation's TFLOP/s (kind 'gemm', name 'tflops', its config
holding M, N, K, the impl and the operands' format). A GEMM of two NVFP4 operands uses the NVFP4
GEMM's measurement (impls `GEMM_IMPLS['nvfp4']`, format 'nvfp4') of the same GPU nearest in FLOP
count (by ratio; the fastest implementation of equals) in place of the profile's NVFP4 rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fp4cli.cost.devices import DeviceProfile, profile_for

if TYPE_CHECKING:
    from fp4cli.quant.spec import QuantSpec
    from fp4cli.store import RunStore

BENCH_KIND = "quantize"
GEMM_KIND = "gemm"
GEMM_IMPLS = {"nvfp4": ("nvfp4", "nvfp4-decoded")}  # format -> fp4 bench gemm implementations


def spec_key(spec: QuantSpec, hadamard: int | None) -> str:
    """How `fp4 bench quantize` names a config in its stored rows."""
    return spec.short() + (f"/rht{hadamard}" if hadamard else "")


@dataclass(frozen=True)
class MeasuredRate:
    """One stored measurement of the quantize kernel."""

    key: str
    elements: int
    gbps: float
    date: str  # YYYY-MM-DD
    device: str

    @property
    def source(self) -> str:
        return f"measured: fp4 bench quantize {self.date}"


@dataclass(frozen=True)
class MeasuredGemm:
    """One stored measurement of an FP4 GEMM implementation."""

    format: str
    impl: str
    flop: int
    tflops: float
    date: str  # YYYY-MM-DD

    @property
    def source(self) -> str:
        return f"measured: fp4 bench gemm {self.impl} {self.date}"


@dataclass(frozen=True)
class MeasuredRates:
    """The measurements of one GPU, oldest first: quantize kernels (`len` counts these) and
    FP4 GEMMs."""

    rates: tuple[MeasuredRate, ...] = ()
    gemms: tuple[MeasuredGemm, ...] = ()

    def gemm(self, fmt: str, flop: int) -> MeasuredGemm | None:
        """The GEMM measurement of `fmt` nearest in FLOP count to `flop` (the fastest of
        equals), or None."""
        best, best_key = None, (math.inf, 0.0)
        for gemm in self.gemms:
            key = (abs(math.log(gemm.flop / flop)), -gemm.tflops)
            if gemm.format == fmt and key < best_key:
                best, best_key = gemm, key
        return best

    def lookup(self, key: str, elements: int) -> MeasuredRate | None:
        """The measurement of `key` nearest in size to `elements`, or None."""
        best, best_distance = None, math.inf
        for rate in self.rates:
            distance = abs(math.log(rate.elements / elements))
            if rate.key == key and distance <= best_distance:
                best, best_distance = rate, distance
        return best

    def __len__(self) -> int:
        return len(self.rates)


def measured_rates(store: RunStore, device: DeviceProfile | str) -> MeasuredRates:
    """The quantize-kernel measurements in `store` of the GPU `device` (a profile, a profile name
    or a GPU name)."""
    profile = device if isinstance(device, DeviceProfile) else profile_for(device)
    rates = [
        _rate(row)
        for row in store.benchmarks(BENCH_KIND)
        if profile.matches(str(row.get("device") or "")) and _usable(row)
    ]
    gemms = [
        _gemm(row)
        for row in store.benchmarks(GEMM_KIND)
        if profile.matches(str(row.get("device") or "")) and _usable_gemm(row)
    ]
    return MeasuredRates(tuple(rates), tuple(gemms))


def _usable_gemm(row: dict[str, Any]) -> bool:
    config = row["config"]
    impls = GEMM_IMPLS.get(str(config.get("format")), ())
    sizes = [config.get(dim) for dim in ("m", "n", "k")]
    return (
        row["name"] == "tflops"
        and config.get("impl") in impls
        and all(isinstance(size, int) and size > 0 for size in sizes)
        and math.isfinite(row["value"])
        and row["value"] > 0
    )


def _gemm(row: dict[str, Any]) -> MeasuredGemm:
    config = row["config"]
    flop = 2 * config["m"] * config["n"] * config["k"]
    return MeasuredGemm(
        config["format"], config["impl"], flop, row["value"], row["created_at"][:10]
    )


def _usable(row: dict[str, Any]) -> bool:
    config = row["config"]
    value = row["value"]
    return (
        row["name"] == "gbps"
        and config.get("kernel") == "quantize"
        and config.get("backend") == "triton"
        and config.get("dtype") == "bf16"
        and isinstance(config.get("spec"), str)
        and isinstance(config.get("shape"), list)
        and math.isfinite(value)
        and value > 0
    )


def _rate(row: dict[str, Any]) -> MeasuredRate:
    config = row["config"]
    elements = math.prod(int(n) for n in config["shape"])
    return MeasuredRate(
        config["spec"], elements, row["value"], row["created_at"][:10], row["device"]
    )


def stored_rates(path: str | None, profile: DeviceProfile) -> tuple[MeasuredRates, str]:
    """The measurements of `profile`'s GPU in the run store at `path` (None: $FP4_STORE, else
    runs/fp4.db), and a note saying what was found. A missing default store gives none; a missing
    store named by `path` is a StoreError."""
    from fp4cli.store import RunStore, store_path

    location = store_path(path)
    if path is None and not location.exists():
        return MeasuredRates(), f"no run store at {location}"
    with RunStore(location, read_only=True) as store:
        rates = measured_rates(store, profile)
    gemms = f" and {len(rates.gemms)} NVFP4 GEMM" if rates.gemms else ""
    return rates, f"{len(rates)} quantize{gemms} measurements of this GPU in {location}"
