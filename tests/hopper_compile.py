"""Compiling the kernels for Hopper (sm_90) on a machine without a GPU: the interpreter runs a
kernel's Python, not Triton's compiler, which refuses some programs the interpreter accepts.

`compile_launches(call, kernels)` runs `call` with every launch of the given kernels
intercepted, and compiles each intercepted launch (its argument types, constexprs and warps) to
a cubin. `python -m tests.hopper_compile` (without TRITON_INTERPRET, which turns the kernels
into Python functions) compiles the launches the quantized Linear makes and prints how many;
`python -m tests.hopper_compile gemm` those of the MXFP4 GEMM, as a GPU launch specializes
them."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def run_compiler_module(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m module args` from the project root with TRITON_INTERPRET unset, so that the
    kernels go through Triton's compiler, not the interpreter (stdout and stderr captured)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=Path(__file__).parents[1], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


TRITON_TYPES = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.int16: "i16",
    torch.int32: "i32",
    torch.int64: "i64",
}
OPTIONS = ("num_warps", "num_stages")


def named_arguments(kernel: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """An intercepted launch's arguments by the kernel's parameter names (launch options left
    out): positional ones, then keywords."""
    names = [param.name for param in kernel.params]
    return dict(zip(names, args, strict=False)) | {
        k: v for k, v in kwargs.items() if k not in OPTIONS
    }


def _signature(kernel: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    names = [param.name for param in kernel.params]
    constexpr_names = {param.name for param in kernel.params if param.is_constexpr}
    values = named_arguments(kernel, args, kwargs)
    signature, constexprs = {}, {}
    for name in names:
        value = values[name]
        if name in constexpr_names or value is None:
            signature[name], constexprs[name] = "constexpr", value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i64" if abs(value) >= 2**31 or name.endswith("value") else "i32"
        else:
            signature[name] = "fp32"
    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    return signature, constexprs, options


def _gpu_signature(kernel: Any, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attrs, options) with the specialization a GPU launch gets:
    Triton's own (integers and pointers divisible by 16 marked so, ones made constants)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    options = {k: v for k, v in kwargs.items() if k in OPTIONS}
    values = named_arguments(kernel, args, kwargs)
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = values[param.name]
        if param.is_constexpr:
            signature[param.name], constexprs[param.name] = "constexpr", value
            continue
        specialize = (
            i not in kernel.do_not_specialize and param.name not in kernel.do_not_specialize
        )
        kind, key = native_specialize_impl(BaseBackend, value, False, specialize, True)
        signature[param.name] = kind
        if kind == "constexpr":
            constexprs[param.name] = key
        elif isinstance(key, str):
            attrs[(i,)] = BaseBackend.parse_attr(key)
    return signature, constexprs, attrs, options


def compile_launch(kernel: Any, args: tuple, kwargs: dict, gpu_specialization: bool = False) -> Any:
    """One launch's arguments compiled for sm_90: the plain argument types, or with
    `gpu_specialization` the divisibility a GPU launch would see (what it really runs)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if gpu_specialization:
        signature, constexprs, attrs, options = _gpu_signature(kernel, args, kwargs)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    else:
        signature, constexprs, options = _signature(kernel, args, kwargs)
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)


def intercepted_launches(
    call: Callable[[], Any], kernels: list[tuple[Any, str]]
) -> list[tuple[Any, tuple, dict]]:
    """(kernel, args, kwargs) of every launch of the given (module, kernel name)s that `call`
    makes; nothing is launched."""
    launches: list[tuple[Any, tuple, dict]] = []
    originals = [(module, name, getattr(module, name)) for module, name in kernels]

    class Intercept:
        def __init__(self, kernel: Any) -> None:
            self.kernel = kernel
            self.fn = kernel.fn  # its parameters, for `launch`

        def __getitem__(self, grid: Any) -> Callable[..., None]:
            return lambda *args, **kwargs: launches.append((self.kernel, args, kwargs))

    try:
        for module, name, kernel in originals:
            setattr(module, name, Intercept(kernel))
        call()
    finally:
        for module, name, kernel in originals:
            setattr(module, name, kernel)
    return launches


