"""A quantized layer's replayed calls (fp4cli/linear/plans.py) against its executors' direct
calls: the same outputs and gradients bit for bit, call after call, through a change of shape;
every recording of the recipes' layers taken (none refused); layers of one config and shape
sharing a program."""

import pytest
import torch

from fp4cli import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays
from tests.kernel_cases import DEVICE
from tests.linear_runs import seeded_layer

# the fast executor's routes and techniques, and the vector-wise executor
RECIPES = {
    "mxfp4": "fast, values",
    "tetrajet-qema": "fast, double quantization, Q-EMA's guide, SR",
    "nvfp4": "fast, two-level amax passes, 2-D tiles, fixed-sign RHT",
    "nvidia-nvfp4": "fast, block-scaled GEMMs (gemm: exact)",
    "tseng-rht-sr": "fast, random-sign RHT, BF16 forward",
    "wang-fp4": "vector-wise, DGE, clamping",
}


def passes(layer, shapes, autocast):
    """(y, grad x, grad W, grad b) of one training call per shape (rows, in_features)."""
    results = []
    for index, rows in enumerate(shapes):
        generator = torch.Generator().manual_seed(index)
        x = torch.randn(rows, layer.in_features, generator=generator).to(DEVICE)
        x.requires_grad_()
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            y = layer(x)
        grad_y = torch.randn(y.shape, generator=generator).to(DEVICE, y.dtype)
        layer.zero_grad()
        y.backward(grad_y)
        layer.update_ema()
        results.append((y.detach(), x.grad, layer.weight.grad, layer.bias.grad))
    return results


@pytest.mark.parametrize("name", list(RECIPES))
def test_replayed_calls_have_the_direct_calls_bits(name):
    config = load_recipe(name).linear
    shapes = [40, 40, 40, 40, 17, 17, 17, 40]  # recorded, replayed; a ragged batch; back
    autocast = name in ("mxfp4", "nvfp4")  # float32 parameters cast in the kernels
    replayed = passes(seeded_layer(config, "triton", 64, 48), shapes, autocast)
    assert len(PROGRAMS.programs()) == 4 and not PROGRAMS.refusals()
    with replays(False):
        direct = passes(seeded_layer(config, "triton", 64, 48), shapes, autocast)
    for got, expected in zip(replayed, direct, strict=True):
        for a, b in zip(got, expected, strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["mxfp4", "wang-fp4"])
def test_the_bias_takes_no_cast_or_sum_step_of_its_own(name):
    """Under bf16 autocast the float32 bias is rounded in the seed's launch (fast executor), and
    the bias gradient's partial sums are added up in the gradients' launch (both executors):
    the programs hold no cast and no sum for them."""
    config = load_recipe(name).linear
    passes(seeded_layer(config, "triton", 64, 48), [40, 40, 40], True)
    sources = [program.source for program in PROGRAMS.programs()]
    assert len(sources) == 2 and not PROGRAMS.refusals()
    for source in sources:
        assert "aten.sum" not in source
    if name == "mxfp4":
        assert not any("aten._to_copy" in source for source in sources)


def test_two_level_pairs_take_their_amaxes_and_tables_in_their_amax_launch():
    """nvfp4's pairs take their amax pass's partial maxima, tensor amaxes and encode tables
    from one allocation, split in one host step (`launch_pair.amax_workspace`), and the amax
    pass's launch writes the tables too (`encode_table.last_program_tables`): no table launch,
    no select, slice or unbind, and no allocation of their own for the views."""
    passes(seeded_layer(load_recipe("nvfp4").linear, "triton", 64, 48), [40, 40, 40], True)
    sources = [program.source for program in PROGRAMS.programs()]
    assert len(sources) == 2 and not PROGRAMS.refusals()
    for source in sources:
        for step in ("aten.select", "aten.slice", "aten.unbind", "aten.split.Tensor",
                     "encode_table_kernel"):  # fmt: skip
            assert step not in source
        amax_passes = source.count("amax_rht16_cols_kernel") + source.count("amax_pair_kernel")
        assert amax_passes >= 1 and source.count("aten.split_with_sizes") == amax_passes
    forward = next(source for source in sources if "call_seed_kernel" in source)
    assert forward.count("aten.empty") == 7  # the seed, the bias, 5 outputs
    assert forward.count("aten.zeros") == 2  # the 2 workspaces


def test_the_vector_executors_amax_slots_are_views_of_one_step():
    """wang-fp4's zeroed amax slots are split from one allocation in one host step (or are the
    allocation itself where there is one), not sliced one by one."""
    passes(seeded_layer(load_recipe("wang-fp4").linear, "triton", 64, 48), [40, 40, 40], True)
    sources = [program.source for program in PROGRAMS.programs()]
    assert len(sources) == 2 and not PROGRAMS.refusals()
    for source in sources:
        assert "aten.slice" not in source
    assert [source.count("aten.split_with_sizes") for source in sources] == [1, 0]


def test_layers_of_one_config_and_shape_share_programs():
    config = load_recipe("mxfp4").linear
    layers = [QuantLinear(64, 48, config=config, seed=s, backend="triton") for s in range(3)]
    layers = [layer.to(DEVICE) for layer in layers]
    x = torch.randn(24, 64, device=DEVICE, requires_grad=True)
    for _ in range(3):
        for layer in layers:
            layer(x).sum().backward()
    assert len(PROGRAMS) == 2 and len(PROGRAMS.programs()) == 2  # one forward, one backward


def test_a_frozen_weight_without_bias_records_its_own_programs():
    config = load_recipe("tetrajet").linear
    layer = seeded_layer(config, "triton", 64, 48, bias=False)
    layer.weight.requires_grad_(False)
    x = torch.randn(24, 64, device=DEVICE, requires_grad=True)
    grads = []
    for enabled in (True, False):
        layer.calls.zero_()
        with replays(enabled):
            for _ in range(4):
                x.grad = None
                layer(x).sum().backward()
            grads.append(x.grad)
    assert torch.equal(grads[0], grads[1]) and len(PROGRAMS.programs()) == 2


@pytest.mark.parametrize("name", ["tetrajet", "wang-fp4"])
def test_replayed_training_calls_are_counted_and_evaluation_calls_are_not(name):
    """The fast executor's program draws the call's seed and counts the call on the device; the
    vector-wise executor draws none and counts it in the layer."""
    layer = seeded_layer(load_recipe(name).linear, "triton", 64, 48)
    x = torch.randn(24, 64, device=DEVICE, requires_grad=True)
    for _ in range(5):
        layer(x).sum().backward()
    layer.eval()
    with torch.no_grad():
        for _ in range(3):
            layer(x)
    assert int(layer.calls) == 5 and len(PROGRAMS.programs()) >= 2
