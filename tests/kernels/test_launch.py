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
