"""The kernels compile for Hopper (sm_90), in the configurations the quantized Linear launches
(tests/hopper_compile.py): the interpreter runs their Python, not Triton's compiler, which
refuses some programs it runs (a function returning tensors of two shapes, say)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia")


def test_the_quantized_linear_kernels_compile_for_hopper():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.hopper_compile"],
        cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "16"


def test_rounding_to_nearest_converts_nothing_between_float_and_int():
    """The RNE quantize kernels round on float32 bits (tests/kernel_instructions.py): their sm_90
    code holds no float<->int conversion, a quarter-rate instruction on Hopper."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-m", "tests.kernel_instructions", "nvfp4", "mxfp4"],
        cwd=Path(__file__).parents[2], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["nvfp4", "mxfp4"]
    for name, ptx, sass, conversions, _registers in rows:
        assert float(ptx) > 10 and float(sass) > 10, name
        assert float(conversions) == 0.0, name
