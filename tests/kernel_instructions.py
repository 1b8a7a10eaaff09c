"""Instructions per element of the quantize kernel, compiled for Hopper (sm_90) on a machine
without a GPU: what `fp4 bench quantize` times, counted instead of timed.

`python -m tests.kernel_instructions [CONFIG ...]` (without TRITON_INTERPRET) compiles the
launch `quantize_e2m1` makes for a bf16 tensor of 8192-wide rows along its last axis (a
two-level spec given its tensor amax, as `fp4 bench quantize`'s quantize-given-amax row), with
the argument specialization a GPU launch gets (pointers and sizes divisible by 16), and prints
per config: PTX instructions, SASS instructions up to the kernel's exit (division slow paths
left out), float<->int conversions and registers per thread, each per element where it says so.
Needs triton's bundled cuobjdump (triton.backends.nvidia)."""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from tests.hopper_compile import compile_launch, intercepted_launches, named_arguments

CONFIGS = {
    "nvfp4": ("nvfp4", {}),
    "mxfp4": ("mxfp4", {}),
    "mxfp4-ue5m3": ("mxfp4-ue5m3", {}),
    "mxfp4-sr": ("mxfp4-sr", {}),
    "nvfp4-sr": ("nvfp4", {"rounding": "sr"}),
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


def counts(config: str) -> dict[str, float]:
    """Per-element instruction counts of the quantize launch of `config` (see module doc)."""
    import fp4cli.kernels.launch as launch
    from fp4cli.quant import QuantSpec

    preset, overrides = CONFIGS[config]
    spec = QuantSpec.preset(preset, **overrides)
    x = torch.zeros(8, 8192, dtype=torch.bfloat16)
    amax = torch.ones(1) if spec.tensor_scale else None
    launches = intercepted_launches(
        lambda: launch.quantize_e2m1(x, spec, 1, 0, t_amax=amax), [(launch, "quantize_kernel")]
    )
    kernel, args, kwargs = launches[0]
    compiled = compile_launch(kernel, args, kwargs, gpu_specialization=True)
    named = named_arguments(kernel, args, kwargs)
    per_thread = named["ROWS"] * named["COLS"] / (32 * kwargs["num_warps"])
    ptx = compiled.asm["ptx"]
    ptx_lines = [
        line.strip()
        for line in ptx[ptx.index("{", ptx.index(".entry")) :].splitlines()
        if line.strip() and not line.strip().startswith(("//", ".", "$", "{", "}"))
    ]
    sass = re.findall(r"/\*[0-9a-f]{4}\*/\s+(.*?);", _cuobjdump(compiled.asm["cubin"], "-sass"))
    exits = [i for i, line in enumerate(sass) if _opcode(line) == "EXIT"]
    main = [line for line in sass[: max(exits) + 1] if _opcode(line) != "NOP"]
    registers = re.search(r"REG:(\d+)", _cuobjdump(compiled.asm["cubin"], "-res-usage"))
    return {
        "ptx": len(ptx_lines) / per_thread,
        "sass": len(main) / per_thread,
        "conversions": sum(_opcode(line) in CONVERSIONS for line in main) / per_thread,
        "registers": float(registers.group(1)) if registers else float("nan"),
    }


if __name__ == "__main__":
    print("config        PTX/elem  SASS/elem  conversions/elem  registers")
    for name in sys.argv[1:] or list(CONFIGS):
        c = counts(name)
        print(
            f"{name:12s}  {c['ptx']:8.1f}  {c['sass']:9.1f}  {c['conversions']:16.2f}"
            f"  {c['registers']:9.0f}"
        )
