"""The kernels compile for Hopper (sm_90), in the configurations the quantized Linear launches
(tests/hopper_compile.py): the interpreter runs their Python, not Triton's compiler, which
refuses some programs it runs (a function returning tensors of two shapes, say)."""

import pytest

from tests.hopper_compile import run_compiler_module

pytest.importorskip("triton.backends.nvidia")


def test_the_quantized_linear_kernels_compile_for_hopper():
    done = run_compiler_module("tests.hopper_compile")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "23"


def test_the_gemm_kernels_compile_for_hopper_as_a_gpu_launch_specializes_them():
    """With the specialization a GPU launch gets: sizes of 1 become constants (a 1 x 1 product
    once failed to compile there, and nowhere else)."""
    done = run_compiler_module("tests.hopper_compile", "gemm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "10"


def test_rounding_to_nearest_converts_nothing_between_float_and_int():
    """The RNE quantize kernels round on float32 bits (tests/kernel_instructions.py): their sm_90
    code holds no float<->int conversion, a quarter-rate instruction on Hopper."""
    done = run_compiler_module("tests.kernel_instructions", "nvfp4", "mxfp4")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["nvfp4", "mxfp4"]
    for name, ptx, sass, conversions, *_rest in rows:
        assert float(ptx) > 10 and float(sass) > 10, name
        assert float(conversions) == 0.0, name


def test_pair_launches_are_counted():
    """`python -m tests.kernel_instructions pair:...` counts the fast executor's pair launches
    (docs/fast-linear.md quotes them): stochastic rounding adds instructions to every value."""
    done = run_compiler_module("tests.kernel_instructions", "pair:mxfp4-x", "pair:tseng-x-no-rht")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    assert list(rows) == ["pair:mxfp4-x", "pair:tseng-x-no-rht"]
    plain, rounded = float(rows["pair:mxfp4-x"][1]), float(rows["pair:tseng-x-no-rht"][1])
    assert 10 < plain < rounded


def test_packed_codes_take_the_hadamard_butterflies_as_shuffles():
    """Writing packed codes with RHT-32 and SR along the last axis, the quantize kernel keeps
    the tile in its loaded layout (`tile_ops.butterfly_by_sums`): it waits at no more barriers
    than the kernel writing values, and issues about as many instructions (with the split
    butterflies it took 35 barriers a thread against 15, and 84.6 instructions a value against
    63.3; docs/benchmarks.md)."""
    configs = ("mxfp4-rht32-sr", "mxfp4-rht32-sr-values")
    done = run_compiler_module("tests.kernel_instructions", *configs)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in done.stdout.splitlines()[1:]}
    codes, values = (rows[config] for config in configs)
    sass, barriers, shuffles = 1, 4, 5
    assert float(codes[barriers]) < 0.5 * float(values[barriers])
    assert float(codes[shuffles]) >= 2.0  # the butterflies' stages across lanes
    assert float(codes[sass]) < 1.1 * float(values[sass])
