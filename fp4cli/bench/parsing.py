"""Benchmark options from the command line: shapes, dtypes and comma-separated choices."""

from __future__ import annotations

import re

import torch

from fp4cli.bench.configs import BenchError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


def split_list(text: str) -> list[str]:
    """'a, b,c' -> ['a', 'b', 'c']."""
    return [item.strip() for item in text.split(",") if item.strip()]


def parse_shape(text: str) -> tuple[int, ...]:
    """'4096x4096' -> (4096, 4096); every dimension a positive integer."""
    dims = text.strip().lower().split("x")
    if not all(dim.strip().isdigit() for dim in dims):
        raise BenchError(f"shape {text!r}: expected positive integers joined by x, e.g. 4096x4096")
    shape = tuple(int(dim) for dim in dims)
    if 0 in shape:
        raise BenchError(f"shape {text!r}: every dimension must be at least 1")
    return shape


def parse_shapes(text: str) -> list[tuple[int, ...]]:
    shapes = [parse_shape(item) for item in split_list(text)]
    if not shapes:
        raise BenchError("shapes: give at least one, e.g. 4096x4096")
    return shapes


def parse_choices(option: str, text: str, choices: tuple[str, ...]) -> list[str]:
    """The comma-separated items of `text`, each one of `choices`."""
    items = split_list(text)
    for item in items:
        if item not in choices:
            raise BenchError(f"{option}: {item!r} is not one of {', '.join(choices)}")
    if not items:
        raise BenchError(f"{option}: give at least one of {', '.join(choices)}")
    return list(dict.fromkeys(items))


def parse_gemms(text: str | None) -> list[str]:
    """--gemm: the GEMM modes each quantized recipe is measured in; [""] (each recipe's own)
    when not given."""
    from fp4cli.linear.config import GEMM_CHOICES

    return [""] if text is None else parse_choices("gemm", text, GEMM_CHOICES)


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise BenchError(f"dtype: must be one of {', '.join(DTYPES)} (got {name!r})")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, known in DTYPES.items() if known == dtype)


def check_device(name: str) -> str:
    if not DEVICE_PATTERN.fullmatch(name):
        raise BenchError(f"device: must be auto, cpu, cuda or cuda:N (got {name!r})")
    return name


def check_kernel_backends(backends: list[str], device: torch.device) -> None:
    """Refuse backend "triton" where the kernels cannot run (no triton; a CPU without the
    interpreter) before any case is built."""
    from fp4cli.quant.backend import interpreter_on, triton_available

    if "triton" not in backends:
        return
    if not triton_available() or (device.type != "cuda" and not interpreter_on()):
        raise BenchError(
            "backends: triton needs triton and a CUDA device (or TRITON_INTERPRET=1 on the "
            "CPU); use --backends torch"
        )
