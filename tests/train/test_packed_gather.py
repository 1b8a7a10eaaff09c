"""FSDP2's packed all-gather of quantized weights (`fp4cli.train.packed_gather`): two ranks
(gloo, on the CPU) gather the operands one process quantizes, on both executors; which layers
qualify and why not; the bytes; `fp4 train` with it on and off; a given tensor amax."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

import fp4cli
from fp4cli.linear import QuantLinear
from fp4cli.linear.gathered import GatheredWeight, GatherPlan, gather_gap, gather_plan
from fp4cli.quant import QuantSpec, quantize
from fp4cli.quant.two_level import finite_amax
from fp4cli.recipe_loader import load_recipe
from fp4cli.store import RunStore
from fp4cli.train.config import ConfigError, resolve_config
from fp4cli.train.packed_gather import (
    GatherReport,
    PackedGatherWeight,
    bf16_gather_report,
    mark_packed_weights,
    packed_bytes,
)

WORKER = Path(__file__).with_name("packed_gather_worker.py")
RECIPES = ["mxfp4", "tetrajet", "nvfp4", "nvidia-nvfp4"]


def _two_ranks(backend: str, gathers: str) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if backend == "triton":
        env["TRITON_INTERPRET"] = "1"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(WORKER), backend, gathers, *RECIPES]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("backend", ["torch", "triton"])  # the reference, the fast executor
def test_two_ranks_compute_with_the_operands_one_process_quantizes(backend):
    """The worker checks outputs and both W operands bit for bit against the unsharded layer,
    and the gradients, over three steps (the second writes into FSDP2's unsharded weight, the
    third replays the fast executor's recorded program). On the reference executor it checks
    the BF16 gather's outputs and gradients too."""
    gathers = "packed,bf16" if backend == "torch" else "packed"  # BF16's: the path before
    found = _two_ranks(backend, gathers)
    results = {r["recipe"]: r for r in found if r["gather"] == "packed"}
    assert sorted(results) == sorted(RECIPES)
    plain = [r for r in found if r["gather"] == "bf16"]
    assert len(plain) == (4 if backend == "torch" else 0)
    for result in results.values():
        assert result["packed"] == 2 and result["plain"] == {} and result["marked"]
        assert result["refusals"] == []  # the fast executor's calls replay (step 3)
    assert results["mxfp4"]["ratio"] <= 0.60  # both directions travel
    assert results["tetrajet"]["ratio"] <= 0.30  # the forward's; double quantization after
    assert results["nvfp4"]["ratio"] <= 0.30  # one 16x16 tile quantization serves both
    assert results["nvidia-nvfp4"]["ratio"] <= 0.30


@pytest.mark.parametrize(
    ("recipe", "why"),
    [
        ("bf16", "nothing is quantized"),
        ("tseng-rht-sr", "the forward GEMM reads W in high precision"),
        ("wang-fp4", "DGE"),
        ("tetrajet-qema", "Q-EMA"),
    ],
)
def test_what_cannot_travel_packed_says_why(recipe, why):
    config = load_recipe(recipe).linear
    gap = gather_gap(config)
    assert gap is not None and why in gap


def test_random_bits_of_w_follow_the_whole_tensors_rows():
    sr = QuantSpec.preset("mxfp4", rounding="sr")
    config = dataclasses.replace(load_recipe("mxfp4").linear, forward_w=sr)
    assert "forward.w: rounding sr" in gather_gap(config)


def test_a_per_channel_scale_spans_the_shards():
    config = dataclasses.replace(load_recipe("wang-fp4").linear, dge=None)
    assert gather_gap(config) == "forward.w: block column (one scale spans the shards)"


def test_the_plans_of_the_recipes():
    assert gather_plan(load_recipe("mxfp4").linear) == GatherPlan(
        QuantSpec.preset("mxfp4"), QuantSpec.preset("mxfp4")
    )
    tetrajet = gather_plan(load_recipe("tetrajet").linear)
    assert tetrajet.grad_input is None and not tetrajet.shared and tetrajet.rows_multiple == 1
    nvfp4 = gather_plan(load_recipe("nvfp4").linear)
    assert nvfp4.shared and nvfp4.grad_input is None and nvfp4.rows_multiple == 16
    assert gather_plan(load_recipe("mxfp4").linear).rows_multiple == 32


def test_a_2d_tile_quantizes_w_and_its_transpose_alike():
    """Why nvfp4's grad_input operand may be its forward one."""
    spec = load_recipe("nvfp4").linear.forward_w
    weight = torch.randn(48, 64) * torch.logspace(-3, 2, 64)
    by_rows = quantize(weight, spec, axis=1).dequantize()
    by_columns = quantize(weight, spec, axis=0).dequantize()
    assert torch.equal(by_rows, by_columns)


def test_bytes_of_one_gather():
    mxfp4 = gather_plan(load_recipe("mxfp4").linear)
    assert packed_bytes(mxfp4, (768, 3072)) == 2 * (768 * 3072 // 2 + 768 * 3072 // 32)
    nvfp4 = gather_plan(load_recipe("nvfp4").linear)
    assert packed_bytes(nvfp4, (768, 3072)) == 768 * 3072 // 2 + (768 // 16) * (3072 // 16)


def _mlp(recipe: str, rows: int = 128) -> nn.Module:
    config = load_recipe(recipe).linear
    return nn.Sequential(QuantLinear(64, rows, config=config), QuantLinear(rows, 64, config=config))


def test_layers_whose_rows_do_not_split_into_whole_blocks_gather_in_bf16():
    model = _mlp("mxfp4", rows=96)  # 48 rows a rank: not whole 32-row blocks along dY W's axis
    report = mark_packed_weights(model, 2)
    assert report.packed == ["1"]
    assert "96 rows do not split into 2 shards of whole 32-row blocks" in report.plain["0"]
    assert model[0].gathered is None and not isinstance(model[0].weight, PackedGatherWeight)
    assert isinstance(model[1].weight, PackedGatherWeight) and model[1].gathered is not None
    assert report.bf16_bytes == 2 * 2 * 64 * 96
    assert report.bytes == 2 * 64 * 96 + packed_bytes(model[1].gathered.plan, (64, 96))
    assert "1 in BF16" in report.summary()


def test_a_tied_weight_gathers_in_bf16():
    model = _mlp("nvfp4")
    embedding = nn.Embedding(128, 64)
    embedding.weight = model[0].weight
    holder = nn.ModuleDict({"mlp": model, "embedding": embedding})
    report = mark_packed_weights(holder, 2)
    assert report.plain == {"mlp.0": "a weight shared with another module"}


def test_a_marked_weight_is_its_tensor_to_every_op():
    data = torch.randn(4, 6)
    weight = PackedGatherWeight(data)
    assert isinstance(weight.detach(), PackedGatherWeight)
    assert isinstance(weight.view(-1), PackedGatherWeight)
    assert all(isinstance(part, PackedGatherWeight) for part in weight.split(2))
    total = weight + 1
    assert type(total) is torch.Tensor and torch.equal(total, data + 1)
    before = data.clone()
    weight.mul_(2)  # in place: the data inside
    assert torch.equal(data, before * 2)


def test_a_layer_called_outside_the_gather_says_so():
    layer = QuantLinear(64, 32, config=load_recipe("mxfp4").linear)
    layer.gathered = GatheredWeight(gather_plan(layer.config))
    with pytest.raises(RuntimeError, match="not all-gathered before this call"):
        layer(torch.randn(4, 64))


def test_a_part_quantized_with_the_whole_tensors_amax_is_the_wholes_rows():
    spec = load_recipe("nvfp4").linear.forward_x
    whole = torch.randn(64, 64)
    whole[40, 3] = 300.0  # the amax lies in the second part
    whole[5, 9] = float("nan")  # not counted in the amax
    amax = torch.maximum(finite_amax(whole[:32]), finite_amax(whole[32:]))
    expected = quantize(whole, spec, axis=1).dequantize()
    first = quantize(whole[:32], spec, axis=1, tensor_amax=amax).dequantize()
    torch.testing.assert_close(first, expected[:32], rtol=0, atol=0, equal_nan=True)
    alone = quantize(whole[:32], spec, axis=1).dequantize()
    assert not torch.allclose(alone, expected[:32], rtol=0, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="only for a spec with one tensor scale"):
        quantize(whole, QuantSpec.preset("mxfp4"), tensor_amax=amax)


def test_the_switch_and_its_name():
    config, _ = resolve_config({}, ["parallel.fp4_gather=false"])
    assert config.fp4_gather is False
    with pytest.raises(ConfigError, match="fp4_gather: must be true or false"):
        resolve_config({}, ["parallel.fp4_gather=sometimes"])
    assert "parallel.fp4_gather=false" in GatherReport(off="parallel.fp4_gather=false").summary()


def test_a_bf16_gather_reports_every_quantized_weight_in_bf16():
    model = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 16))
    fp4cli.quantize_model(model, "nvfp4")
    report = bf16_gather_report(model, "torch.compile")
    assert report.bytes == report.bf16_bytes == (64 * 32 + 32 * 16) * 2
    assert report.summary() == "FSDP2 all-gathers the weights in BF16 (torch.compile)"


