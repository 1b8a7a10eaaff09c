"""The two-level encode tables (`fp4cli.kernels.tiles.two_level`) against `fp4cli.quant.two_level`'s
formulas, bit for bit: every scale code's encode multiplier and the block factor G * fl(1 / E),
for tensor amaxes from 0 through subnormal tensor decode scales to FLT_MAX.

Runs on the CPU under TRITON_INTERPRET=1, or on a CUDA GPU without it.
"""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec
from tests.kernel_cases import FP32_MAX, on_device
from tests.kernel_checks import assert_encode_table

from fp4cli.kernels.quantization.launch import encode_tables, same_tables  # isort: skip
from fp4cli.kernels.quantization.launch_pair import (  # isort: skip
    Direction,
    amax_workspace,
    pair_tables,
)
from fp4cli.kernels.tiles.two_level import ENCODE_TABLE  # isort: skip

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")

TABLE_SPECS = {
    "nvfp4": QuantSpec.preset("nvfp4"),
    "nvfp4-ceil": QuantSpec.preset("nvfp4", scale_rule="ceil"),
    "mxfp4-ue5m3": QuantSpec.preset("mxfp4-ue5m3"),
    "nvfp4-4over6": QuantSpec.preset("nvfp4-4over6"),
}

# 0 (G = FLT_MAX), amaxes whose D = 1 / G is subnormal or whose s * D underflows, 1, the
# amax that makes G exactly 1 (448 * 6), ordinary ones, and the largest floats
AMAXES = [0.0, 1e-45, 1e-40, 3e-39, 1e-30, 1.0, 2688.0, 3.7, 0.017, 6e4, 3e38, FP32_MAX]


@pytest.mark.parametrize("spec_name", list(TABLE_SPECS))
def test_tables_are_the_reference_formulas(spec_name):
    spec = TABLE_SPECS[spec_name]
    amax = torch.tensor(AMAXES, dtype=torch.float32)
    tables = encode_tables(on_device(amax), spec)
    assert tables.shape == (len(AMAXES), ENCODE_TABLE.value)
    for table, tensor_amax in zip(tables, amax, strict=True):
        assert_encode_table(table, tensor_amax, spec)


def test_one_launch_serves_specs_of_one_formula():
    nvfp4 = TABLE_SPECS["nvfp4"]
    assert same_tables(nvfp4, nvfp4.replace(rounding="sr"))
    assert same_tables(nvfp4, TABLE_SPECS["nvfp4-ceil"])  # the rule rounds; the table does not
    assert not same_tables(nvfp4, TABLE_SPECS["nvfp4-4over6"])  # S = 256, not 448
    assert not same_tables(nvfp4, TABLE_SPECS["mxfp4-ue5m3"])


def pair_scales(partials: torch.Tensor):
    """A pair's workspace (`amax_workspace`) holding these (2, programs) partial maxima."""
    scales = amax_workspace(partials.shape[1], on_device(torch.empty(0)).device)
    scales.partials.copy_(on_device(partials).reshape(-1))
    return scales


@pytest.mark.parametrize(
    "row_spec, col_spec",
    [("nvfp4", "nvfp4"), ("mxfp4-ue5m3", "nvfp4"), (None, "nvfp4"), ("nvfp4", None)],
)
def test_a_pairs_directions_get_their_own_specs_tables(row_spec, col_spec):
    """`pair_tables`: a table per two-level direction, from its own amax and spec, into the
    workspace's views of it."""
    amax = torch.tensor([3.5, 1e-39])
    row = Direction(TABLE_SPECS[row_spec], None) if row_spec else None
    col = Direction(TABLE_SPECS[col_spec].replace(rounding="sr"), 3) if col_spec else None
    scales = pair_scales(torch.stack([torch.zeros(3), torch.zeros(3)]) + amax[:, None])
    pair_tables(scales, row, col)
    for d, tensor_amax, got_amax, table in (
        (row, amax[0], scales.row_amax, scales.row_table),
        (col, amax[1], scales.col_amax, scales.col_table),
    ):
        if d is not None:
            assert torch.equal(got_amax.cpu(), tensor_amax.reshape(1))
            assert_encode_table(table, tensor_amax, d.spec)


@pytest.mark.parametrize("count", [1, 1000, 2500])
def test_the_table_launch_reduces_an_amax_pass_partial_maxima(count):
    """With an amax pass's partial maxima (a row per tensor, `amax.store_partial`), the table's
    launch writes each row's largest into the amax and builds its table from it: the largest
    anywhere in a row, past the first chunk the kernel reads (1024 at a time) too."""
    generator = torch.Generator().manual_seed(count)
    partials = torch.rand((2, count), generator=generator) * 100
    partials[0, count - 1] = 250.0  # the last entry of a row
    partials[1] *= 1e-42  # subnormal maxima, the largest in the middle
    partials[1, count // 2] = 1e-39
    expected = partials.amax(1)
    spec = TABLE_SPECS["nvfp4"]
    amax = on_device(torch.full((2,), float("nan")))
    tables = encode_tables(amax, spec, on_device(partials))
    assert torch.equal(amax.cpu(), expected)
    for table, tensor_amax in zip(tables, expected, strict=True):
        assert_encode_table(table, tensor_amax, spec)
    row, col = Direction(spec, None), Direction(spec.replace(rounding="sr"), 3)
    scales = pair_scales(partials)
    pair_tables(scales, row, col)
    assert torch.equal(torch.cat([scales.row_amax, scales.col_amax]).cpu(), expected)
    assert_encode_table(scales.row_table, expected[0], spec)
    assert_encode_table(scales.col_table, expected[1], col.spec)


def test_partial_maxima_must_be_a_row_per_amax():
    with pytest.raises(ValueError, match="a row per tensor amax"):
        encode_tables(on_device(torch.zeros(2)), TABLE_SPECS["nvfp4"], on_device(torch.zeros(3, 4)))
