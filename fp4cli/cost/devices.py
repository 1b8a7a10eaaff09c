"""Device profiles: the rates the cost model divides work by, and where each figure comes from.

A profile holds the dense tensor-core GEMM rates in FLOP/s for BF16, FP8, FP4 and NVFP4 operands,
the memory bandwidth in bytes/s, and the CUDA-core op rate in ops/s. An "op" is one elementwise
instruction (an add, a compare, one half of a 32x32-bit multiply, a xor), so the op rate is the
datasheet's FP32 FLOP/s halved: the datasheet counts a fused multiply-add as two FLOPs.

Each figure's source says what it is: "measured: ..." (on this project's H100), "datasheet: ..."
(the vendor's dense peak, no sparsity) or "assumed: ...". Datasheet peaks are optimistic in
absolute time (cuBLAS reaches 0.75 of the BF16 peak and 0.65 of the FP8 peak on the H100), so
compare estimates within one profile: the ratio to BF16 is what the model is for.

FP4 GEMMs: Blackwell has FP4 tensor cores at twice its FP8 rate. Hopper has none: an FP4 GEMM
there decodes FP4 to FP8 in registers and feeds the FP8 tensor cores, so the FP8 rate is its
upper bound (assumed; `h100-triton` has the rate Triton's tl.dot_scaled measured instead, and
`h100-fp4cli` the rate of fp4cli's exact MXFP4 GEMM, `fp4 bench gemm`).
Ampere has no FP8 or FP4 tensor cores: both decode to BF16 and run at the BF16 rate.

NVFP4 (E2M1 with E4M3 scales per 16 values and a tensor scale) has its own rate: on Blackwell
the FP4 tensor cores take it natively; on Hopper its E4M3 block scales do not fold into FP8
operands (they are not powers of two), so `fp4cli.gemm.nvfp4_matmul` decodes it to BF16 and the
BF16 rate bounds it (assumed). A measured NVFP4 GEMM (`fp4 bench gemm --impls nvfp4`) replaces
this rate where the run store has one (`fp4cli.cost.measured`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fp4cli.cost.errors import CostError

PRECISIONS = ("bf16", "fp8", "fp4", "nvfp4")


@dataclass(frozen=True)
class DeviceProfile:
    """The rates of one GPU. `devices`: lowercase fragments of the GPU names (as
    torch.cuda.get_device_name gives them) that this profile stands for."""

    name: str
    description: str
    bf16_flops: float
    fp8_flops: float
    fp4_flops: float
    nvfp4_flops: float
    bandwidth: float  # bytes/s
    vector_ops: float  # CUDA-core ops/s
    bf16_source: str
    fp8_source: str
    fp4_source: str
    nvfp4_source: str
    bandwidth_source: str
    vector_source: str
    devices: tuple[str, ...] = ()

    def gemm_flops(self, precision: str) -> float:
        """The GEMM rate in FLOP/s for operands of `precision` (bf16, fp8, fp4 or nvfp4)."""
        return float(getattr(self, f"{precision}_flops"))

    def source(self, rate: str) -> str:
        """Where a rate (bf16, fp8, fp4, bandwidth, vector) comes from."""
        return str(getattr(self, f"{rate}_source"))

    def kind(self, rate: str) -> str:
        """measured, datasheet or assumed."""
        return self.source(rate).split(":", 1)[0]

    def matches(self, device_name: str) -> bool:
        """Whether a GPU of this name is what the profile describes."""
        lowered = device_name.lower()
        return any(fragment in lowered for fragment in self.devices)

    def to_dict(self) -> dict[str, object]:
        rates = ("bf16_flops", "fp8_flops", "fp4_flops", "nvfp4_flops", "bandwidth", "vector_ops")
        sources = {rate: self.source(rate) for rate in (*PRECISIONS, "bandwidth", "vector")}
        return {
            "name": self.name,
            "description": self.description,
            **{rate: getattr(self, rate) for rate in rates},
            "sources": sources,
        }


# Measured on this project's H100 (NVIDIA H100 80GB HBM3, SXM5).
H100_COPY = 3.0e12  # measured: dst.copy_(src) of large bf16 tensors
H100_CUBLAS_BF16 = 746e12  # measured: cuBLAS bf16 GEMM
H100_CUBLAS_FP8 = 1282e12  # measured: cuBLAS fp8 GEMM
H100_DOT_SCALED_E2M1 = 236e12  # measured: Triton tl.dot_scaled e2m1 x e2m1, 8192^3
H100_FP4CLI_EXACT = 877e12  # fp4 bench gemm: mxfp4_matmul(mode="exact"), 8192^3, with the K split

HOPPER_FP4 = "assumed: no FP4 tensor cores; FP4 decoded to FP8, at most the FP8 rate"
HOPPER_NVFP4 = (
    "assumed: no FP4 tensor cores; E4M3 block scales do not fold into FP8, so NVFP4 decodes "
    "to BF16: at most the BF16 rate"
)


def _h100(name: str, description: str, fp4_flops: float, fp4_source: str) -> DeviceProfile:
    """The H100 SXM5 with the figures measured on this project's H100."""
    return DeviceProfile(
        name=name,
        description=description,
        bf16_flops=H100_CUBLAS_BF16,
        fp8_flops=H100_CUBLAS_FP8,
        fp4_flops=fp4_flops,
        nvfp4_flops=H100_CUBLAS_BF16,
        bandwidth=H100_COPY,
        vector_ops=33.5e12,  # datasheet: H100 SXM5 FP32 67 TFLOPS, halved
        bf16_source="measured: cuBLAS on this project's H100 (datasheet dense 989 TFLOP/s)",
        fp8_source="measured: cuBLAS on this project's H100 (datasheet dense 1979 TFLOP/s)",
        fp4_source=fp4_source,
        nvfp4_source=HOPPER_NVFP4,
        bandwidth_source="measured: device copy on this project's H100 (datasheet 3.35 TB/s)",
        vector_source="datasheet: 67 TFLOPS FP32 / 2 (an FMA is one op)",
        devices=("h100",),
    )


