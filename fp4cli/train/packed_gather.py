"""FSDP2 all-gathers that move a quantized Linear's weight in FP4: codes and scales, not BF16.

FSDP2 shards each weight by rows (out_features) and all-gathers it before the layer's call. A
weight marked here (`PackedGatherWeight`) instead has each rank quantize its own rows into the
operands the layer's GEMMs read (`fp4cli.linear.gathered`: the plan, and why it gives one
process's bits); the all-gather joins the rows' codes and scales; the layer reads the joined
operands and quantizes W no more. Tensor-scaled specs (NVFP4's FP32 scale) take the tensor's
amax, all-reduced over the ranks first.

FSDP2 calls `fsdp_pre_all_gather` on a rank's shard and `fsdp_post_all_gather` on the gathered
outputs (its extension protocol for tensor subclasses). The unsharded weight FSDP2 then hands
the layer holds the forward operand's values in the parameter dtype: the weight the layer
computes with. The gradient reaches the shards through FSDP2's reduce-scatter as before.

`mark_packed_weights` marks the layers that can (`GatherReport`: which, why not the others, and
the bytes one all-gather of their weights moves, packed and as BF16).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
from torch.utils._pytree import tree_map_only

from fp4cli.linear.gathered import (
    GatheredWeight,
    GatherPlan,
    decoded,
    gather_gap,
    gather_plan,
)
from fp4cli.quant import QuantizedTensor, QuantSpec, quantize
from fp4cli.quant.blocking import TENSOR_SCALE_BYTES, BlockLayout
from fp4cli.quant.two_level import finite_amax

BF16_BYTES = 2

_aten = torch.ops.aten
# The ops FSDP2 applies to a parameter when it shards and gathers it: their results stay marked.
# Any other op (the optimizer's, a norm) sees the plain tensor inside.
_MARK_KEPT = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.view.default,
    _aten.as_strided.default,
    _aten.slice.Tensor,
    _aten.split.Tensor,
    _aten.split_with_sizes.default,
    _aten.clone.default,
    _aten.empty_like.default,
    _aten.new_zeros.default,
    _aten.new_empty.default,
    _aten._to_copy.default,
    _aten._pin_memory.default,
}


class PackedGatherWeight(torch.Tensor):
    """A quantized Linear's weight whose FSDP2 all-gather moves FP4 codes and scales. It
    behaves as the plain tensor it wraps (`data`) for every op; FSDP2 finds the two hooks."""

    data_: torch.Tensor

    @staticmethod
    def __new__(cls, data: torch.Tensor) -> PackedGatherWeight:
        return torch.Tensor._make_wrapper_subclass(
            cls, data.shape, strides=data.stride(), storage_offset=data.storage_offset(),
            dtype=data.dtype, layout=data.layout, device=data.device,
            requires_grad=data.requires_grad,
        )  # fmt: skip

    def __init__(self, data: torch.Tensor) -> None:
        self.data_ = data

    def __tensor_flatten__(self) -> tuple[list[str], None]:
        return ["data_"], None

    @staticmethod
    def __tensor_unflatten__(
        inner: dict[str, torch.Tensor], meta: Any, outer_size: Any, outer_stride: Any
    ) -> PackedGatherWeight:
        return PackedGatherWeight(inner["data_"])

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]
        cls, func: Any, types: Any, args: Any = (), kwargs: Any = None
    ) -> Any:
        def unwrap(tensor: PackedGatherWeight) -> torch.Tensor:
            return tensor.data_

        out = func(*tree_map_only(cls, unwrap, args), **tree_map_only(cls, unwrap, kwargs or {}))
        if func is _aten.copy_.default:
            return args[0]
        if func in _MARK_KEPT:
            return tree_map_only(torch.Tensor, cls, out)
        return out

    def fsdp_pre_all_gather(
        self, mesh: Any, outer_size: Any, outer_stride: Any, module: nn.Module, mp_policy: Any
    ) -> tuple[tuple[torch.Tensor, ...], Any]:
        """This rank's rows quantized: (codes and scales of each operand that travels, rows
        first; what `fsdp_post_all_gather` needs)."""
        source: GatheredWeight = module.gathered  # type: ignore[assignment]
        dtype = mp_policy.param_dtype or self.dtype
        rows = self.data_.to(dtype)
        amax = _reduced_amax(rows, source.plan, mesh)
        backend = "torch" if getattr(module, "backend", "auto") == "torch" else "auto"
        forward = _quantized(rows, source.plan.forward, 1, amax, backend)
        inputs = [forward.codes, forward.scales]
        if source.plan.grad_input is not None:
            grad_input = _quantized(rows, source.plan.grad_input, 0, amax, backend)
            inputs += [grad_input.codes.t().contiguous(), grad_input.scales.t().contiguous()]
        return tuple(inputs), (source, amax, dtype, self.shape[1], backend)

    def fsdp_post_all_gather(
        self,
        outputs: tuple[torch.Tensor, ...],
        metadata: Any,
        param_dtype: torch.dtype,
        *,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]] | None:
        """The whole weight's operands from the gathered rows, stored for the layer; the
        unsharded weight (the forward operand's values) returned, or written into `out`."""
        source, amax, dtype, columns, backend = metadata
        plan: GatherPlan = source.plan
        shape = torch.Size((outputs[0].shape[0], columns))
        forward = _joined(outputs[0], outputs[1], plan.forward, 1, shape, amax, dtype)
        grad_input = None
        if plan.grad_input is not None:
            codes, scales = outputs[2].t(), outputs[3].t()
            grad_input = _joined(codes, scales, plan.grad_input, 0, shape, amax, dtype)
        values = decoded(forward, param_dtype, backend)  # what the layer reads as its values
        operands = plan.operands(forward, grad_input)
        if out is not None:
            # `out` is the unsharded parameter, which autograd may hold from the forward pass:
            # refilled with the same values, as FSDP2 refills its own, without a new version
            with torch.no_grad(), torch.autograd._unsafe_preserve_version_counter(out):
                out.copy_(values)
            source.store(operands, out)
            return None
        source.store(operands, values)
        return values, (values,)


def _reduced_amax(rows: torch.Tensor, plan: GatherPlan, mesh: Any) -> torch.Tensor | None:
    """The whole weight's amax (float32, the maximum over the ranks) when an operand that
    travels has one tensor scale; else None."""
    specs = [plan.forward, plan.grad_input]
    if not any(spec is not None and spec.whole_tensor_scale for spec in specs):
        return None
    import torch.distributed as dist

    amax = finite_amax(rows)
    dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=mesh.get_group())
    return amax


