"""The Llama model on a GPU: the fast executors take all seven projections of every block and
give the reference executor's bits under bf16 autocast; torch.compile makes the quantized model
one graph with the eager bits; `fp4 train --task llama` replays its steps from a CUDA graph
and logs what an eager run logs."""

from __future__ import annotations

import pytest
import torch

import fp4cli
from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter
from tests.gpu_gpt import gpt_batches, gpt_loss
from tests.kernel_checks import assert_bits

pytestmark = pytest.mark.gpu

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tiny_llama(recipe: str, backend: str) -> torch.nn.Module:
    from fp4cli.tasks.llama_model import Llama, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(256, 128, n_layer=2, n_embd=128, n_head=4, n_mlp=256)
    model = Llama(config).cuda()
    fp4cli.quantize_model(model, recipe, seed=0, backend=backend)
    return model


def gradients(recipe: str, backend: str, executor: str, compiler: str | None = None) -> dict:
    """{"loss": the last loss, each parameter's name: its gradient} after two batches under
    bf16 autocast, every projection checked to run on `executor`."""
    model = tiny_llama(recipe, backend)
    layers = fp4cli.quantized_layers(model)
    assert sorted(name.rsplit(".", 1)[-1] for name in layers) == sorted(PROJECTIONS * 2)
    assert all(layer.executor()[0] == executor for layer in layers.values())
    if compiler is not None:
        torch._dynamo.reset()
    run = model if compiler is None else torch.compile(model, backend=compiler, fullgraph=True)
    for batch in gpt_batches(2):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = gpt_loss(run, batch)
        loss.backward()
    return {"loss": loss.detach(), **{n: p.grad for n, p in model.named_parameters()}}


def assert_same_bits(got: dict, want: dict, recipe: str) -> None:
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert_bits(tensor, want[name], f"{recipe}: {name}")


@pytest.mark.parametrize(
    ("recipe", "executor"),
    [("mxfp4", "fast"), ("tetrajet", "fast"), ("nvfp4", "fast"), ("wang-fp4", "vector")],
)
def test_the_fast_executors_give_the_reference_bits_on_llama(recipe, executor):
    """No biases: every gradient is the reference's, bit for bit."""
    want = gradients(recipe, "torch", "reference")
    assert_same_bits(gradients(recipe, "triton", executor), want, recipe)


@pytest.mark.parametrize("recipe", ["tetrajet", "nvfp4"])
def test_compiled_llama_is_one_graph_with_the_eager_bits(recipe):
    eager = gradients(recipe, "triton", "fast")
    assert_same_bits(gradients(recipe, "triton", "fast", "aot_eager"), eager, recipe)


def test_llama_training_replays_from_a_cuda_graph_with_the_eager_metrics(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "llama", "size": "debug", "recipe": "tetrajet-qema", "steps": 16,
             "log_every": 1, "stats_every": 8}  # fmt: skip

    def series(run_id):
        rows = store.metrics(run_id)
        return [(m["step"], m["name"], m["value"]) for m in rows if m["name"] != "samples_per_s"]

    eager, _ = run_training({**flags, "cuda_graph": False}, [], store, reporter=SilentReporter())
    graphed, trainer = run_training(flags, [], store, reporter=SilentReporter())
    assert trainer.step_runner.graph is not None
    assert series(graphed.run_id) == series(eager.run_id)
