"""W's operands quantized before a layer's call: how FSDP2 hands a quantized Linear its weight
when the all-gather moves FP4 codes and scales (`fp4cli.train.packed_gather`).

Each rank quantizes its rows of W into the operands the layer's GEMMs read; the all-gather joins
the rows' codes and scales into the whole weight's. Those are the bits one process quantizes,
when every operand of W that travels:

- rounds without random bits (RNE, ties away, ties up): no seed indexes the rows;
- has no Hadamard transform on its GEMM;
- blocks along in_features (forward), or along out_features in blocks or 2-D tiles that no
  shard boundary cuts (`rows_multiple`: each rank's rows are a multiple of the block);
- with one FP32 tensor scale, takes the tensor's amax, reduced over the ranks first.

The grad_input GEMM's W operand comes from one of three places (`GatherPlan`):

- double quantization: the layer re-quantizes the gathered forward values in its call, with
  its own seeds (SR included), as one process does;
- 2-D tiles with the forward's spec: the forward operand itself (a tile quantizes W and W^T
  alike);
- otherwise its own quantization along out_features, gathered beside the forward's.

The layer's executors read a `WeightOperands` in place of quantizing W: `operand_form` gives the
fast executor's forms, and the reference executor decodes them (`function.py`). The weight
FSDP2 hands the layer holds the forward operand's values (`decoded`, in the parameter dtype):
the fast executor reads them from it rather than decode them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from fp4cli.linear.config import LinearConfig
from fp4cli.quant import QuantizedTensor, QuantSpec
from fp4cli.quant.blocking import BlockLayout

if TYPE_CHECKING:
    from fp4cli.linear.fast_operands import Request

DETERMINISTIC_ROUNDINGS = ("rne", "away", "ties_up")


@dataclass(frozen=True)
class WeightOperands:
    """W's GEMM operands, quantized already: the forward GEMM's (blocked along in_features, axis
    1) and the grad_input GEMM's (along out_features, axis 0; the forward's own with 2-D tiles);
    grad_input None: double quantization derives it from the forward values in the call."""

    forward: QuantizedTensor
    grad_input: QuantizedTensor | None


@dataclass(frozen=True)
class GatherPlan:
    """What travels for one layer's weight: the forward operand's spec, and the grad_input
    operand's: gathered of its own (`grad_input`), the forward's (`shared`), or neither (double
    quantization derives it)."""

    forward: QuantSpec
    grad_input: QuantSpec | None = None
    shared: bool = False

    @property
    def rows_multiple(self) -> int:
        """Each rank's rows of W must be a multiple of this, so that no block or tile spans two
        ranks (1: the forward operand alone, blocked along in_features, travels)."""
        multiple = int(self.forward.block) if self.forward.tile2d else 1
        if self.grad_input is not None:
            multiple = max(multiple, int(self.grad_input.block))
        return multiple

    def operands(
        self, forward: QuantizedTensor, grad_input: QuantizedTensor | None
    ) -> WeightOperands:
        if self.shared:
            return WeightOperands(forward, forward)
        return WeightOperands(forward, grad_input)


def gather_gap(config: LinearConfig) -> str | None:
    """Why a layer under `config` cannot take its weight gathered packed, or None when it can."""
    if config.is_high_precision:
        return "nothing is quantized"
    for present, what in (
        (config.forward_w is None, "the forward GEMM reads W in high precision"),
        (config.forward_hadamard is not None, "a forward Hadamard transform"),
        (config.qema is not None, "Q-EMA (W's rounding follows its average)"),
        (config.dge is not None, "DGE (it reads the high-precision W)"),
        (config.trust is not None, "the trust estimator (it reads the high-precision W)"),
        (config.out_control is not None, "OutControl (FP8 channels of W)"),
    ):
        if present:
            return what
    assert config.forward_w is not None
    gap = _spec_gap(config.forward_w)
    if gap is not None:
        return f"forward.w: {gap}"
    if config.double_quant:
        return None
    if config.grad_input_w is None:
        return "the grad_input GEMM reads W in high precision"
    if config.grad_input_hadamard is not None:
        return "a Hadamard transform on the grad_input GEMM"
    gap = _spec_gap(config.grad_input_w)
    return None if gap is None else f"grad_input.w: {gap}"


def _spec_gap(spec: QuantSpec) -> str | None:
    if spec.element_format.bits != 4:
        return f"{spec.element} elements (the gather moves 4-bit codes)"
    if not isinstance(spec.block, int):
        return f"block {spec.block} (one scale spans the shards)"
    if spec.rounding not in DETERMINISTIC_ROUNDINGS:
        return f"rounding {spec.rounding} (its random bits follow the whole tensor's rows)"
    if spec.outer_block:
        return "outer blocks"
    return None


def gather_plan(config: LinearConfig) -> GatherPlan:
    """The plan of a config that `gather_gap` accepts."""
    assert gather_gap(config) is None and config.forward_w is not None
    if config.double_quant:
        return GatherPlan(config.forward_w)
    spec = config.grad_input_w
    if spec is not None and spec.tile2d and spec == config.forward_w:
        return GatherPlan(config.forward_w, shared=True)
    return GatherPlan(config.forward_w, spec)


def operand_tensors(operands: WeightOperands) -> tuple[torch.Tensor | None, ...]:
    """The tensors of `operands` (codes, scales and tensor amax of the forward operand, then of
    a grad_input operand of its own): a replayed call's inputs (`fast_function.planned_forward`)."""
    found: list[torch.Tensor | None] = []
    for operand in _own(operands):
        found += [operand.codes, operand.scales, operand.tensor_amax]
    return tuple(found)


