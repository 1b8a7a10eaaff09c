"""Instructions per element of the quantize kernels, compiled for Hopper (sm_90) on a machine
without a GPU: what `fp4 bench quantize` times, counted instead of timed.

`python -m tests.kernel_instructions [CONFIG ...]` (without TRITON_INTERPRET) compiles, per
config, either the launch `quantize_e2m1` makes for a bf16 tensor of 8192-wide rows along its
last axis (a two-level spec given its tensor amax, as `fp4 bench quantize`'s
quantize-given-amax row; `mxfp4-rht32-sr`: with a 32-point transform and SR, to codes, or with
`-values` to bf16 values as fake-quantization; `-sr8`: 8 random bits a value), for `amax:SIZE`
the tensor amax pass over the same tensor with a SIZE-point transform, for
`dequantize:PRESET` the dequantization of
a 3072 x 8192 bf16 tensor along its last axis, for `decode-vector:PRESET` the vector-wise
executor's decode of one-byte codes to an 8192 x 3072 bf16 tensor, for `vector:PRESET` its
quantization of one to bf16 values (column or tensor scales), or, for a `pair:` config,
the `quantize_pair` launch the fast executor makes for one operand of a layer (a bf16 256 x 768
tensor), with the argument specialization a GPU launch gets (pointers and sizes divisible by
16), and prints per config: PTX instructions, SASS instructions up to the kernel's exit
(division slow paths left out), float<->int conversions, registers per thread, barriers (values
exchanged through shared memory wait at one) and warp shuffles, each per element where it says
so.
Needs triton's bundled cuobjdump (triton.backends.nvidia)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from tests.hopper_compile import compile_launch, intercepted_launches, named_arguments

TSENG = {"rounding": "sr", "sr_prescale": 0.75}
TSENG8 = {**TSENG, "sr_bits": 8}
RHT32 = {"hadamard": 32, "hadamard_seed": 5}
RHT16 = {"hadamard": 16, "hadamard_seed": 5}
NVFP4_SR8 = {"rounding": "sr", "sr_bits": 8}
VALUES = {"values_dtype": torch.bfloat16}
CONFIGS = {  # (preset, its overrides, quantize_e2m1's other arguments)
    "nvfp4": ("nvfp4", {}, {}),
    "mxfp4": ("mxfp4", {}, {}),
    "mxfp4-ue5m3": ("mxfp4-ue5m3", {}, {}),
    "mxfp4-sr": ("mxfp4-sr", {}, {}),
    "mxfp4-sr8": ("mxfp4-sr", {"sr_bits": 8}, {}),
    "nvfp4-sr": ("nvfp4", {"rounding": "sr"}, {}),
    "mxfp4-rht32-sr": ("mxfp4", TSENG, RHT32),
    "mxfp4-rht32-sr-values": ("mxfp4", TSENG, {**RHT32, **VALUES}),
    "mxfp4-rht32": ("mxfp4", {}, RHT32),
    "mxfp4-rht32-sr8": ("mxfp4", TSENG8, RHT32),
    "mxfp4-rht32-sr8-values": ("mxfp4", TSENG8, {**RHT32, **VALUES}),
    "nvfp4-rht16-sr8": ("nvfp4", NVFP4_SR8, RHT16),
    "nvfp4-rht16-sr8-values": ("nvfp4", NVFP4_SR8, {**RHT16, **VALUES}),
}
CONVERSIONS = ("F2I", "I2F", "I2FP", "FRND", "F2F")


def _cuobjdump(cubin: bytes, flag: str) -> str:
    import triton.backends.nvidia as nvidia

    tool = Path(nvidia.__file__).parent / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        return subprocess.run([tool, flag, file.name], capture_output=True, text=True).stdout


def _opcode(line: str) -> str:
    words = line.split()
    return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def pair_directions() -> dict[str, tuple[Any, Any]]:
    """(row, column) directions of each `pair:` config by name: X's (forward values,
    weight-gradient operand packed) or dY's (both as values) of a recipe; or one direction
    alone, as a wide direction's own launch (`pair_tile`)."""
    from fp4cli.kernels.quantization.launch_pair import Direction
    from fp4cli.quant import QuantSpec

    seed, bf16 = torch.tensor(3), torch.bfloat16
    plain, nvfp4 = QuantSpec.preset("mxfp4"), QuantSpec.preset("nvfp4")
    tseng = QuantSpec.preset("mxfp4-sr", sr_prescale=0.75)
    nvfp4_sr = nvfp4.replace(rounding="sr")
    nvfp4_sr8 = nvfp4_sr.replace(sr_bits=8)  # the nvfp4 recipe's dY
    eden = QuantSpec.preset("nvfp4-eden")
    pairs = {
        "mxfp4-x": (Direction(plain, values_dtype=bf16), Direction(plain)),
        "mxfp4-dy": (Direction(plain, values_dtype=bf16), Direction(plain, values_dtype=bf16)),
        "tseng-x": (
            Direction(tseng, (seed, 1), 64, (seed, 2), values_dtype=bf16),
            Direction(tseng, (seed, 3), 64, (seed, 4)),
        ),
        "tseng-x-no-rht": (
            Direction(tseng, (seed, 1), values_dtype=bf16),
            Direction(tseng, (seed, 3)),
        ),
        "nvfp4-x": (Direction(nvfp4, values_dtype=bf16), Direction(nvfp4, None, 16, (seed, 4))),
        "nvfp4-dy": (
            Direction(nvfp4_sr, (seed, 1), values_dtype=bf16),
            Direction(nvfp4_sr, (seed, 3), 16, (seed, 4), values_dtype=bf16),
        ),
        "nvfp4-dy-sr8": (
            Direction(nvfp4_sr8, (seed, 1), values_dtype=bf16),
            Direction(nvfp4_sr8, (seed, 3), 16, (seed, 4), values_dtype=bf16),
        ),
        "quartet2-dy-rows": (Direction(eden, (seed, 1), 128, (seed, 2), values_dtype=bf16), None),
        "quartet2-dy-cols": (None, Direction(eden, (seed, 3), 128, (seed, 4), values_dtype=bf16)),
        "quartet2-dy-rows-packed": (Direction(eden, (seed, 1), 128, (seed, 2)), None),
        "nvfp4-rht128-rows": (Direction(nvfp4, None, 128, (seed, 2), values_dtype=bf16), None),
    }
    return pairs