def _quantized(
    rows: torch.Tensor, spec: QuantSpec, axis: int, amax: torch.Tensor | None, backend: str
) -> QuantizedTensor:
    given = amax if spec.whole_tensor_scale else None
    return quantize(rows, spec, axis=axis, seed=0, backend=backend, tensor_amax=given)


def _joined(
    codes: torch.Tensor,
    scales: torch.Tensor,
    spec: QuantSpec,
    axis: int,
    shape: torch.Size,
    amax: torch.Tensor | None,
    dtype: torch.dtype,
) -> QuantizedTensor:
    """The QuantizedTensor of the whole weight (`shape`) along `axis` from its gathered codes
    and scales (copied: FSDP2 reuses its gather buffers)."""
    moved = (shape[1], shape[0]) if axis == 0 else tuple(shape)
    layout = BlockLayout.for_tensor(moved, spec)
    tensor_amax = amax if spec.whole_tensor_scale else None
    return QuantizedTensor(
        codes.contiguous().clone(), scales.contiguous().clone(), tensor_amax, shape, spec, axis,
        dtype, layout,
    )  # fmt: skip


@dataclass
class GatherReport:
    """What `mark_packed_weights` did: the layers marked, those left in BF16 with the reason,
    and the bytes one all-gather of the quantized layers' weights moves, packed where marked
    and BF16 elsewhere (`bytes`), against all of them in BF16 (`bf16_bytes`)."""

    packed: list[str] = field(default_factory=list)
    plain: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    bf16_bytes: int = 0
    off: str | None = None  # why nothing was marked: the switch, or torch.compile

    @property
    def ratio(self) -> float:
        return self.bytes / self.bf16_bytes if self.bf16_bytes else 1.0

    def metrics(self) -> dict[str, float]:
        """What the run store keeps (at the run's first step): the bytes one all-gather of the
        quantized layers' weights moves, as gathered and in BF16."""
        return {"gather_bytes": float(self.bytes), "gather_bf16_bytes": float(self.bf16_bytes)}

    def summary(self) -> str:
        """One line for the run's start."""
        if self.off == "one process":
            return "FSDP2 on one process: no all-gather"
        if self.off is not None:
            return f"FSDP2 all-gathers the weights in BF16 ({self.off})"
        if not self.packed:
            reasons = sorted(set(self.plain.values()))
            why = f" ({'; '.join(reasons)})" if reasons else ""
            return f"FSDP2 all-gathers the weights in BF16{why}"
        line = (
            f"FSDP2 all-gathers {len(self.packed)} quantized weights packed: "
            f"{self.ratio:.2f}x the bytes of BF16 (--set parallel.fp4_gather=false: BF16)"
        )
        if self.plain:
            line += f"; {len(self.plain)} in BF16 ({'; '.join(sorted(set(self.plain.values())))})"
        return line


