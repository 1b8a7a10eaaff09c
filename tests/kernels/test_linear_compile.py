"""The kernel executors under torch.compile (fp4cli/linear/ops.py): the quantized Linear is two
custom ops, so a compiled model has no graph break in it (`fullgraph=True` fails on one) and
gives the eager layer's outputs and gradients bit for bit."""

import dataclasses
import inspect

import pytest
import torch

from fp4cli import LinearConfig, QuantSpec
from fp4cli.linear.ops import op_key, quant_linear, quant_linear_backward
from tests.kernel_cases import DEVICE
from tests.kernels.test_linear_fast import CONFIGS
from tests.linear_runs import assert_same_passes, linear_inputs, seeded_layer, training_passes
from tests.train.test_fast_vector import CONFIGS as VECTOR_CONFIGS

MXFP4 = QuantSpec.preset("mxfp4")
COMPILED = {
    name: CONFIGS[name]
    for name in ("mxfp4", "tetrajet", "tetrajet-qema", "tseng-rht-sr", "double-quant-rht", "nvfp4")
}
# X's and W's backward operands unquantized: the op returns copies of its inputs
COMPILED["unquantized-saved"] = LinearConfig(
    forward_x=MXFP4, forward_w=MXFP4, grad_input_dy=MXFP4, grad_weight_dy=MXFP4
)
# the GEMMs on mxfp4_matmul (fp4cli::quant_linear keeps W's grad_input operand packed)
COMPILED["tetrajet-gemm-exact"] = dataclasses.replace(CONFIGS["tetrajet"], gemm="exact")
COMPILED["wide-rht-gemm-fast"] = dataclasses.replace(CONFIGS["wide-rht"], gemm="fast")
# NVFP4's block-scaled products (W's grad_input operand kept as block values and its amax)
COMPILED["nvfp4-gemm-exact"] = dataclasses.replace(CONFIGS["nvfp4"], gemm="exact")
# X kept with an amax per outer block; MS-EDEN with its column operands in launches of their own
COMPILED["tetrajet-v2"] = CONFIGS["tetrajet-v2"]
COMPILED["quartet2"] = CONFIGS["quartet2"]
# the vector-wise executor: Wang et al.'s recipes, DGE (it keeps the weight) and the clamp
VECTOR = {name: VECTOR_CONFIGS[name] for name in ("wang-fp4", "wang-direct", "dge-only", "paper")}
# the FP8 route (X's and W's codes kept as their transposes', dY's in both layouts)
VECTOR["wang-fp4-gemm-fast"] = dataclasses.replace(VECTOR_CONFIGS["wang-fp4"], gemm="fast")


def compiled_passes(layer, x, grad_y, backend="aot_eager", calls=2):
    torch._dynamo.reset()
    return training_passes(torch.compile(layer, backend=backend, fullgraph=True), x, grad_y, calls)


@pytest.mark.parametrize("name", [*COMPILED, *VECTOR])
def test_compiled_layer_matches_eager_bit_for_bit(name):
    config = COMPILED.get(name) or VECTOR[name]
    x, grad_y = linear_inputs((1, 37, 96), outlier=True)  # ragged: 2 x 2 tiles of X
    eager = training_passes(seeded_layer(config, "triton"), x, grad_y)
    layer = seeded_layer(config, "triton")
    assert layer.executor() == ("fast" if name in COMPILED else "vector", "")
    assert_same_passes(compiled_passes(layer, x, grad_y), eager)
    assert int(layer.calls) == 2  # each compiled call drew fresh seeds, as the eager ones


@pytest.mark.parametrize("name", ["mxfp4", "tetrajet", "tetrajet-qema", "nvfp4", "wang-fp4"])
def test_compiled_layer_matches_eager_bit_for_bit_under_autocast(name):
    """Under bfloat16 autocast: float32 x, W and bias computed with in bfloat16, the gradients
    returned in float32, as the eager layer gives them."""
    config = COMPILED.get(name) or VECTOR[name]
    x, grad_y = linear_inputs((1, 37, 96), outlier=True)

    def passes(layer):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            return training_passes(layer, x, grad_y.to(torch.bfloat16))

    eager = passes(seeded_layer(config, "triton"))
    torch._dynamo.reset()
    layer = seeded_layer(config, "triton")
    compiled = passes(torch.compile(layer, backend="aot_eager", fullgraph=True))
    assert compiled[0][0].dtype == torch.bfloat16 and compiled[0][1].dtype == torch.float32
    assert_same_passes(compiled, eager)