FP4 = [sys.executable, "-m", "fp4cli.cli", "train", "--size=debug", "--device=cpu",
       "--set=log_every=1", "--task=gpt", "--recipe=nvfp4", "--steps=3",
       "--batch-size=8"]  # fmt: skip


def test_fsdp_with_the_packed_gather_trains_as_ddp_and_as_a_bf16_gather(tmp_path):
    """nvfp4 (every layer of the debug GPT travels packed): two FSDP2 ranks give DDP's losses
    (nvfp4's activation amax is each rank's, so one process differs), packed or in BF16; the
    run says which it gathers and keeps the bytes."""
    store = ["--store", str(tmp_path / "s.db")]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}  # one line a message

    def train(*args: str) -> str:
        done = subprocess.run([*FP4, *store, "--nproc-per-node=2", *args], capture_output=True,
                              text=True, timeout=300, env=env)  # fmt: skip
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        return done.stdout + done.stderr

    train("--parallel=ddp")
    packed = train("--parallel=fsdp")
    assert "all-gathers 8 quantized weights packed: 0.25x the bytes of BF16" in packed
    plain = train("--parallel=fsdp", "--set=parallel.fp4_gather=false")
    assert "all-gathers the weights in BF16 (parallel.fp4_gather=false)" in plain
    db = RunStore(tmp_path / "s.db")
    without, with_packed, ddp = db.list_runs()  # newest first
    losses = [
        [m["value"] for m in db.metrics(run["id"], "train_loss")]
        for run in (ddp, with_packed, without)
    ]
    assert losses[1] == pytest.approx(losses[2], rel=1e-6)  # the same operands
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    kept = db.final_metrics(with_packed["id"], ["gather_bytes", "gather_bf16_bytes"])
    assert kept["gather_bytes"] / kept["gather_bf16_bytes"] == pytest.approx(0.252, abs=1e-3)
    kept_plain = db.final_metrics(without["id"], ["gather_bytes", "gather_bf16_bytes"])
    assert (
        kept_plain["gather_bytes"] == kept_plain["gather_bf16_bytes"] == kept["gather_bf16_bytes"]
    )
