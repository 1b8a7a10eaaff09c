"""kernels/launch.launch: every argument by position, in the kernel's parameter order."""

from __future__ import annotations

import pytest

from fp4cli.kernels.launch import launch


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
    from fp4cli.kernels import launch as launch_module
    from fp4cli.kernels.launch_amax import pair_amax
    from fp4cli.kernels.launch_pair import quantize_pair

    launchers = (
        launch_module.tensor_amax,
        launch_module.quantize_e2m1,
        launch_module.dequantize_e2m1,
        quantize_pair,
        pair_amax,
    )
    for launcher in launchers:
        assert getattr(launcher, "_torchdynamo_disable", False), launcher.__name__
