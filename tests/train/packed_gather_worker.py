"""One rank of `test_packed_gather.py`'s two-process runs (started by torch.distributed.run,
gloo on the CPU): for each recipe, a two-layer MLP of QuantLinear layers under FSDP2 with the
packed all-gather (and, asked, with the BF16 one), against the same MLP unsharded in this
process. Arguments: backend, gathers (packed,bf16), recipes. Prints one JSON line per recipe and
gather from rank 0; exits non-zero on the first mismatch."""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

from fp4cli.linear import QuantLinear, quantized_layers
from fp4cli.linear.plans import PROGRAMS
from fp4cli.quant import quantize
from fp4cli.recipe_loader import load_recipe
from fp4cli.train.packed_gather import PackedGatherWeight, mark_packed_weights

WIDTH, HIDDEN, ROWS = 64, 128, 8


def mlp(config, backend: str) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        QuantLinear(WIDTH, HIDDEN, config=config, seed=11, backend=backend),
        nn.GELU(),
        QuantLinear(HIDDEN, WIDTH, config=config, seed=12, backend=backend),
    )
    with torch.no_grad():  # an outlier row: the tensor amax lies in one rank's rows
        model[0].weight[3] *= 40.0
    return model


def full_operand(layer: QuantLinear, spec, axis: int) -> torch.Tensor:
    """W's operand as one process quantizes the whole weight."""
    return quantize(layer.weight.detach(), spec, axis=axis, seed=0).dequantize()


def check(recipe_name: str, backend: str, gather: str) -> dict:
    """One recipe's model, its weights gathered `packed` or in `bf16` (unmarked)."""
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    config = load_recipe(recipe_name).linear
    reference = mlp(config, backend)
    sharded = mlp(config, backend)
    for layer in quantized_layers(sharded).values():
        layer.rank = rank  # as `fp4 train` sets it (distributed.wrap)
    for layer in quantized_layers(reference).values():
        layer.rank = rank
    report = mark_packed_weights(sharded, world) if gather == "packed" else None
    for block in sharded:
        if isinstance(block, QuantLinear):
            fully_shard(block)
    fully_shard(sharded)
    # the second gather writes into FSDP2's unsharded weight; the third call replays
    for step in range(3):
        _step(recipe_name, config, reference, sharded, step)
    marked = all(
        isinstance(layer.weight.to_local(), PackedGatherWeight)
        for layer in quantized_layers(sharded).values()
        if layer.gathered is not None
    )
    return {
        "refusals": PROGRAMS.refusals(),  # replays that could not be recorded
        "recipe": recipe_name,
        "backend": backend,
        "gather": gather,
        "packed": len(report.packed) if report is not None else 0,
        "plain": report.plain if report is not None else {},
        "ratio": round(report.ratio, 4) if report is not None else 1.0,
        "marked": marked,
    }


def _step(recipe_name: str, config, reference: nn.Module, sharded: nn.Module, step: int) -> None:
    """One forward and backward pass of both models on this rank's rows: the same outputs and
    W operands bit for bit, the global batch's gradient."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1 + step)
    x = torch.randn(ROWS * world, WIDTH)
    mine = x[rank * ROWS : (rank + 1) * ROWS]
    for layer in quantized_layers(reference).values():
        layer.calls.fill_(step)
    y_ref = reference(mine)
    y = sharded(mine)
    if not torch.equal(y, y_ref):
        raise AssertionError(f"{recipe_name} step {step}: outputs differ from one process's")
    for name, layer in quantized_layers(sharded).items():
        if layer.gathered is None:
            continue
        given = layer.gathered._operands  # the gather of this forward pass
        if given is None:
            raise AssertionError(f"{recipe_name} {name}: nothing gathered packed")
        whole = dict(quantized_layers(reference))[name]
        forward = given.forward.dequantize()
        if not torch.equal(forward, full_operand(whole, config.forward_w, 1)):
            raise AssertionError(f"{recipe_name} {name}: forward operand differs")
        if given.grad_input is not None and config.grad_input_w is not None:
            dx = given.grad_input.dequantize()
            if not torch.equal(dx, full_operand(whole, config.grad_input_w, 0)):
                raise AssertionError(f"{recipe_name} {name}: grad_input operand differs")
    sharded.zero_grad()
    reference.zero_grad()
    y.square().mean().backward()
    for part_rank, part in enumerate(x.split(ROWS)):  # each rank's rows as it rounds them
        for layer in quantized_layers(reference).values():
            layer.rank = part_rank
            layer.calls.fill_(step)  # the call the sharded model made: the same seeds
        (reference(part).square().mean() / world).backward()
    for layer in quantized_layers(reference).values():
        layer.rank = rank
    for (name, p_sharded), (_, p_ref) in zip(
        sharded.named_parameters(), reference.named_parameters(), strict=True
    ):
        local = p_sharded.grad.to_local()
        rows = local.shape[0]
        expected = p_ref.grad[rank * rows : (rank + 1) * rows]
        if not torch.allclose(local, expected, rtol=1e-5, atol=1e-7):
            raise AssertionError(f"{recipe_name} step {step} {name}: gradient differs")
    with torch.no_grad():  # a step of the reference, copied into the shards (through the mark)
        for p_sharded, p_ref in zip(sharded.parameters(), reference.parameters(), strict=True):
            p_ref.sub_(0.1 * p_ref.grad)
            local = p_sharded.to_local()
            local.copy_(p_ref[rank * local.shape[0] : (rank + 1) * local.shape[0]])


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    backend, gathers = sys.argv[1], sys.argv[2].split(",")
    try:
        for recipe_name in sys.argv[3:]:
            for gather in gathers:
                result = check(recipe_name, backend, gather)
                if dist.get_rank() == 0:
                    print(json.dumps(result), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
