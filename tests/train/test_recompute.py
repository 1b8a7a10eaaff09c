"""Quantized layers' outputs recomputed in the backward pass (fp4cli/linear/recompute.py, `fp4
train --recompute`): the same outputs, gradients and training metrics bit for bit as when they
are kept, the outputs freed after the forward pass, what the memory probe counts, and the
options' one-line errors. The fast executor runs here under Triton's interpreter
(backend "triton"); tests/gpu/test_gpu_fast_linear.py repeats the comparison on a GPU."""

import dataclasses
import weakref

import pytest
import torch
import torch.nn.functional as F

from fp4cli import QuantLinear
from fp4cli.bench.configs import BenchError
from fp4cli.bench.step import cases, check_step_request
from fp4cli.linear.recompute import (
    OutputUse,
    _pack,
    _unpack,
    recomputed_outputs,
    recomputing,
    tag,
)
from fp4cli.quant.backend import interpreter_on
from fp4cli.recipes import load_recipe
from fp4cli.train.config import ConfigError, TrainConfig
from fp4cli.train.memory import forward_saved_bytes
from tests.kernel_cases import DEVICE

needs_kernels = pytest.mark.skipif(
    DEVICE.type == "cpu" and not interpreter_on(),
    reason="the fast executor runs on a GPU or under TRITON_INTERPRET=1",
)

CONFIGS = {
    name: load_recipe(name).linear
    for name in ("mxfp4", "tetrajet", "tetrajet-qema", "nvfp4", "tseng-rht-sr", "tseng-baseline")
}
CONFIGS["mxfp4-gemm-exact"] = dataclasses.replace(CONFIGS["mxfp4"], gemm="exact")
# the vector-wise executor: Wang et al.'s recipes (DGE and outlier clamping, FP8 backward)
CONFIGS["wang-fp4"] = load_recipe("wang-fp4").linear
CONFIGS["wang-direct"] = load_recipe("wang-direct").linear


def _layers(config):
    torch.manual_seed(1)
    wide = QuantLinear(64, 192, config=config, seed=3, backend="triton").to(DEVICE)
    narrow = QuantLinear(64, 64, config=config, seed=4, backend="triton").to(DEVICE)
    return wide, narrow


def _block(wide, narrow, x):
    """What reads `wide`'s output keeps it: GELU its first third, a product (transposed views)
    the other two; `narrow`'s output is kept by nothing."""
    first, second, third = wide(x).split(64, dim=-1)
    return narrow(F.gelu(first) * second.transpose(0, 1).transpose(0, 1) + third)


def _passes(config, recompute, calls=2):
    """(outputs and gradients of `calls` passes, whether wide's output outlived its forward,
    whether each layer stopped keeping its operands)."""
    wide, narrow = _layers(config)
    assert wide.executor(torch.empty(1, device=DEVICE))[0] in ("fast", "vector")
    results, outlived, outputs = [], [], []
    hook = wide.register_forward_hook(
        lambda m, i, out: outputs.append(weakref.ref(out if out._base is None else out._base))
    )
    for call in range(calls):
        generator = torch.Generator().manual_seed(call)
        x = (torch.randn(1, 40, 64, generator=generator) * 2).to(DEVICE).requires_grad_()
        with recomputed_outputs(recompute):
            y = _block(wide, narrow, x)
        outlived.append(outputs[-1]() is not None)
        wide.zero_grad()
        narrow.zero_grad()
        y.backward(torch.ones_like(y))
        params = [p.grad for p in (*wide.parameters(), *narrow.parameters())]
        results.append([y.detach(), x.grad, *params])
    hook.remove()
    return results, outlived, (wide._recompute.stopped, narrow._recompute.stopped)


@needs_kernels
@pytest.mark.parametrize("name", CONFIGS)
def test_recomputed_outputs_give_the_kept_outputs_bits(name):
    kept, kept_alive, _ = _passes(CONFIGS[name], recompute=False)
    again, again_alive, stopped = _passes(CONFIGS[name], recompute=True)
    for kept_call, again_call in zip(kept, again, strict=True):
        for a, b in zip(kept_call, again_call, strict=True):
            assert torch.equal(a, b), name
    assert kept_alive == [True, True]  # GELU and the product keep it
    assert again_alive == [False, False]  # freed: its operands are kept instead
    # narrow's output, saved by nothing, was tagged once: the second pass keeps nothing extra
    assert stopped == (False, True)


@needs_kernels
def test_an_output_changed_in_place_is_kept_not_recomputed():
    grads = []
    for recompute in (False, True):
        wide, _ = _layers(CONFIGS["mxfp4"])
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)).to(DEVICE)
        with recomputed_outputs(recompute):
            y = wide(x.requires_grad_())
            y.mul_(3.0)  # what GELU then keeps is not the layer's product
            out = F.gelu(y)
        out.sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