def mark_packed_weights(model: nn.Module, world_size: int) -> GatherReport:
    """Mark the weight of every quantized Linear that can be gathered packed over `world_size`
    ranks (before `fully_shard`); the others stay as they are."""
    report = GatherReport()
    shared = _shared_parameters(model)
    for name, layer in _quantized_layers(model):
        weight = layer.weight
        full = weight.numel() * BF16_BYTES
        report.bf16_bytes += full
        why = gather_gap(layer.config)
        if why is None:
            plan = gather_plan(layer.config)
            why = _unsplit_reason(layer.out_features, plan, world_size, id(weight) in shared)
        if why is not None:
            report.plain[name] = why
            report.bytes += full
            continue
        report.bytes += packed_bytes(plan, (weight.shape[0], weight.shape[1]))
        layer.gathered = GatheredWeight(plan)
        layer.weight = nn.Parameter(
            PackedGatherWeight(weight.detach()), requires_grad=weight.requires_grad
        )
        report.packed.append(name)
    return report


def bf16_gather_report(model: nn.Module, off: str) -> GatherReport:
    """The report of an all-gather that moves every quantized weight in BF16; `off` says why."""
    report = GatherReport(off=off)
    for _, layer in _quantized_layers(model):
        report.bf16_bytes += layer.weight.numel() * BF16_BYTES
    report.bytes = report.bf16_bytes
    return report


def _quantized_layers(model: nn.Module) -> list[tuple[str, Any]]:
    """The quantized Linears whose weights an FP4 recipe quantizes, by name."""
    from fp4cli.linear import quantized_layers

    layers = quantized_layers(model).items()
    return [(name, layer) for name, layer in layers if not layer.config.is_high_precision]


def _unsplit_reason(rows: int, plan: GatherPlan, world_size: int, shared: bool) -> str | None:
    """Why a weight that `plan` could gather packed stays BF16, or None."""
    if shared:
        return "a weight shared with another module"
    multiple = plan.rows_multiple
    if rows % world_size or (rows // world_size) % multiple:
        return f"{rows} rows do not split into {world_size} shards of whole {multiple}-row blocks"
    return None


def _shared_parameters(model: nn.Module) -> set[int]:
    """The ids of parameters that more than one module holds (tied weights)."""
    seen: dict[int, int] = {}
    for _, parameter in model.named_parameters(remove_duplicate=False):
        seen[id(parameter)] = seen.get(id(parameter), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def packed_bytes(plan: GatherPlan, shape: tuple[int, int]) -> int:
    """The bytes one all-gather moves for a weight of `shape` under `plan`: each travelling
    operand's codes and block scales (the tensor scale is reduced, not gathered)."""
    total = 0
    for spec, moved in ((plan.forward, shape), (plan.grad_input, shape[::-1])):
        if spec is None:
            continue
        codes, scales = BlockLayout.for_tensor(moved, spec).stored_bytes(spec)
        total += codes + scales - (TENSOR_SCALE_BYTES if spec.tensor_scale else 0)
    return total


def plain_state(state: Any) -> Any:
    """A state dict (nested) with each marked shard as the plain tensor it wraps (sharing its
    storage): what a distributed checkpoint saves and loads into, so that checkpoints hold
    plain tensors only (loaded with weights_only)."""
    from torch.distributed.tensor import DTensor

    def plain(tensor: DTensor) -> DTensor:
        local = tensor.to_local()
        if not isinstance(local, PackedGatherWeight):
            return tensor
        return DTensor.from_local(
            local.data_, tensor.device_mesh, tensor.placements, run_check=False,
            shape=tensor.shape, stride=tensor.stride(),
        )  # fmt: skip

    return tree_map_only(DTensor, plain, state)
