"""On a CUDA GPU: FSDP2's packed-gather hooks (`fp4cli.train.packed_gather`) called as two
ranks would call them, their outputs joined as the all-gather joins them; the layer, on the
fast executor in bfloat16, gives the unsharded layer's outputs and gradients bit for bit, on
its replayed calls too."""

import pytest
import torch
import torch.nn as nn

from fp4cli.linear import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipe_loader import load_recipe
from fp4cli.train.packed_gather import PackedGatherWeight, mark_packed_weights

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    yield init_device_mesh("cuda", (1,))
    dist.destroy_process_group()


def _layer(recipe: str) -> QuantLinear:
    torch.manual_seed(0)
    layer = QuantLinear(512, 1024, config=load_recipe(recipe).linear, seed=7, device="cuda")
    with torch.no_grad():  # the tensor amax in both halves: each rank's is the whole one's
        layer.weight[3, 5], layer.weight[700, 9] = 0.9, -0.9
    return layer


@pytest.mark.parametrize("recipe", ["mxfp4", "tetrajet", "nvfp4", "nvidia-nvfp4"])
def test_joined_shards_give_the_unsharded_layers_bits(mesh, recipe):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    whole, gathered = _layer(recipe), _layer(recipe)
    report = mark_packed_weights(nn.Sequential(gathered), 2)
    assert report.packed == ["0"] and gathered.executor(torch.empty(1, device="cuda"))[0] == "fast"
    shards = [PackedGatherWeight(part) for part in gathered.weight.data_.detach().chunk(2)]
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    hooks = [shard.fsdp_pre_all_gather(mesh, None, None, gathered, policy) for shard in shards]
    joined = tuple(torch.cat(parts) for parts in zip(*(inputs for inputs, _ in hooks), strict=True))
    values, _ = shards[0].fsdp_post_all_gather(joined, hooks[0][1], torch.bfloat16)
    gathered.weight = nn.Parameter(values)  # as FSDP2 hands it the unsharded weight
    gathered.bias = nn.Parameter(whole.bias.detach().to(torch.bfloat16))
    for call in range(3):  # the third call replays the recorded forward program
        x = torch.randn(256, 512, device="cuda")
        results = []
        for layer in (whole, gathered):
            layer.weight.grad = None
            inputs = x.clone().requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = layer(inputs)
            y.float().square().mean().backward()
            results.append((y, inputs.grad, layer.weight.grad.float()))
        for mine, theirs in zip(results[1], results[0], strict=True):
            assert torch.equal(mine, theirs), f"call {call}"
    assert PROGRAMS.refusals() == []
