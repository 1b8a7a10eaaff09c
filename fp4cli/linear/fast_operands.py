"""The operands the fast executor (`fast.py`) asks the pair kernels for: a `Request` per GEMM
operand (its spec, seeds, Hadamard transform, and the form its GEMM reads), how a backward
operand is kept (`Saved`), and `quantize_both`, which quantizes a tensor along both block
directions, in one launch where they fit one tile."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from fp4cli.kernels.host.tiling import ColumnSums
from fp4cli.linear.config import LinearConfig
from fp4cli.linear.function import _quantize_operand, seed_offsets
from fp4cli.linear.operands import GEMM_OPERAND_FIELDS
from fp4cli.quant import QuantizedTensor, QuantSpec
from fp4cli.quant.blocking import BlockLayout
from fp4cli.techniques.hadamard import FixedSigns, HadamardConfig
from fp4cli.techniques.qema import AverageGuide


@dataclass(frozen=True)
class Request:
    """One operand wanted from a tensor: its spec (None: high precision), SR seed and Hadamard
    seed as (call seed, offset) (the Hadamard's: or its fixed signs), the Hadamard size,
    whether to keep it packed, and whether its values are block values followed by the tensor
    amax (`gemm_route` "block")."""

    spec: QuantSpec | None
    seed: tuple[torch.Tensor, int]
    hadamard: int | None
    hadamard_seed: tuple[torch.Tensor, int] | FixedSigns
    packed: bool = False
    block: bool = False


@dataclass(frozen=True)
class Saved:
    """An operand kept between the passes: packed codes and scale codes (with the spec, the
    shape, the compute dtype to decode them and the axis their blocks run along: 0 for the
    column direction), or the values themselves."""

    spec: QuantSpec | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    axis: int = 0
    block: bool = False  # block values and the tensor amax are wanted (`gemm_route` "block")

    @property
    def count(self) -> int:
        """How many tensors hold it: values (block values: and the tensor amax); codes and
        scales, and a two-level spec's amax."""
        if self.spec is None:
            return 2 if self.block else 1
        return 3 if self.spec.tensor_scale else 2

    def amax(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """A two-level operand's tensor amax (it comes last)."""
        return tensors[-1]

    def operand(self, tensors: tuple[torch.Tensor, ...]) -> QuantizedTensor:
        """The packed operand as `mxfp4_matmul` reads it, blocked along its last axis."""
        assert self.spec is not None
        lines, length = self.shape[::-1] if self.axis == 0 else self.shape
        return packed_operand(tensors, self.spec, lines, length, self.dtype)

    def values(self, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self.spec is None:
            return tensors[0]
        from fp4cli.kernels.quantization.launch import dequantize_e2m1

        codes, scales, *tensor_amax = tensors  # a two-level spec's amax last
        amax = tensor_amax[0] if tensor_amax and not self.block else None
        return dequantize_e2m1(codes, scales, amax, self.spec, self.shape, self.axis, self.dtype)


def packed_operand(
    tensors: tuple[torch.Tensor, ...], spec: QuantSpec, lines: int, length: int, dtype: torch.dtype
) -> QuantizedTensor:
    """A direction's (codes, scales) as the QuantizedTensor (lines, length) blocked along its
    last axis (`length`: the quantized length, a Hadamard transform's padding included)."""
    shape = torch.Size((lines, length))
    layout = BlockLayout.for_tensor((lines, length), spec)
    return QuantizedTensor(tensors[0], tensors[1], None, shape, spec, 1, dtype, layout)


def operand_request(
    config: LinearConfig,
    gemm: str,
    which: int,
    call_seed: torch.Tensor,
    rank: int,
    keep_packed: bool = False,
) -> Request:
    """Operand `which` (0 = a, 1 = b) of `gemm`, as the reference draws its seeds, in the form
    its GEMM's route reads (`gemm_route`), or packed to be kept (`keep_packed`)."""
    offsets = seed_offsets(gemm, GEMM_OPERAND_FIELDS[gemm], rank)
    hadamard: HadamardConfig | None = config.hadamard(gemm)
    route = config.routes[gemm]
    hadamard_seed = (call_seed, offsets[2])
    return Request(
        config.spec(GEMM_OPERAND_FIELDS[gemm][which]),
        (call_seed, offsets[which]),
        hadamard.size if hadamard is not None else None,
        hadamard.sign_source(hadamard_seed) if hadamard is not None else hadamard_seed,
        keep_packed or route == "mxfp4",
        route == "block",
    )


def _direction(request: Request, dtype: torch.dtype) -> Any:
    from fp4cli.kernels.quantization.launch_pair import Direction

    assert request.spec is not None
    return Direction(
        request.spec,
        request.seed,
        request.hadamard,
        request.hadamard_seed,
        None if request.packed else dtype,
        request.block and not request.packed,
    )


def _reference_operand(
    tensor: torch.Tensor, request: Request, axis: int, dtype: torch.dtype
) -> torch.Tensor:
    """A high-precision operand (a Hadamard transform at most) as `function.py` makes it. It
    rounds nothing, so it takes no seed of its own (no launch adds one)."""
    call_seed = request.seed[0]
    signs = request.hadamard_seed
    sign_source = signs if isinstance(signs, FixedSigns) else call_seed + signs[1]
    rht = (request.hadamard, sign_source) if request.hadamard else None
    return _quantize_operand(tensor, request.spec, axis, call_seed, rht, dtype, "auto")


def quantize_both(
    tensor: torch.Tensor,
    row: Request | None,
    col: Request | None,
    dtype: torch.dtype,
    double: bool = False,
    guide: torch.Tensor | AverageGuide | None = None,
    column_sums: ColumnSums | None = None,
    read_as: torch.dtype | None = None,
    sum_row_values: bool = False,
) -> tuple[tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """`tensor` (rows, cols) quantized along axis 1 (`row`) and axis 0 (`col`): each result is
    (values in `dtype`, the GEMM's compute dtype) or, for a packed request, (codes, scales); ()
    where not requested. With `double`, the column direction quantizes the row direction's
    values (TetraJet's double quantization), as the reference does (in a launch of its own when
    its spec has one tensor scale, the amax of those values). column_sums: given the sums of
    `tensor`'s columns, as partial sums from the same read when both directions take one
    launch; with `sum_row_values`, of the row direction's values in `dtype` instead (a request
    for values or packed codes, without a Hadamard transform).
    read_as: `tensor` is quantized as tensor.to(read_as) (`read_as_rounded`)."""
    from fp4cli.kernels.quantization.launch_pair import pair_tile, quantize_pair

    double = double and row is not None and row.spec is not None
    row_dir = _direction(row, dtype) if row is not None and row.spec is not None else None
    col_dir = _direction(col, dtype) if col is not None and col.spec is not None else None
    guide = guide if row_dir is not None else None
    # double quantization into a spec with one tensor scale: that amax is of the row values,
    # which the column direction reads after the row direction's launch
    both = row_dir is not None and col_dir is not None
    doubled_into_scaled = double and col_dir is not None and col_dir.spec.whole_tensor_scale
    tile = pair_tile(row_dir, col_dir) if both and not doubled_into_scaled else None
    value_sums = dtype if sum_row_values else None
    if tile is not None:
        row_out, col_out = quantize_pair(
            tensor, row_dir, col_dir, dtype if double else None, tile, guide, column_sums,
            read_as, value_sums,
        )  # fmt: skip
        return _result(row_out, row), _result(col_out, col)
    if isinstance(guide, AverageGuide):  # formed from the tensor as given, before a cast
        guide = guide.values(tensor)
    # read by torch below, or in two launches: cast once; unless the row launch alone reads it
    # (double quantization: the columns read the row values)
    row_alone = double and row_dir is not None and (column_sums is None or sum_row_values)
    if read_as is not None and not row_alone:
        tensor, read_as = tensor.to(read_as), None
    if column_sums is not None and not sum_row_values:
        column_sums.sum_columns(tensor)
    row_result: tuple[torch.Tensor, ...] = ()
    if row_dir is not None:
        row_sums = column_sums if sum_row_values else None
        row_out = quantize_pair(tensor, row_dir, None, guide=guide, column_sums=row_sums,
                                read_as=read_as, sum_row_values=value_sums)[0]  # fmt: skip
        row_result = _result(row_out, row)
    elif row is not None:
        row_result = (_reference_operand(tensor, row, 1, dtype),)
    source = _row_values(row_result, row, tensor.shape, dtype) if double else tensor
    col_result: tuple[torch.Tensor, ...] = ()
    if col_dir is not None:
        col_result = _result(quantize_pair(source, None, col_dir)[1], col)
    elif col is not None:
        col_result = (_reference_operand(source, col, 0, dtype),)
    return row_result, col_result


def _row_values(
    result: tuple[torch.Tensor, ...], row: Request | None, shape: torch.Size, dtype: torch.dtype
) -> torch.Tensor:
    """The row direction's values (what double quantization re-quantizes), decoded if packed."""
    if row is None or not row.packed:
        return result[0]
    return Saved(row.spec, tuple(shape), dtype, axis=1).values(result)


def _result(out: Any, request: Request | None) -> tuple[torch.Tensor, ...]:
    if out.values is not None:
        block = request is not None and request.block
        return (out.values, out.tensor_amax) if block else (out.values,)
    if out.tensor_amax is not None:
        return out.codes, out.scales, out.tensor_amax
    return out.codes, out.scales


def saved_form(request: Request, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> Saved:
    """How the column-direction operand of a (rows, cols) tensor is kept for the backward pass."""
    rows = quantized_length(shape[0], request)
    spec = request.spec if request.packed else None
    return Saved(spec, (rows, shape[1]), dtype, block=request.block)


def quantized_length(length: int, request: Request) -> int:
    """A direction's length as quantized: padded to whole Hadamard transforms."""
    return -(-length // request.hadamard) * request.hadamard if request.hadamard else length
