"""kernels/host/launch.launch: every argument by position, in the kernel's parameter order; the
constexprs a QuantSpec gives the quantize kernels (`spec_constants`), in one order for the pair
kernel's two directions, each documented in kernels/README.md."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from fp4cli.kernels.host.launch import launch
from fp4cli.kernels.host.spec_constants import spec_constants
from fp4cli.kernels.quantization.quantize import quantize_kernel
from fp4cli.kernels.quantization.quantize_pair import DIRECTION_CONSTEXPRS, quantize_pair_kernel
from fp4cli.quant.spec import QuantSpec


def kernel_body(x_ptr, rows, BLOCK, SR, HADAMARD):  # a kernel's parameter list
    raise AssertionError("never run")


class Recorder:
    """A kernel stand-in: its function's parameters, and the launches it was given."""

    def __init__(self) -> None:
        self.fn = kernel_body
        self.launches: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, args, kwargs))


def test_constexprs_go_by_position_in_parameter_order() -> None:
    kernel = Recorder()
    launch(kernel, (3,), ("x", 7), {"HADAMARD": 0, "BLOCK": 32, "SR": True}, 4)
    assert kernel.launches == [((3,), ("x", 7, 32, True, 0), {"num_warps": 4})]


@pytest.mark.parametrize("written", [(2,), (-1,), (0, 5)])
def test_written_positions_must_be_arguments(written) -> None:
    kernel = Recorder()
    with pytest.raises(TypeError, match="written positions"):
        launch(kernel, (1,), ("x", 7), {"HADAMARD": 0, "BLOCK": 32, "SR": True}, 4,
               written=written)  # fmt: skip
    assert kernel.launches == []


@pytest.mark.parametrize(
    "constexprs",
    [
        {"BLOCK": 32, "SR": True},  # one missing
        {"BLOCK": 32, "SR": True, "HADAMARD": 0, "EXTRA": 1},  # one the kernel lacks
    ],
)
def test_constexprs_must_be_the_kernels(constexprs) -> None:
    with pytest.raises((TypeError, KeyError)):
        launch(Recorder(), (1,), ("x", 7), constexprs, 4)


def test_fp_fusion_off_reaches_the_compiler_and_is_left_out_otherwise() -> None:
    """`fp_fusion=False` (Q-EMA's update: each product rounded alone) is passed on as Triton's
    `enable_fp_fusion=False`; other launches carry no such option."""
    kernel = Recorder()
    launch(kernel, (2,), ("x", 7), {"HADAMARD": 0, "BLOCK": 32, "SR": False}, 8, fp_fusion=False)
    launch(kernel, (2,), ("x", 7), {"HADAMARD": 0, "BLOCK": 32, "SR": False}, 8)
    assert [call[2] for call in kernel.launches] == [
        {"num_warps": 8, "enable_fp_fusion": False},
        {"num_warps": 8},
    ]


def test_the_launchers_are_hidden_from_torch_compile():
    """Every launcher the executors call runs outside dynamo's tracing (torch.compiler.disable):
    a compiled model meets them through the custom ops, never traced into their Python."""
    from fp4cli.kernels.quantization import launch as launch_module
    from fp4cli.kernels.quantization.launch_amax import pair_amax
    from fp4cli.kernels.quantization.launch_pair import quantize_pair

    launchers = (
        launch_module.tensor_amax,
        launch_module.quantize_e2m1,
        launch_module.dequantize_e2m1,
        quantize_pair,
        pair_amax,
    )
    for launcher in launchers:
        assert getattr(launcher, "_torchdynamo_disable", False), launcher.__name__


def test_spec_constants_are_parameters_of_both_quantize_kernels() -> None:
    single = set(inspect.signature(quantize_kernel.fn).parameters)
    for spec in (QuantSpec(), QuantSpec.preset("nvfp4-outer128"), QuantSpec.preset("nvfp4-eden")):
        names = set(spec_constants(spec))
        assert names <= single
        assert names <= set(DIRECTION_CONSTEXPRS)


def test_the_pair_kernel_lists_both_directions_constexprs_in_one_order() -> None:
    params = list(inspect.signature(quantize_pair_kernel.fn).parameters)
    for prefix in ("ROW_", "COL_"):
        start = params.index(prefix + DIRECTION_CONSTEXPRS[0])
        block = params[start : start + len(DIRECTION_CONSTEXPRS)]
        assert block == [prefix + name for name in DIRECTION_CONSTEXPRS]
    assert params[-1] == "COL_" + DIRECTION_CONSTEXPRS[-1]


def test_the_kernels_readme_documents_every_spec_constant() -> None:
    readme = (Path(__file__).parents[2] / "kernels" / "README.md").read_text()
    for name in spec_constants(QuantSpec()):
        assert f"`{name}`" in readme, name