def test_compiled_layer_without_bias_and_input_gradient():
    config = CONFIGS["tetrajet"]
    x, grad_y = linear_inputs((29, 96), seed=4)
    x.requires_grad_(False)
    eager = training_passes(seeded_layer(config, "triton", bias=False), x, grad_y)
    compiled = compiled_passes(seeded_layer(config, "triton", bias=False), x, grad_y)
    assert compiled[0][1] is None
    assert_same_passes(compiled, eager)


def test_frozen_weight_compiles_without_its_saved_operand():
    x, grad_y = linear_inputs((21, 96), seed=5)
    layers = [seeded_layer(CONFIGS["nvfp4"], "triton") for _ in range(2)]
    for layer in layers:
        layer.weight.requires_grad_(False)
    eager = training_passes(layers[0], x, grad_y)
    assert_same_passes(compiled_passes(layers[1], x, grad_y), eager)


def test_inductor_compiles_a_model_through_its_quantized_layers():
    """Two quantized layers and a GELU under inductor and bf16 autocast, in one graph."""

    def model():
        torch.manual_seed(2)
        first = seeded_layer(CONFIGS["tetrajet"], "triton", 96, 64)
        second = seeded_layer(CONFIGS["tetrajet"], "triton", 64, 48)
        return torch.nn.Sequential(first, torch.nn.GELU(), second).to(DEVICE)

    x, grad_y = linear_inputs((2, 9, 96), 48, seed=6)
    eager, compiled = model(), model()
    torch._dynamo.reset()
    run = torch.compile(compiled, fullgraph=True)
    for net in (eager, run):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            y = net(x)
        y.float().backward(grad_y)
    for got, expected in zip(compiled.parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(got.grad, expected.grad, rtol=2e-2, atol=1e-3)


def op_args(executor, config, dtype=None):
    layer = seeded_layer(config, "triton", 64, 40)
    x = torch.randn(24, 64, device=DEVICE)
    call_seed = torch.tensor(7, device=DEVICE)
    return (x, layer.weight.detach(), layer.bias.detach(), call_seed, None, executor,
            op_key(config), 0, True, True, dtype)  # fmt: skip


@pytest.mark.parametrize(
    ("executor", "name"),
    [
        ("fast", "mxfp4"),
        ("fast", "nvfp4"),
        ("fast", "tetrajet-gemm-exact"),
        ("fast", "nvfp4-gemm-exact"),
        ("fast", "tetrajet-v2"),
        ("fast", "quartet2"),
        ("vector", "paper"),
        ("vector", "wang-fp4-gemm-fast"),
    ],  # fmt: skip
)
def test_fake_implementations_give_the_real_outputs_layout(executor, name):
    """Each op's fake implementation (the launchers with launches skipped) allocates what the
    real op returns: shapes, dtypes and strides (torch.library.opcheck's fake-tensor test)."""
    check_fake_implementations(op_args(executor, COMPILED.get(name) or VECTOR[name]))


@pytest.mark.parametrize(("executor", "name"), [("fast", "nvfp4"), ("vector", "wang-fp4")])
def test_fake_implementations_hold_for_a_compute_dtype_of_their_own(executor, name):
    """float32 x, W and bias computed with in bfloat16 (under autocast): the float32
    gradients' layout too."""
    config = COMPILED.get(name) or VECTOR[name]
    check_fake_implementations(op_args(executor, config, torch.bfloat16))


def check_fake_implementations(args):
    torch.library.opcheck(quant_linear, args, test_utils=("test_schema", "test_faketensor"))
    outputs = quant_linear(*args)
    x, weight, bias, call_seed, _, executor, key, *_, dtype = args
    shapes = [*x.shape, *weight.shape]
    grad_y = torch.randn(x.shape[0], weight.shape[0], device=DEVICE).to(dtype or x.dtype)
    targets = [x.dtype, weight.dtype, bias.dtype]
    backward_args = (grad_y, list(outputs[1:]), call_seed, executor, key, 0, shapes,
                     dtype or x.dtype, [True, True, True], *targets)  # fmt: skip
    torch.library.opcheck(
        quant_linear_backward, backward_args, test_utils=("test_schema", "test_faketensor")
    )
    grads = quant_linear_backward(*backward_args)
    assert [g.dtype for g in grads] == targets


def test_an_unregistered_config_or_executor_is_one_error():
    args = list(op_args("fast", COMPILED["mxfp4"]))
    with pytest.raises(RuntimeError, match="no executor 'reference'"):
        quant_linear(*args[:5], "reference", *args[6:])
    with pytest.raises(RuntimeError, match="no layer registered config"):
        quant_linear(*args[:6], "LinearConfig(nothing)", *args[7:])


def test_a_compiled_gpt_is_one_graph_with_the_eager_gradients():
    """The gpt task's model with every Linear quantized: no graph break anywhere, and the
    same loss and gradients bit for bit (aot_eager keeps torch's own kernels around the ops)."""
    import torch.nn.functional as F

    import fp4cli
    from fp4cli.tasks.gpt_model import GPT, GPTConfig

    def build():
        torch.manual_seed(0)
        model = GPT(GPTConfig(256, 32, 1, 64, 4)).to(DEVICE)  # one block: every kind of layer
        fp4cli.quantize_model(model, "tetrajet", seed=0, backend="triton")
        return model

    generator = torch.Generator().manual_seed(3)
    inputs, targets = (torch.randint(0, 256, (2, 32), generator=generator).to(DEVICE)
                       for _ in range(2))  # fmt: skip
    eager, compiled = build(), build()
    torch._dynamo.reset()
    for net in (eager, torch.compile(compiled, backend="aot_eager", fullgraph=True)):
        F.cross_entropy(net(inputs).float().reshape(-1, 256), targets.reshape(-1)).backward()
    for got, expected in zip(compiled.parameters(), eager.parameters(), strict=True):
        assert torch.equal(got.grad, expected.grad)


@pytest.mark.parametrize("name", ["tetrajet", "wang-fp4"])
def test_a_compiled_layer_takes_new_token_counts_and_evaluation(name):
    """Token counts that change between calls (torch.compile then traces the ops with symbolic
    sizes) and a no-grad call: every output and gradient the eager layer's."""
    config = COMPILED.get(name) or VECTOR[name]
    eager, layer = seeded_layer(config, "triton"), seeded_layer(config, "triton")
    torch._dynamo.reset()
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
    for tokens in (40, 24, 33):
        x, grad_y = linear_inputs((tokens, 96), seed=tokens)
        got, want = training_passes(compiled, x, grad_y, 1), training_passes(eager, x, grad_y, 1)
        assert_same_passes(got, want)
    with torch.no_grad():
        x = torch.ones(8, 96, device=DEVICE)
        assert torch.equal(compiled(x), eager(x))


@pytest.mark.parametrize("has_bias", [True, False])
def test_the_backward_returns_one_gradient_per_argument(has_bias, monkeypatch):
    """CompiledLinear's backward: x's, W's and the bias's gradients as the backward op returns
    those asked for, then None for each other argument of the forward."""
    from types import SimpleNamespace

    from fp4cli.linear import ops

    grads = [torch.ones(2), torch.ones(3), torch.ones(4)][: 3 if has_bias else 2]
    asked = []
    monkeypatch.setattr(
        ops, "quant_linear_backward", lambda *args: asked.append(args[8]) or list(grads)
    )
    ctx = SimpleNamespace(
        needs_input_grad=(True,) * 11, saved_tensors=(torch.zeros((), dtype=torch.int64),),
        executor="fast", config="", rank=0, needs=(True, True), has_bias=has_bias, shapes=[],
        dtype=torch.float32, targets=(torch.float32,) * 3,
    )  # fmt: skip
    returned = ops.CompiledLinear.backward(ctx, torch.ones(2))
    forward_arguments = len(inspect.signature(ops.CompiledLinear.forward).parameters) - 1
    assert len(returned) == forward_arguments == 11
    assert asked == [[True, True, has_bias]]
    assert returned[:2] == tuple(grads[:2]) and all(g is None for g in returned[3:])
    assert (returned[2] is grads[2]) if has_bias else returned[2] is None