def _launch(config: str) -> tuple[Any, tuple, dict, float]:
    """(kernel, args, kwargs, elements per thread) of a config's launch."""
    import fp4cli.kernels.quantization.launch as launch
    import fp4cli.kernels.quantization.launch_amax as launch_amax
    import fp4cli.kernels.quantization.launch_pair as launch_pair
    from fp4cli.quant import QuantSpec

    if config.startswith("pair:"):
        pairs, name = pair_directions(), config.removeprefix("pair:")
        if name not in pairs:
            raise ValueError(f"unknown pair {name!r}; known: {', '.join(pairs)}")
        row, col = pairs[name]
        x = torch.zeros(256, 768, dtype=torch.bfloat16)
        found = intercepted_launches(
            lambda: launch_pair.quantize_pair(x, row, col),
            [(launch_pair, "quantize_pair_kernel"), (launch_amax, "amax_pair_kernel"),
             (launch_amax, "amax_rht16_cols_kernel"), (launch_amax, "amax_both_kernel"),
             (launch, "encode_table_kernel"), (launch, "dequantize_kernel")],
        )  # fmt: skip
        return _per_thread(found, "quantize_pair_kernel", "BR", "BC")
    if config.startswith("amax:"):
        return _amax_launch(int(config.removeprefix("amax:")))
    if config.startswith("dequantize:"):
        return _dequantize_launch(QuantSpec.preset(config.removeprefix("dequantize:")))
    if config.startswith("vector:"):
        return _vector_launch(QuantSpec.preset(config.removeprefix("vector:")))
    if config.startswith("decode-vector:"):
        return _decode_vector_launch(QuantSpec.preset(config.removeprefix("decode-vector:")))
    if config not in CONFIGS:
        raise ValueError(
            f"unknown config {config!r}; known: {', '.join(CONFIGS)}, pair:NAME (NAME one of "
            f"{', '.join(pair_directions())}), amax:SIZE, dequantize:PRESET, vector:PRESET, "
            "decode-vector:PRESET"
        )
    preset, overrides, arguments = CONFIGS[config]
    spec = QuantSpec.preset(preset, **overrides)
    x = torch.zeros(8, 8192, dtype=torch.bfloat16)
    amax = torch.ones(1) if spec.tensor_scale else None
    launches = intercepted_launches(
        lambda: launch.quantize_e2m1(x, spec, 1, 0, t_amax=amax, **arguments),
        [(launch, "quantize_kernel"), (launch, "encode_table_kernel")],
    )
    return _per_thread(launches, "quantize_kernel", "ROWS", "COLS")


def _amax_launch(size: int) -> tuple[Any, tuple, dict, float]:
    import fp4cli.kernels.quantization.launch as launch

    x = torch.zeros(8, 8192, dtype=torch.bfloat16)
    found = intercepted_launches(
        lambda: launch.tensor_amax(x, 1, size, 5), [(launch, "amax_kernel")]
    )
    return _per_thread(found, "amax_kernel", "ROWS", "COLS")