def compile_launches(
    call: Callable[[], Any], kernels: list[tuple[Any, str]], gpu_specialization: bool = False
) -> int:
    """Run `call` with the launches of each (module, kernel name) intercepted; compile every
    intercepted launch for sm_90. Returns how many were compiled."""
    launches = intercepted_launches(call, kernels)
    for kernel, args, kwargs in launches:
        compile_launch(kernel, args, kwargs, gpu_specialization)
    return len(launches)


def gemm_launches() -> None:
    """The MXFP4 GEMM's launches, exact (with a K split) and fast on the FP8 kernel, at a shape
    whose sizes of 1 a GPU launch makes constants and at an ordinary one (never run)."""
    from fp4cli.gemm.operands import kernel_operand
    from fp4cli.kernels.gemm import launch
    from tests.gemm_cases import quantized

    for m, n, k in ((1, 1, 32), (64, 48, 256)):
        a, b = (
            kernel_operand(quantized((m, k), 1, "cpu")),
            kernel_operand(quantized((n, k), 2, "cpu")),
        )
        launch.exact_matmul(a, b, torch.empty(m, n))
    launch.fp8_matmul(a, b, torch.empty(m, n), exact=False)


def quantized_linear_launches() -> None:
    """The launches of the recipes' fast executor, on small CPU tensors (never run)."""
    from fp4cli.kernels.elementwise.call_seed import launch_call_start
    from fp4cli.kernels.elementwise.gradients import widen_gradients
    from fp4cli.kernels.host.tiling import ColumnSums
    from fp4cli.kernels.quantization.launch import dequantize_e2m1, quantize_e2m1
    from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair
    from fp4cli.quant import QuantSpec
    from fp4cli.techniques.hadamard import TE_SIGNS_16, FixedSigns
    from fp4cli.techniques.qema import AverageGuide

    ceil = QuantSpec.preset("mxfp4-ceil")
    ceil_sr, prescale_sr = (
        ceil.replace(rounding="sr"),
        QuantSpec.preset("mxfp4-sr", sr_prescale=0.75),
    )
    seed, bf16 = torch.tensor(3), torch.bfloat16
    x = torch.randn(64, 96).to(bf16)
    # tetrajet's X (forward values, double-quantized packed column operand) and dY
    quantize_pair(x, Direction(ceil, None, values_dtype=bf16), Direction(ceil_sr, (seed, 5)), bf16)
    quantize_pair(x, Direction(ceil_sr, (seed, 2), values_dtype=bf16),
                  Direction(ceil_sr, (seed, 4), values_dtype=bf16))  # fmt: skip
    # and with its bias gradient summed from the quantized dY (the row values, then packed)
    quantize_pair(x, Direction(ceil_sr, (seed, 2), values_dtype=bf16),
                  Direction(ceil_sr, (seed, 4), values_dtype=bf16), column_sums=torch.zeros(96),
                  sum_row_values=bf16)  # fmt: skip
    quantize_pair(x, Direction(ceil_sr, (seed, 2)), Direction(ceil_sr, (seed, 4)),
                  column_sums=torch.zeros(96), sum_row_values=bf16)  # fmt: skip
    # tseng-rht-sr's dY (RHT-64 in both directions) and tetrajet-qema's guided W
    quantize_pair(x, Direction(prescale_sr, (seed, 2), 64, (seed, 7), bf16),
                  Direction(prescale_sr, (seed, 4), 64, (seed, 8), bf16))  # fmt: skip
    quantize_pair(x, Direction(ceil, None, values_dtype=bf16), Direction(ceil_sr, (seed, 3)),
                  bf16, guide=x.float())  # fmt: skip
    # its float32 W under bf16 autocast, rounded as read, the guide formed from the average
    average = AverageGuide(x.float(), torch.tensor(12), 10)
    quantize_pair(x.float(), Direction(ceil, None, values_dtype=bf16),
                  Direction(ceil_sr, (seed, 3)), bf16, guide=average,
                  read_as=bf16)  # fmt: skip
    # the single-direction kernels: along the columns with RHT, guided, and decoding
    quantize_e2m1(x, ceil_sr, 0, seed, hadamard=32, hadamard_seed=seed)
    quantize_e2m1(x, ceil, 1, None, values_dtype=bf16, guide=x.float())
    codes, scales = torch.zeros(96, 32, dtype=torch.uint8), torch.zeros(96, 2, dtype=torch.uint8)
    dequantize_e2m1(codes, scales, None, ceil, (64, 96), 0, bf16)
    # nvfp4's X (packed column operand after RHT-16), 16x16-tiled W and SR dY, each with its
    # amax pass; and decoding X's packed operand with its tensor amax
    nvfp4, square = QuantSpec.preset("nvfp4"), QuantSpec.preset("nvfp4-2d")
    nvfp4_sr = nvfp4.replace(rounding="sr")
    quantize_pair(x, Direction(nvfp4, None, values_dtype=bf16),
                  Direction(nvfp4, None, 16, (seed, 9)))  # fmt: skip
    quantize_pair(x, Direction(square, None, values_dtype=bf16),
                  Direction(square, None, values_dtype=bf16))  # fmt: skip
    quantize_pair(x, Direction(nvfp4_sr, (seed, 2), values_dtype=bf16),
                  Direction(nvfp4_sr, (seed, 4), 16, (seed, 9), bf16))  # fmt: skip
    scales16 = torch.zeros(96, 4, dtype=torch.uint8)
    dequantize_e2m1(codes, scales16, torch.zeros(1), nvfp4, (64, 96), 0, bf16)
    # tseng-baseline's dY (ties away from zero both ways); a two-level spec rounded ties away
    away = QuantSpec.preset("mxfp4", rounding="away")
    quantize_pair(x, Direction(away, None, values_dtype=bf16),
                  Direction(away, None, values_dtype=bf16))  # fmt: skip
    quantize_e2m1(x, nvfp4.replace(rounding="away"), 0, None, t_amax=torch.ones(1))
    # ue5m3-hadamard-sr's dY (RHT-32 both ways, two-level: the 32-slab amax pass)
    ue5m3_sr = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")
    quantize_pair(x, Direction(ue5m3_sr, (seed, 2), 32, (seed, 7), bf16),
                  Direction(ue5m3_sr, (seed, 4), 32, (seed, 8), bf16))  # fmt: skip
    # fixed Hadamard signs: nvidia-nvfp4's X (TransformerEngine's; the 16-slab amax pass),
    # mxfp4-dht's dY (none), a mask with its top bit both ways (the 32-slab amax pass), and
    # the single-direction kernel with its amax pass
    te, top = FixedSigns.of(TE_SIGNS_16), FixedSigns(0xDEADBEEF)
    quantize_pair(x, Direction(nvfp4, None, values_dtype=bf16), Direction(nvfp4, None, 16, te))
    quantize_pair(x, Direction(ceil, None, 32, FixedSigns(), bf16),
                  Direction(ceil, None, 32, FixedSigns(), bf16))  # fmt: skip
    quantize_pair(x, Direction(ue5m3_sr, (seed, 2), 32, top, bf16),
                  Direction(ue5m3_sr, (seed, 4), 32, top, bf16))  # fmt: skip
    quantize_e2m1(x, nvfp4_sr, 1, seed, hadamard=16, hadamard_seed=te)
    # ufp4's E1M2 elements: a two-level pair with RHT-16 (values one way, codes the other; the
    # 16-slab amax pass of both ways),
    # an SR pair, a single direction guided, and decoding
    ufp4, e1m2_sr = QuantSpec.preset("nvfp4", element="e1m2"), ceil_sr.replace(element="e1m2")
    quantize_pair(x, Direction(ufp4, None, 16, (seed, 7), bf16),
                  Direction(ufp4.replace(rounding="sr"), (seed, 4), 16, (seed, 8)))  # fmt: skip
    quantize_pair(
        x, Direction(e1m2_sr, (seed, 2), values_dtype=bf16), Direction(e1m2_sr, (seed, 4))
    )
    quantize_e2m1(x, ceil.replace(element="e1m2"), 1, None, values_dtype=bf16, guide=x.float())
    dequantize_e2m1(codes, scales16, torch.zeros(1), ufp4, (64, 96), 0, bf16)
    # nvfp4-4over6's X (values one way, codes after RHT-16 the other), its 16x16-tiled W (both
    # ways), an SR pair, and the single-direction kernel (E8M0, ceil)
    four, square_four = (QuantSpec.preset(p, four_over_six=True) for p in ("nvfp4", "nvfp4-2d"))
    quantize_pair(x, Direction(four, None, values_dtype=bf16),
                  Direction(four, None, 16, te))  # fmt: skip
    quantize_pair(x, Direction(square_four, None, values_dtype=bf16),
                  Direction(square_four, None, values_dtype=bf16))  # fmt: skip
    four_sr = four.replace(rounding="sr")
    quantize_pair(x, Direction(four_sr, (seed, 2), values_dtype=bf16),
                  Direction(four_sr, (seed, 4), 16, (seed, 9), bf16))  # fmt: skip
    quantize_e2m1(x, ceil.replace(four_over_six=True), 1, None)
    # nvfp4-4over6-all's gradients (SR after the 16/17 pre-scale, decoded over it) and the
    # absolute-error metric, in the pair (along the rows and down the columns) and alone; codes
    # with signed zeros
    four_all = four_sr.replace(sr_prescale=16 / 17)
    four_mae = four.replace(four_over_six_metric="mae")
    quantize_pair(x, Direction(four_all, (seed, 2), values_dtype=bf16),
                  Direction(four_all, (seed, 4), 16, te))  # fmt: skip
    quantize_pair(x, Direction(four_mae, None, values_dtype=bf16), Direction(four_mae, None))
    quantize_e2m1(x, four_all.replace(four_over_six_metric="mae"), 1, seed)
    quantize_e2m1(x, nvfp4_sr, 1, seed, signed_zero=True)
    # tetrajet-v2's outer blocks of 128: each direction alone (values along the rows, codes
    # with their outer amaxes down the columns after RHT-16), the single-direction kernel, and
    # decoding from the outer amaxes
    outer = QuantSpec.preset("nvfp4-outer128")
    outer_sr = outer.replace(rounding="sr")
    quantize_pair(x, Direction(outer, None, values_dtype=bf16), None)
    quantize_pair(x, None, Direction(outer_sr, (seed, 5), 16, (seed, 6)))
    quantize_e2m1(x, outer_sr, 0, seed)
    dequantize_e2m1(codes, scales16, torch.zeros(96, 1), outer, (64, 96), 0, bf16)
    # quartet2's MS-EDEN: dY after RHT-128, each way alone (values, codes), the single direction
    eden = QuantSpec.preset("nvfp4-eden")
    quantize_pair(x, Direction(eden, (seed, 2), 128, (seed, 3), bf16), None)
    quantize_pair(x, None, Direction(eden, (seed, 4), 128, (seed, 5)))
    quantize_e2m1(x, eden, 1, seed)
    # the gradients in float32 parameters' dtypes: both widened with the bias sums added up
    # from their tiles' partials and rounded, or one; a bfloat16 bias's sums, not rounded
    widen_gradients([x, x], ColumnSums(96, torch.zeros(96, 3)))
    widen_gradients([None, x])
    widen_gradients([None, None], ColumnSums(96, torch.zeros(96)), round_sums=False)
    # the call's start: its seed alone, or with the bias rounded to bfloat16
    one = torch.zeros((), dtype=torch.int64)
    launch_call_start(one, one.clone(), 16, True)
    launch_call_start(one, one.clone(), 16, True, torch.zeros(3072))


