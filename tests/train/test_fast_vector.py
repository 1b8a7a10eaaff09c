"""The quantized Linear's vector-wise executor (fp4cli/linear/fast_vector.py) against the reference
executor (fp4cli/linear/function.py): outputs and all three gradients bit for bit in float32,
what is kept for the backward pass, which configs it takes, and a training run of wang-fp4
with the same losses."""

import dataclasses

import pytest
import torch

from fp4cli import LinearConfig, QuantSpec, quantize_model
from fp4cli.linear import executor_summary
from fp4cli.linear.fast_vector import vector_gap
from fp4cli.recipes import load_recipe
from fp4cli.store import RunStore
from fp4cli.techniques import DGEConfig, HadamardConfig, OutlierConfig, QEMAConfig
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter
from tests.kernel_cases import DEVICE
from tests.linear_runs import (
    assert_same_gemm_layouts,
    assert_same_passes,
    linear_inputs,
    saved_tensors,
    seeded_layer,
    training_passes,
)

WANG = load_recipe("wang-fp4").linear
DIRECT = load_recipe("wang-direct").linear
CLAMP = OutlierConfig(0.99, compensate=False, method="nearest")
E4M3_ROW = QuantSpec(element="e4m3", block="row")
CONFIGS = {
    "wang-fp4": WANG,
    "wang-direct": DIRECT,
    "dge-only": dataclasses.replace(DIRECT, dge=DGEConfig(k=5, cap=3.0)),
    "clamp-only": dataclasses.replace(DIRECT, outliers=CLAMP),
    "compensated": dataclasses.replace(WANG, outliers=OutlierConfig(0.9, compensate=True)),
    "paper": dataclasses.replace(
        WANG, forward_w=QuantSpec.preset("fp4-row"), dge=DGEConfig(k=3, cap=3.0)
    ),
    "single-quantization": dataclasses.replace(WANG, double_quant=False),
    # per-row / per-column FP8 backward operands, floor scales, a high-precision dY for dW
    "fp8-lines": LinearConfig(
        forward_x=QuantSpec(block="row"),
        forward_w=QuantSpec(block="column"),
        grad_input_dy=E4M3_ROW,
        grad_input_w=QuantSpec(element="e5m2", block="column"),
        grad_weight_x=E4M3_ROW,
        double_quant=True,
        outliers=CLAMP,
    ),
    "forward-only": LinearConfig(forward_x=QuantSpec.preset("fp4-row"), forward_w=E4M3_ROW),
    # MS-AMP's bfloat16 scale arithmetic on both FP4 operands (DGE reads W's scales)
    "bf16-scales": dataclasses.replace(
        WANG,
        forward_x=dataclasses.replace(WANG.forward_x, scale_bf16=True),
        forward_w=dataclasses.replace(WANG.forward_w, scale_bf16=True),
    ),
}


@pytest.mark.parametrize("name", ["wang-fp4", "wang-direct", "fp8-lines"])
def test_gemms_see_the_same_operand_layouts(name):
    """As the fast executor's test: the same shapes and strides for every GEMM operand."""
    assert_same_gemm_layouts(CONFIGS[name], outlier=True)


@pytest.mark.parametrize("name", CONFIGS)
def test_vector_executor_matches_the_reference_bit_for_bit(name):
    vector, reference = seeded_layer(CONFIGS[name], "triton"), seeded_layer(CONFIGS[name], "torch")
    assert vector.executor() == ("vector", "")
    x, grad_y = linear_inputs(outlier=True)
    assert_same_passes(
        training_passes(vector, x, grad_y),
        training_passes(reference, x, grad_y),
        summed_bias=True,
    )


@pytest.mark.parametrize("name", ["wang-fp4", "fp8-lines", "forward-only"])
def test_bias_gradient_is_the_column_sum_of_grad_y(name):
    """On integer gradients every order of summation gives the same float32 sums, so the
    vector executor's bias gradient (summed in the amax pass over dY for wang-fp4's per-tensor
    dY, by torch where no pass reduces an amax over dY) must equal the reference's bit for bit;
    ragged tokens."""
    vector, reference = seeded_layer(CONFIGS[name], "triton"), seeded_layer(CONFIGS[name], "torch")
    x, _ = linear_inputs((3, 41, 96), seed=6, outlier=True)
    grad_y = torch.randint(-64, 65, (3, 41, 70), generator=torch.Generator().manual_seed(6))
    passes = [training_passes(layer, x, grad_y.float().to(x.device), calls=1)[0]
              for layer in (vector, reference)]  # fmt: skip
    assert torch.equal(passes[0][-1], passes[1][-1])
    assert torch.equal(passes[0][-1], grad_y.sum((0, 1)).float().to(x.device))