def _dequantize_launch(spec: Any) -> tuple[Any, tuple, dict, float]:
    """`dequantize_e2m1`'s launch writing a bf16 3072 x 8192 tensor along its last axis."""
    import fp4cli.kernels.quantization.launch as launch

    lines, length = 3072, 8192
    codes = torch.zeros(lines, length // 2, dtype=torch.uint8)
    scales = torch.zeros(lines, length // int(spec.block), dtype=torch.uint8)
    amax = torch.ones(1) if spec.tensor_scale else None
    found = intercepted_launches(
        lambda: launch.dequantize_e2m1(
            codes, scales, amax, spec, (lines, length), 1, torch.bfloat16
        ),
        [(launch, "dequantize_kernel")],
    )
    return _per_thread(found, "dequantize_kernel", "ROWS", "COLS")


def _vector_launch(spec: Any) -> tuple[Any, tuple, dict, float]:
    """`quantize_vector`'s launch of `scaled_kernel` writing bf16 values of an 8192 x 3072 bf16
    tensor under a column- or tensor-scaled spec, its amax bits given (wang-fp4's dY pass)."""
    import fp4cli.kernels.vector.launch as launch_vector

    if spec.block not in ("column", "tensor"):
        raise ValueError(f"vector:PRESET takes a column- or tensor-scaled spec, not {spec.block!r}")
    x = torch.zeros(8192, 3072, dtype=torch.bfloat16)
    amax = torch.zeros(1, dtype=torch.int32)
    found = intercepted_launches(
        lambda: launch_vector.quantize_vector(x, spec, 1, torch.bfloat16, amax=amax),
        [(launch_vector, "scaled_kernel")],
    )
    return _per_thread(found, "scaled_kernel", "BR", "BC")


def _decode_vector_launch(spec: Any) -> tuple[Any, tuple, dict, float]:
    """`decode_vector`'s launch writing a bf16 8192 x 3072 tensor from one-byte codes and the
    float32 scales of a row-, column- or tensor-scaled spec along the rows."""
    import fp4cli.kernels.vector.launch as launch_vector

    codes = torch.zeros(8192, 3072, dtype=torch.uint8)
    scales = torch.ones(8192)
    found = intercepted_launches(
        lambda: launch_vector.decode_vector(codes, scales, spec, 1, torch.bfloat16),
        [(launch_vector, "decode_kernel")],
    )
    return _per_thread(found, "decode_kernel", "BR", "BC")


def _per_thread(
    found: list[tuple[Any, tuple, dict]], name: str, rows: str, cols: str
) -> tuple[Any, tuple, dict, float]:
    """(kernel, args, kwargs, elements per thread) of the intercepted launch of kernel `name`,
    whose tile is its constexprs `rows` x `cols`."""
    kernel, args, kwargs = next(f for f in found if f[0].fn.__name__ == name)
    named = named_arguments(kernel, args, kwargs)
    return kernel, args, kwargs, named[rows] * named[cols] / (32 * kwargs["num_warps"])


def counts(config: str) -> dict[str, float]:
    """Per-element instruction counts of the launch of `config` (see module doc)."""
    kernel, args, kwargs, per_thread = _launch(config)
    compiled = compile_launch(kernel, args, kwargs, gpu_specialization=True)
    ptx = compiled.asm["ptx"]
    ptx_lines = [
        line.strip()
        for line in ptx[ptx.index("{", ptx.index(".entry")) :].splitlines()
        if line.strip() and not line.strip().startswith(("//", ".", "$", "{", "}"))
    ]
    sass = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(.*?);", _cuobjdump(compiled.asm["cubin"], "-sass"))
    exits = [i for i, line in enumerate(sass) if _opcode(line) == "EXIT"]
    main = [line for line in sass[: max(exits) + 1] if _opcode(line) != "NOP"]
    registers = re.search(r"REG:(\d+)", _cuobjdump(compiled.asm["cubin"], "-res-usage"))
    return {
        "ptx": len(ptx_lines) / per_thread,
        "sass": len(main) / per_thread,
        "conversions": sum(_opcode(line) in CONVERSIONS for line in main) / per_thread,
        "registers": float(registers.group(1)) if registers else float("nan"),
        "barriers": sum(_opcode(line) == "BAR" for line in main) / per_thread,
        "shuffles": sum(_opcode(line) == "SHFL" for line in main) / per_thread,
    }


if __name__ == "__main__":
    print(
        "config                PTX/elem  SASS/elem  conversions/elem  registers"
        "  barriers/elem  shuffles/elem"
    )
    for name in sys.argv[1:] or [*CONFIGS, *(f"pair:{pair}" for pair in pair_directions())]:
        try:
            c = counts(name)
        except ValueError as error:  # a config or preset this script does not take
            sys.exit(f"error: {error}")
        print(
            f"{name:20s}  {c['ptx']:8.1f}  {c['sass']:9.1f}  {c['conversions']:16.2f}"
            f"  {c['registers']:9.0f}  {c['barriers']:13.2f}  {c['shuffles']:13.2f}"
        )