if __name__ == "__main__" and sys.argv[1:] == ["gemm"]:
    import fp4cli.kernels.gemm.launch as gemm_launch
    import fp4cli.kernels.gemm.split as gemm_split

    names = ("operand_prep_kernel", "mxfp4_int8_gemm_kernel", "mxfp4_fp8_gemm_kernel")
    kernels = [(gemm_launch, name) for name in names]
    kernels += [(gemm_split, "k_split_kernel")]
    print(compile_launches(gemm_launches, kernels, True))
elif __name__ == "__main__":
    import fp4cli.kernels.elementwise.call_seed as call_seed
    import fp4cli.kernels.elementwise.gradients as gradients
    import fp4cli.kernels.quantization.launch as launch
    import fp4cli.kernels.quantization.launch_amax as launch_amax
    import fp4cli.kernels.quantization.launch_pair as launch_pair

    kernels = [
        (launch_pair, "quantize_pair_kernel"),
        (launch_amax, "amax_pair_kernel"),
        (launch_amax, "amax_rht16_cols_kernel"),
        (launch_amax, "amax_both_kernel"),
        (launch, "quantize_kernel"),
        (launch, "amax_kernel"),
        (launch, "dequantize_kernel"),
        (launch, "encode_table_kernel"),
        (gradients, "gradients_kernel"),
        (call_seed, "call_seed_kernel"),
    ]
    print(compile_launches(quantized_linear_launches, kernels))