PROFILES: dict[str, DeviceProfile] = {
    # assumed: the FP8 rate bounds an FP8-decoding FP4 GEMM
    "h100": _h100("h100", "NVIDIA H100 SXM5 80GB", H100_CUBLAS_FP8, HOPPER_FP4),
    "h100-triton": _h100(
        "h100-triton",
        "NVIDIA H100 SXM5 80GB, FP4 GEMM at Triton tl.dot_scaled's measured rate",
        H100_DOT_SCALED_E2M1,
        "measured: Triton tl.dot_scaled e2m1 at 8192^3 on this project's H100",
    ),
    "h100-fp4cli": _h100(
        "h100-fp4cli",
        "NVIDIA H100 SXM5 80GB, FP4 GEMM at fp4cli's exact MXFP4 GEMM's measured rate",
        H100_FP4CLI_EXACT,
        "measured: fp4cli.mxfp4_matmul exact at 8192^3, preparation included, on this "
        "project's H100 (fp4 bench gemm)",
    ),
    "h200": DeviceProfile(
        name="h200",
        description="NVIDIA H200 SXM 141GB",
        bf16_flops=989e12,  # datasheet: dense BF16
        fp8_flops=1979e12,  # datasheet: dense FP8
        fp4_flops=1979e12,  # assumed: the FP8 rate (no FP4 tensor cores)
        nvfp4_flops=989e12,  # assumed: the BF16 rate (NVFP4 decoded to BF16)
        bandwidth=4.8e12,  # datasheet: HBM3e
        vector_ops=33.5e12,  # datasheet: FP32 67 TFLOPS, halved
        bf16_source="datasheet: H200 SXM dense BF16 989 TFLOP/s",
        fp8_source="datasheet: H200 SXM dense FP8 1979 TFLOP/s",
        fp4_source=HOPPER_FP4,
        nvfp4_source=HOPPER_NVFP4,
        bandwidth_source="datasheet: H200 SXM HBM3e 4.8 TB/s",
        vector_source="datasheet: 67 TFLOPS FP32 / 2 (an FMA is one op)",
        devices=("h200",),
    ),
    "b200": DeviceProfile(
        name="b200",
        description="NVIDIA B200 (HGX, 1000 W)",
        bf16_flops=2250e12,  # datasheet: dense BF16
        fp8_flops=4500e12,  # datasheet: dense FP8
        fp4_flops=9000e12,  # datasheet: dense FP4, twice the FP8 rate
        nvfp4_flops=9000e12,  # datasheet: dense FP4 (NVFP4 native)
        bandwidth=8.0e12,  # datasheet: HBM3e
        vector_ops=40e12,  # datasheet: FP32 80 TFLOPS, halved
        bf16_source="datasheet: HGX B200 dense BF16 2250 TFLOP/s",
        fp8_source="datasheet: HGX B200 dense FP8 4500 TFLOP/s",
        fp4_source="datasheet: HGX B200 dense FP4 9000 TFLOP/s (FP4 tensor cores, 2x FP8)",
        nvfp4_source="datasheet: HGX B200 dense FP4 9000 TFLOP/s (NVFP4 on the FP4 tensor cores)",
        bandwidth_source="datasheet: HGX B200 HBM3e 8 TB/s",
        vector_source="datasheet: 80 TFLOPS FP32 / 2 (an FMA is one op)",
        devices=("b200",),
    ),
    "a100": DeviceProfile(
        name="a100",
        description="NVIDIA A100 SXM4 80GB",
        bf16_flops=312e12,  # datasheet: dense BF16
        fp8_flops=312e12,  # assumed: no FP8 tensor cores, decoded to BF16
        fp4_flops=312e12,  # assumed: no FP4 tensor cores, decoded to BF16
        nvfp4_flops=312e12,  # assumed: decoded to BF16
        bandwidth=2.039e12,  # datasheet: HBM2e
        vector_ops=9.75e12,  # datasheet: FP32 19.5 TFLOPS, halved
        bf16_source="datasheet: A100 SXM dense BF16 312 TFLOP/s",
        fp8_source="assumed: no FP8 tensor cores; FP8 decoded to BF16, the BF16 rate",
        fp4_source="assumed: no FP4 tensor cores; FP4 decoded to BF16, the BF16 rate",
        nvfp4_source="assumed: no FP4 tensor cores; NVFP4 decoded to BF16, the BF16 rate",
        bandwidth_source="datasheet: A100 SXM 80GB HBM2e 2.04 TB/s",
        vector_source="datasheet: 19.5 TFLOPS FP32 / 2 (an FMA is one op)",
        devices=("a100",),
    ),
}
# Which profile a GPU name maps to, first match wins (h100-triton only by its name).
_BY_DEVICE_NAME = ("b200", "h200", "h100", "a100")


def profile_for(name_or_device: str) -> DeviceProfile:
    """A profile by its name ("h100") or by a GPU name ("NVIDIA H100 80GB HBM3").

    Any H100 maps to the SXM5 figures, any H200 (a GH200 too) to the H200's."""
    key = name_or_device.strip().lower()
    if key in PROFILES:
        return PROFILES[key]
    for name in _BY_DEVICE_NAME:
        if PROFILES[name].matches(key):
            return PROFILES[name]
    known = ", ".join(sorted(PROFILES))
    raise CostError(f"unknown device {name_or_device!r}; known profiles: {known}")


def local_profile() -> tuple[DeviceProfile, str]:
    """The profile of this machine's GPU and how it was chosen; without a CUDA device, the h100
    profile (the note says so). Imports torch."""
    import torch

    if not torch.cuda.is_available():
        return PROFILES["h100"], "no CUDA device here: the h100 profile"
    device_name = torch.cuda.get_device_name()
    return profile_for(device_name), f"this machine's {device_name}"
