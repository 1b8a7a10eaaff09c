"""The kernels compile for Hopper (sm_90), in the configurations the quantized Linear launches
(tests/hopper_compile.py): the interpreter runs their Python, not Triton's compiler, which
refuses some programs it runs (a function returning tensors of two shapes, say)."""

import pytest

from tests.hopper_compile import run_compiler_module

pytest.importorskip("triton.backends.nvidia")


def test_the_quantized_linear_kernels_compile_for_hopper():
    done = run_compiler_module("tests.hopper_compile")
    assert done.returncode == 0, done.stderr[-3000:]
    # 12 of them four-over-six after the SR pre-scale, by absolute errors, and signed zeros;
    # the pairs' amax passes write their encode tables themselves (no table launch)
    assert done.stdout.split()[-1] == "68"


def test_the_gemm_kernels_compile_for_hopper_as_a_gpu_launch_specializes_them():
    """With the specialization a GPU launch gets: sizes of 1 become constants (a 1 x 1 product
    once failed to compile there, and nowhere else)."""
    done = run_compiler_module("tests.hopper_compile", "gemm")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "10"


def counted(*configs: str) -> dict[str, dict[str, float]]:
    """`python -m tests.kernel_instructions CONFIG ...`'s table: per config, in its order, each
    column by its header's name (PTX/elem, SASS/elem, conversions/elem, registers, ...)."""
    done = run_compiler_module("tests.kernel_instructions", *configs)
    assert done.returncode == 0, done.stderr[-3000:]
    header, *lines = done.stdout.splitlines()
    columns = header.split()[1:]
    rows = [line.split() for line in lines]
    return {row[0]: dict(zip(columns, map(float, row[1:]), strict=True)) for row in rows}


def test_rounding_to_nearest_converts_nothing_between_float_and_int():
    """The RNE quantize kernels round on float32 bits (tests/kernel_instructions.py): their sm_90
    code holds no float<->int conversion, a quarter-rate instruction on Hopper."""
    rows = counted("nvfp4", "mxfp4")
    assert list(rows) == ["nvfp4", "mxfp4"]
    for name, row in rows.items():
        assert row["PTX/elem"] > 10 and row["SASS/elem"] > 10, name
        assert row["conversions/elem"] == 0.0, name


def test_rounding_to_nearest_adds_a_magic_number_from_the_exponent():
    """E2M1 RNE rounds 2|v| by adding 1.5 * 2^(23 + k), k from |v|'s exponent bits
    (`tile_ops._e2m1_twice_magic`), one path for every binade: sm_90 counted mxfp4's quantize
    kernel at 21.7 SASS instructions a value (23.2 with a path below 1 and one of mantissa bits
    above, and a select), mxfp4's X and dY pairs at 51.4 and 49.4 (55.4 and 53.2)."""
    rows = counted("mxfp4", "pair:mxfp4-x", "pair:mxfp4-dy")
    assert rows["mxfp4"]["SASS/elem"] < 22.5
    assert rows["pair:mxfp4-x"]["SASS/elem"] < 53.0
    assert rows["pair:mxfp4-dy"]["SASS/elem"] < 51.0


def test_pair_launches_are_counted():
    """`python -m tests.kernel_instructions pair:...` counts the fast executor's pair launches
    (docs/fast-linear.md quotes them): stochastic rounding adds instructions to every value."""
    rows = counted("pair:mxfp4-x", "pair:tseng-x-no-rht")
    assert list(rows) == ["pair:mxfp4-x", "pair:tseng-x-no-rht"]
    plain, rounded = (row["SASS/elem"] for row in rows.values())
    assert 10 < plain < rounded


def test_a_transform_of_up_to_32_points_stays_in_its_thread():
    """Along the last axis, the quantize kernel and the amax pass load a transform of 8 to 32
    points a run per thread (`tile_io.runs_by_thread`): its butterflies, the block maximum and
    the packing of the codes exchange nothing between threads (with a block over four lanes the
    RHT-32 launches took over 4 shuffles a value; the counts: docs/fast-linear.md)."""
    rows = counted(
        "mxfp4-rht32-sr", "mxfp4-rht32-sr-values", "nvfp4-rht16-sr8-values", "amax:16", "amax:32"
    )
    for name, row in rows.items():
        assert row["shuffles/elem"] < 1.0, name
        assert row["barriers/elem"] < 0.25, name
    assert rows["mxfp4-rht32-sr"]["SASS/elem"] < 60
    assert rows["nvfp4-rht16-sr8-values"]["SASS/elem"] < 52


def test_dequantization_builds_the_grid_values_from_bits():
    """The E2M1 values come from the codes' bits (`tile_ops.e2m1_value`: (code + 252) << 22 from
    code 2 up), with no int->float conversion a value: the dequantize kernel took 28.2 SASS
    instructions a value (3 conversions) with the float arithmetic and 16.1-16.5 with the bits
    (NVFP4's scales convert once a block), and ran 0.58x -> 0.92x the copy on an H100
    (docs/benchmarks.md)."""
    rows = counted("dequantize:mxfp4", "dequantize:nvfp4")
    assert list(rows) == ["dequantize:mxfp4", "dequantize:nvfp4"]
    for name, row in rows.items():
        assert row["conversions/elem"] < 0.25, name
        assert row["SASS/elem"] < 22, name


def test_minifloat_codes_decode_from_bits():
    """`tile_ops.unsigned_minifloat_value` builds a code's float32 from its bits (no int->float
    conversion): the vector-wise executor's decode of FP8 codes (wang-fp4's saved X) took 23.2
    SASS instructions a value with 2.06 conversions, now 19.7 with 0.06; UE5M3 block scales
    convert nothing either."""
    rows = counted(
        "decode-vector:fp8-e4m3-tensor", "decode-vector:fp8-e5m2-tensor", "dequantize:mxfp4-ue5m3"
    )
    assert len(rows) == 3
    for name, row in rows.items():
        assert row["conversions/elem"] < 0.25, name
    assert rows["decode-vector:fp8-e4m3-tensor"]["SASS/elem"] < 21.5