@needs_kernels
def test_saved_bytes_count_the_operands_instead_of_the_output():
    wide, narrow = _layers(CONFIGS["mxfp4"])
    x = torch.randn(4, 64, 64).to(DEVICE)
    kept = forward_saved_bytes(lambda: _block(wide, narrow, x.requires_grad_()))
    again = forward_saved_bytes(lambda: _block(wide, narrow, x.requires_grad_()), recompute=True)
    output = 4 * 64 * 192 * 4  # wide's float32 output
    packed_x = 4 * 64 * 64 // 2 + 4 * 64 * 64 // 32  # its forward operand: codes and scales
    w_and_bias = (64 + 1) * 192 * 4  # W's operand and the bias, kept with X's
    assert kept - again == output - packed_x - w_and_bias


def test_nothing_is_tagged_outside_the_context_or_without_gradients():
    assert not recomputing()
    with recomputed_outputs():
        assert recomputing()
        with torch.no_grad():
            assert not recomputing()
    with recomputed_outputs(False):
        assert not recomputing()


def test_a_saved_view_is_recomputed_with_its_geometry():
    output = torch.arange(48.0).reshape(4, 12).clone()  # its own base, as a layer's output is
    use = OutputUse()
    tag(output, use, lambda: torch.arange(48.0).reshape(4, 12).clone())
    view = output.reshape(4, 3, 4)[1:, 1:, ::2].transpose(0, 2)
    assert not use.saved
    packed = _pack(view)
    assert not isinstance(packed, torch.Tensor) and use.saved
    again = _unpack(packed)
    assert torch.equal(again, view) and again.stride() == view.stride()
    assert again.data_ptr() != view.data_ptr()  # a view of the recomputed output
    untagged = torch.ones(3)
    kept = _pack(untagged)
    assert kept.data_ptr() == untagged.data_ptr() and _unpack(kept) is kept


def test_a_forward_that_is_not_differentiated_frees_its_graph():
    """Softmax keeps its own output: kept as itself, it would hold its node in a cycle."""
    x = torch.randn(4, 8, requires_grad=True)
    with recomputed_outputs():
        out = torch.softmax(x * 2, dim=-1)
    gone = weakref.ref(out)
    del out
    assert gone() is None


def test_a_recomputation_of_another_shape_is_refused():
    output = torch.zeros(4, 6)
    tag(output, OutputUse(), lambda: torch.zeros(4, 5))
    with pytest.raises(RuntimeError, match=r"recomputed output \(4, 5\) is not \(4, 6\)"):
        _unpack(_pack(output[1:]))


def test_training_options_refuse_what_recompute_cannot_take():
    with pytest.raises(ConfigError, match="recompute: not with compile"):
        TrainConfig(recompute=True, compile=True)
    with pytest.raises(ConfigError, match="recompute: must be true or false"):
        TrainConfig(recompute="yes")


def test_bench_step_measures_fp4_recipes_both_ways_and_bf16_once():
    found = cases(["gpt"], None, None, ["bf16", "mxfp4"], ["triton"], ["graph"], ("",),
                  (False, True))  # fmt: skip
    assert [(c.recipe, c.recompute) for c in found] == [
        ("bf16", False), ("mxfp4", False), ("mxfp4", True)
    ]  # fmt: skip
    assert found[2].label == "mxfp4 recompute"
    with pytest.raises(BenchError, match="recompute: not with modes compile-graph"):
        check_step_request(["graph", "compile-graph"], 2, torch.device("cpu"), [True])


@needs_kernels
def test_a_run_that_recomputes_logs_what_one_that_keeps_logs(tmp_path):
    from fp4cli.store import RunStore
    from fp4cli.train import run_training
    from fp4cli.train.progress import SilentReporter

    class Messages(SilentReporter):
        def __init__(self):
            self.lines = []

        def message(self, text):
            self.lines.append(text)

    flags = {"task": "regression", "size": "debug", "device": DEVICE.type, "steps": 3,
             "backend": "triton", "recipe": "tetrajet", "checkpoints": False}  # fmt: skip
    store = RunStore(tmp_path / "fp4.db")
    reporter = Messages()
    kept, _ = run_training(flags, [], store, reporter=SilentReporter())
    again, _ = run_training({**flags, "recompute": True}, [], store, reporter=reporter)
    losses = ("train_loss", "val_loss")
    assert [again.metrics[k] for k in losses] == [kept.metrics[k] for k in losses]
    assert "recompute: the 2 quantized layers on the kernel executors keep" in reporter.lines[1]