def test_ragged_shapes_frozen_weights_and_no_bias():
    x, grad_y = linear_inputs((19, 45), 33, seed=2, outlier=True)
    for bias in (True, False):
        vector = seeded_layer(WANG, "triton", 45, 33, bias)
        reference = seeded_layer(WANG, "torch", 45, 33, bias)
        assert_same_passes(
            training_passes(vector, x, grad_y), training_passes(reference, x, grad_y), bias
        )
        for layer in (vector, reference):
            layer.weight.requires_grad_(False)
        assert_same_passes(
            training_passes(vector, x, grad_y), training_passes(reference, x, grad_y), bias
        )
        vector = seeded_layer(WANG, "triton", 45, 33, bias)
        reference = seeded_layer(WANG, "torch", 45, 33, bias)
        x_const = x.detach()
        assert_same_passes(
            training_passes(vector, x_const, grad_y),
            training_passes(reference, x_const, grad_y),
            bias,
        )


def _saved(layer, x):
    return sorted((tuple(t.shape), t.dtype) for t in saved_tensors(layer, x))


def test_x_is_kept_as_fp8_codes():
    """wang-fp4 keeps X's backward operand as one byte a value (and its scale), W's as values,
    and for DGE the weight and its per-column forward scales; never a copy of X."""
    x, _ = linear_inputs(seed=6, outlier=True)
    assert _saved(seeded_layer(WANG, "triton"), x) == sorted(
        [
            ((74, 96), torch.uint8),
            ((1,), torch.float32),
            ((70, 96), torch.float32),  # W's FP8 operand
            ((70, 96), torch.float32),  # the weight, for DGE
            ((96,), torch.float32),  # its forward scales
        ]
    )


def test_which_configs_it_takes_and_why_not():
    assert vector_gap(WANG) is None and vector_gap(DIRECT) is None
    linear = dataclasses.replace(WANG, outliers=OutlierConfig(method="linear"))
    assert vector_gap(linear) == "outlier clamping by the 'linear' method"
    column_x = dataclasses.replace(WANG, forward_x=QuantSpec.preset("fp4-column"))
    assert vector_gap(column_x) == "outlier clamping of a forward_x without one scale per row"
    rht = dataclasses.replace(DIRECT, grad_weight_hadamard=HadamardConfig(32))
    assert vector_gap(rht) == "grad_weight: a Hadamard transform"
    assert vector_gap(dataclasses.replace(DIRECT, qema=QEMAConfig())) == "Q-EMA"
    mxfp4 = dataclasses.replace(DIRECT, grad_input_dy=QuantSpec.preset("mxfp4"))
    assert vector_gap(mxfp4) == (
        "grad_input_dy: block 32 (vector-wise kernels: row, column, tensor)"
    )
    layer = seeded_layer(linear, "triton")
    assert layer.executor() == (
        "reference", "DGE; vector-wise: outlier clamping by the 'linear' method"
    )  # fmt: skip
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)).to(DEVICE)
    quantize_model(model, "wang-fp4", seed=0, skip=(), backend="triton")
    assert executor_summary(model) == "quantized layers: 2 on the vector-wise executor"


def test_statistics_steps_take_the_reference():
    vector, reference = seeded_layer(WANG, "triton"), seeded_layer(WANG, "torch")
    vector.stats, reference.stats = {}, {}
    x, grad_y = linear_inputs(seed=5, outlier=True)
    assert_same_passes(
        training_passes(vector, x, grad_y, calls=1), training_passes(reference, x, grad_y, calls=1)
    )
    assert vector.stats.keys() == reference.stats.keys() and len(vector.stats) > 0


def test_gpt_training_run_gives_the_reference_losses(tmp_path):
    """wang-fp4 on the gpt task at debug size: the vector-wise executor (backend triton) and the
    reference (backend torch) log the same losses."""
    losses = {}
    for backend in ("triton", "torch"):
        store = RunStore(tmp_path / f"{backend}.db")
        config = {"task": "gpt", "recipe": "wang-fp4", "size": "debug", "device": "cpu",
                  "log_every": 1, "steps": 3, "batch_size": 2, "backend": backend}  # fmt: skip
        result, _ = run_training(config, [], store, reporter=SilentReporter())
        assert result.status == "finished"
        losses[backend] = [m["value"] for m in store.metrics(result.run_id, "train_loss")]
    assert len(losses["torch"]) == 3 and losses["triton"] == losses["torch"]