def operands_key(operands: WeightOperands) -> tuple[Any, ...]:
    """What a replayed call fixes besides the tensors: each operand's spec, shape, axis and
    dtype, and where the grad_input operand comes from."""
    source = "derived" if operands.grad_input is None else "own"
    if operands.grad_input is operands.forward:
        source = "shared"
    return source, *((q.spec, tuple(q.shape), q.axis, q.dtype) for q in _own(operands))


def with_tensors(operands: WeightOperands, tensors: Sequence[Any]) -> WeightOperands:
    """`operands` on other tensors of the same shapes (`operand_tensors`' order)."""
    replaced = [
        dataclasses.replace(q, codes=tensors[3 * i], scales=tensors[3 * i + 1],
                            tensor_amax=tensors[3 * i + 2])
        for i, q in enumerate(_own(operands))
    ]  # fmt: skip
    forward = replaced[0]
    if operands.grad_input is operands.forward:
        return WeightOperands(forward, forward)
    return WeightOperands(forward, replaced[1] if len(replaced) > 1 else None)


def _own(operands: WeightOperands) -> list[QuantizedTensor]:
    """The distinct operands: the forward's, and a grad_input operand of its own."""
    own = [operands.forward]
    if operands.grad_input is not None and operands.grad_input is not operands.forward:
        own.append(operands.grad_input)
    return own


def operand_form(
    operand: QuantizedTensor, request: Request, dtype: torch.dtype
) -> tuple[torch.Tensor, ...]:
    """A quantized operand in the form the fast executor's pair kernel writes for `request`:
    (codes, scales[, tensor amax]) packed, (block values, tensor amax) for the block-scaled
    route, else (values,), in the compute dtype. Decoded by the kernels (a replayed call
    launches them)."""
    if request.packed:
        assert not operand.spec.tile2d, "2-D tiles are kept as values"
        amax = () if operand.tensor_amax is None else (operand.tensor_amax,)
        return operand.codes, operand.scales, *amax
    rows = _as_rows(operand)
    if request.block:
        assert rows.tensor_amax is not None
        return rows.block_values(dtype, "triton"), rows.tensor_amax
    return (rows.dequantize(dtype, "triton"),)


def decoded(operand: QuantizedTensor, dtype: torch.dtype, backend: str = "triton") -> torch.Tensor:
    """The operand's values in `dtype`, decoded by the kernels (or `backend`'s decoder)."""
    return _as_rows(operand).dequantize(dtype, backend)


def _as_rows(operand: QuantizedTensor) -> QuantizedTensor:
    """The operand as the decode kernel takes it: 2-D tiles as the 1-D blocks of their rows,
    each tile's scale on each of its rows (the same values); any other as it is."""
    spec = operand.spec
    if not spec.tile2d:
        return operand
    assert operand.axis == 1
    rows = operand.shape[0]
    line = spec.replace(tile2d=False)
    scales = operand.scales.repeat_interleave(int(spec.block), dim=0)[:rows]
    layout = BlockLayout.for_tensor(tuple(operand.shape), line)
    return QuantizedTensor(
        operand.codes[:rows], scales, operand.tensor_amax, operand.shape, line, 1,
        operand.dtype, layout,
    )  # fmt: skip


class GatheredWeight:
    """Where the packed all-gather leaves one layer's operands: those of the newest gather,
    with the storage of the weight they were decoded into (the tensor FSDP2 then hands the
    layer as its weight). `plan` says what travels."""

    def __init__(self, plan: GatherPlan) -> None:
        self.plan = plan
        self._operands: WeightOperands | None = None
        self._storage = 0

    def store(self, operands: WeightOperands, weight: torch.Tensor) -> None:
        self._operands = operands
        self._storage = weight.untyped_storage().data_ptr()

    def operands_for(self, weight: torch.Tensor) -> WeightOperands:
        """The operands of `weight`, which must be the newest gather's."""
        if self._operands is None or weight.untyped_storage().data_ptr() != self._storage:
            raise RuntimeError(
                "this layer's weight is gathered packed by FSDP2 and was not all-gathered "
                "before this call (call the FSDP2-wrapped model, not the layer on its own)"
            )
        return self._operands
