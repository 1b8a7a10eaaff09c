"""The quantized Linear's fast executor (fp4cli/linear/fast.py) against the reference executor
(fp4cli/linear/function.py): the same outputs and gradients bit for bit, what is saved for the
backward pass, and which layers take which executor."""

import dataclasses

import pytest
import torch

from fp4cli import LinearConfig, QuantLinear, QuantSpec, quantize_model
from fp4cli.linear.fast import fast_gap
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays
from fp4cli.techniques import DGEConfig, HadamardConfig
from tests.kernel_cases import DEVICE
from tests.kernel_checks import assert_bits
from tests.linear_runs import (
    assert_same_gemm_layouts,
    assert_same_passes,
    linear_inputs,
    saved_tensors,
    seeded_layer,
    training_passes,
)

CEIL = QuantSpec.preset("mxfp4-ceil")
CEIL_SR = CEIL.replace(rounding="sr")
NVFP4_2D = QuantSpec.preset("nvfp4-2d")
CONFIGS = {
    "mxfp4": load_recipe("mxfp4").linear,
    "tetrajet": load_recipe("tetrajet").linear,
    "tetrajet-qema": load_recipe("tetrajet-qema").linear,
    "nvfp4-4over6": load_recipe("nvfp4-4over6").linear,  # four-over-six, 2-D weight tiles too
    "tseng-rht-sr": load_recipe("tseng-rht-sr").linear,
    "tseng-baseline": load_recipe("tseng-baseline").linear,  # BF16 forward, ties away
    # RHT-256 and -128 do not fit one tile: each direction runs on its own
    "wide-rht": LinearConfig(
        forward_x=CEIL,
        forward_w=CEIL,
        grad_input_dy=CEIL_SR,
        grad_input_w=CEIL_SR,
        grad_weight_dy=CEIL_SR,
        grad_weight_x=CEIL_SR,
        grad_input_hadamard=HadamardConfig(256),
        grad_weight_hadamard=HadamardConfig(128),
    ),
    "double-quant-rht": LinearConfig(
        forward_x=CEIL,
        forward_w=CEIL,
        grad_weight_dy=CEIL_SR,
        grad_weight_x=CEIL_SR,
        grad_weight_hadamard=HadamardConfig(32),
        double_quant=True,
    ),
    "forward-only-ue5m3": LinearConfig(
        forward_x=QuantSpec(scale="ue5m3", block=16), forward_w=QuantSpec(scale="ue5m3", block=16)
    ),
    # two-level scales: 2-D weight tiles, RHT-16 on grad_weight's operands, X saved packed
    "nvfp4": load_recipe("nvfp4").linear,
    "ue5m3-hadamard-sr": load_recipe("ue5m3-hadamard-sr").linear,
    # nvfp4 and nvidia-nvfp4 rotate by fixed signs (TransformerEngine's): random ones too;
    # and none (a deterministic transform)
    "nvfp4-random-signs": dataclasses.replace(
        load_recipe("nvfp4").linear, grad_weight_hadamard=HadamardConfig(16)
    ),
    "nvidia-nvfp4": load_recipe("nvidia-nvfp4").linear,
    "mxfp4-dht": load_recipe("mxfp4-dht").linear,
    "ufp4": load_recipe("ufp4").linear,  # E1M2 elements
    # an FP32 scale per 128 values (found in the pair kernel's 128 x 128 tiles), SR + RHT-16
    # backward, double quantization into the outer-block spec, X saved with its outer amaxes
    "tetrajet-v2": load_recipe("tetrajet-v2").linear,
    # MS-EDEN with RHT-128 on the backward GEMMs, double quantization into its tensor-scaled
    # spec (the column direction in a launch of its own); plain NVFP4 forward, or four-over-six
    "quartet2": load_recipe("quartet2").linear,
    "quartet2-4over6": load_recipe("quartet2-4over6").linear,
    # four-over-six on the gradients too, SR after the 16/17 pre-scale
    "nvfp4-4over6-all": load_recipe("nvfp4-4over6-all").linear,
    "nvfp4-ceil-sr-weights": LinearConfig(
        forward_x=QuantSpec.preset("nvfp4", scale_rule="ceil"),
        forward_w=NVFP4_2D.replace(scale_rule="ceil"),
        grad_input_dy=QuantSpec.preset("nvfp4", rounding="sr"),
        grad_input_w=NVFP4_2D.replace(rounding="sr"),
        grad_weight_dy=QuantSpec.preset("nvfp4", rounding="sr"),
        grad_weight_x=QuantSpec.preset("nvfp4"),
    ),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_fast_executor_matches_the_reference_bit_for_bit(name):
    fast, reference = seeded_layer(CONFIGS[name], "triton"), seeded_layer(CONFIGS[name], "torch")
    assert fast.executor() == ("fast", "")
    x, grad_y = linear_inputs()
    assert_same_passes(
        training_passes(fast, x, grad_y), training_passes(reference, x, grad_y), summed_bias=True
    )


@pytest.mark.parametrize(
    "name",
    [
        "tetrajet", "tseng-rht-sr", "nvfp4", "nvidia-nvfp4", "ufp4", "tetrajet-v2", "quartet2",
        "quartet2-4over6", "nvfp4-4over6-all",
    ],
)  # fmt: skip
def test_ragged_tokens_and_features(name):
    fast = seeded_layer(CONFIGS[name], "triton", in_features=45, out_features=33)
    reference = seeded_layer(CONFIGS[name], "torch", in_features=45, out_features=33)
    x, grad_y = linear_inputs((19, 45), 33, seed=2)
    assert_same_passes(
        training_passes(fast, x, grad_y), training_passes(reference, x, grad_y), summed_bias=True
    )


@pytest.mark.parametrize("shape", [(2, 37, 96), (37, 96), (96,)])
@pytest.mark.parametrize("executor", ["fast", "vector"])
def test_an_output_of_any_shape_changes_in_place_as_nn_linears(executor, shape):
    """A kernel executor's output, whatever x's leading dimensions, may be changed in place
    (ReLU(inplace=True)), as nn.Linear's, with the reference executor's gradients: the layer
    must not return a view made inside its autograd Function, which autograd refuses."""
    config = CONFIGS["tetrajet"] if executor == "fast" else load_recipe("wang-fp4").linear
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    assert fast.executor()[0] == executor
    x, grad_y = linear_inputs(shape)
    results = []
    for layer in (fast, reference):
        x_in = x.detach().clone().requires_grad_()
        y = layer(x_in).relu_()
        y.backward(grad_y.view(y.shape))
        results.append((y.shape, y.detach(), x_in.grad, layer.weight.grad))
    assert results[0][0] == (*shape[:-1], 70)
    for got, expected in zip(results[0][1:], results[1][1:], strict=True):
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "name", ["mxfp4", "nvfp4", "tseng-rht-sr", "ue5m3-hadamard-sr", "tetrajet-v2", "quartet2"]
)
def test_gemms_see_the_same_operand_layouts(name):
    """cuBLAS chooses its kernel by the operands' strides, so the executors give float32 GEMMs
    the same bits only if each GEMM gets operands of the same shapes and strides."""
    assert_same_gemm_layouts(CONFIGS[name])


@pytest.mark.parametrize("name", ["mxfp4", "nvfp4", "wide-rht"])
def test_bias_gradient_is_the_column_sum_of_grad_y(name):
    """On integer gradients every order of summation gives the same float32 sums, so the fast
    executor's bias gradient (summed in the quantize kernel's read of dY, or by torch where the
    directions take two launches) must equal the reference's bit for bit; ragged tokens."""
    fast, reference = seeded_layer(CONFIGS[name], "triton"), seeded_layer(CONFIGS[name], "torch")
    x, _ = linear_inputs((3, 41, 96), seed=6)
    grad_y = torch.randint(-64, 65, (3, 41, 70), generator=torch.Generator().manual_seed(6))
    passes = [training_passes(layer, x, grad_y.float().to(x.device), calls=1)[0]
              for layer in (fast, reference)]  # fmt: skip
    assert_bits(passes[0][-1], passes[1][-1], "bias gradient")
    assert_bits(passes[0][-1], grad_y.sum((0, 1)).float().to(x.device), "bias gradient")


def test_frozen_weight_input_without_grad_and_no_bias():
    config = CONFIGS["tetrajet"]
    x, grad_y = linear_inputs(seed=3)
    for bias in (True, False):
        fast, reference = (
            seeded_layer(config, "triton", bias=bias),
            seeded_layer(config, "torch", bias=bias),
        )
        for layer in (fast, reference):
            layer.weight.requires_grad_(False)
        assert_same_passes(
            training_passes(fast, x, grad_y),
            training_passes(reference, x, grad_y),
            summed_bias=bias,
        )
        fast, reference = (
            seeded_layer(config, "triton", bias=bias),
            seeded_layer(config, "torch", bias=bias),
        )
        x_const = x.detach()
        assert_same_passes(
            training_passes(fast, x_const, grad_y),
            training_passes(reference, x_const, grad_y),
            summed_bias=bias,
        )


@pytest.mark.parametrize(
    "name", ["mxfp4", "tetrajet", "tetrajet-qema", "wide-rht", "tseng-baseline"]
)
def test_autocast_rounds_float32_inputs_in_the_kernels(name):
    """Under bfloat16 autocast the fast executor reads the float32 input and weight and rounds
    them to bfloat16 in the pair kernel instead of casting them first: the reference's bits
    (its operands cast by autocast's rules) in every output and gradient, ties included. A
    tensor with an operand the kernels do not take (tseng-baseline's BF16 forward) is cast."""
    import fp4cli.kernels.quantization.launch_pair as launch_pair

    fast, reference = seeded_layer(CONFIGS[name], "triton"), seeded_layer(CONFIGS[name], "torch")
    x, grad_y = linear_inputs(seed=7)
    with torch.no_grad():  # bfloat16 ties (to even, both ways) in the input and the weight
        x.view(-1, 96)[3, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-134])
        for layer in (fast, reference):
            layer.weight[5, :2] = torch.tensor([0.5 + 2**-9, -(0.5 + 3 * 2**-9)])
    reads, real_pair = [], launch_pair.quantize_pair

    def recording_pair(tensor, *args, **kwargs):
        reads.append((tensor.dtype, kwargs.get("read_as", args[6] if len(args) > 6 else None)))
        return real_pair(tensor, *args, **kwargs)

    def passes(layer):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            return training_passes(layer, x, grad_y)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch_pair, "quantize_pair", recording_pair)
        assert_same_passes(passes(fast), passes(reference), summed_bias=True)
    rounded = (torch.float32, torch.bfloat16)
    if name == "tseng-baseline":  # X and W cast for the BF16 forward; dY is bfloat16
        assert rounded not in reads and {dtype for dtype, _ in reads} == {torch.bfloat16}
    else:  # X and W of each pass rounded as read, dY (bfloat16) read as it is
        assert reads.count(rounded) == 4
        assert {read for read in reads if read != rounded} == {(torch.bfloat16, None)}


@pytest.mark.parametrize(
    "name", ["nvfp4", "nvfp4-4over6", "ue5m3-hadamard-sr", "quartet2", "quartet2-4over6"]
)
def test_two_level_recipes_round_float32_inputs_in_their_amax_passes_too(name):
    """A two-level spec's tensor amax pass reads the float32 input and weight rounded to
    bfloat16 as the quantize launch does: every output and gradient is the one the executor
    gives when it casts them first (the kernels' cast refused), bit for bit, ties included;
    the rounding replaces the cast of X and W each pass (quartet2's too, whose double
    quantization into a tensor-scaled spec takes two launches: the first rounds as it reads)."""
    import fp4cli.kernels.quantization.launch_pair as launch_pair

    x, grad_y = linear_inputs(seed=7)
    with torch.no_grad():
        x.view(-1, 96)[3, :4] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-134])
    reads, real_pair = [], launch_pair.quantize_pair

    def recording_pair(tensor, *args, **kwargs):
        reads.append((tensor.dtype, kwargs.get("read_as", args[6] if len(args) > 6 else None)))
        return real_pair(tensor, *args, **kwargs)

    def passes():
        layer = seeded_layer(CONFIGS[name], "triton")
        with torch.no_grad():
            layer.weight[5, :2] = torch.tensor([0.5 + 2**-9, -(0.5 + 3 * 2**-9)])
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            return training_passes(layer, x, grad_y, calls=1)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch_pair, "quantize_pair", recording_pair)
        rounded = passes()
        rounded_reads, reads[:] = list(reads), []
        patch.setattr(launch_pair, "rounds_as_read", lambda *_: False)
        assert_same_passes(rounded, passes())
    assert rounded_reads.count((torch.float32, torch.bfloat16)) == 2  # X and W
    assert (torch.float32, torch.bfloat16) not in reads


@pytest.mark.parametrize("name", ["mxfp4", "tetrajet", "wang-direct"])
def test_autocast_gradients_leave_the_layer_in_float32_from_one_launch(name):
    """Under bf16 autocast the fast (and the vector-wise) backward returns the float32 input's,
    weight's and bias's gradients itself, widened and rounded in one `widen_gradients` launch
    (no cast by autograd, no reduction of the bias's partial sums), with the reference's bits:
    the bias rounded through bfloat16 exactly as autocast's cast rounds it (integer sums, where
    every summation order agrees)."""
    import fp4cli.kernels.elementwise.gradients as gradients

    config = load_recipe(name).linear
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    executor = "vector" if name == "wang-direct" else "fast"
    assert fast.executor(torch.zeros(1, 96, device=DEVICE))[0] == executor
    x, _ = linear_inputs(seed=8)
    grad_y = torch.randint(-300, 300, (2, 37, 70), generator=torch.Generator().manual_seed(9))
    grad_y = grad_y.to(DEVICE, torch.float32) + 2.0**-7  # bias sums past bfloat16's precision
    launches, real = [], gradients.widen_gradients

    def recording(grads, sums=None, round_sums=True):
        launches.append(([g is not None for g in grads], sums is not None, round_sums))
        return real(grads, sums, round_sums)

    def passes(layer):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16):
            return training_passes(layer, x, grad_y.to(torch.bfloat16), calls=1)

    with pytest.MonkeyPatch.context() as patch, replays(False):  # the Python calls
        patch.setattr(gradients, "widen_gradients", recording)
        got = passes(fast)
    assert launches == [([True, True], True, True)]
    assert all(g.dtype == torch.float32 for g in got[0][1:])
    assert_same_passes(got, passes(reference))


@pytest.mark.parametrize("start", ["weight", "layer_init"])
def test_qema_update_runs_as_one_kernel_with_the_references_bits(start):
    """Q-EMA's average (`kernels/elementwise/qema.py` where the layer's quantizers are kernels)
    follows the reference's update bit for bit over several steps, the first one a copy (start
    "weight") or a blend with nn.Linear's initialization drawn from the layer's seed
    ("layer_init")."""
    base = CONFIGS["tetrajet-qema"]
    assert base.qema is not None
    config = dataclasses.replace(base, qema=dataclasses.replace(base.qema, start=start))
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    assert_bits(fast.weight_ema, reference.weight_ema, "the starting average")
    assert fast._ema_in_one_pass() and not reference._ema_in_one_pass()
    generator = torch.Generator().manual_seed(9)
    for _ in range(4):
        step = torch.randn(fast.weight.shape, generator=generator).to(DEVICE) * 1e-2
        for layer in (fast, reference):
            with torch.no_grad():
                layer.weight.add_(step)
            layer.update_ema()
        assert_bits(fast.weight_ema, reference.weight_ema, "weight average")
    assert int(fast.ema_updates) == int(reference.ema_updates) == 4


@pytest.mark.parametrize("autocast", [False, True])
def test_qema_guides_from_its_average_after_warm_up(autocast):
    """tetrajet-qema past warm-up (the average guiding W's rounding): the fast executor forms
    the guide in the pair kernel from the average and W as read (no pass writing it) and
    gives the reference's bits, in float32 and under bf16 autocast."""
    from fp4cli.techniques.qema import AverageGuide

    config = CONFIGS["tetrajet-qema"]
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    generator = torch.Generator().manual_seed(10)
    drift = torch.randn(fast.weight.shape, generator=generator).to(DEVICE) * 0.05
    with torch.no_grad():
        for layer in (fast, reference):
            layer.weight_ema.add_(drift * layer.weight.abs())
            layer.ema_updates.fill_(config.qema.warmup)
    x, grad_y = linear_inputs(seed=11)
    formed, real_values = [], AverageGuide.values

    def counting_values(self, weight):
        formed.append(weight.shape)
        return real_values(self, weight)

    def passes(layer):
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=autocast):
            return training_passes(layer, x, grad_y)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AverageGuide, "values", counting_values)
        got = passes(fast)
        assert formed == []  # formed in the kernel
        assert_same_passes(got, passes(reference), summed_bias=True)
    plain = seeded_layer(config, "triton")  # the same layer before warm-up
    assert not torch.equal(training_passes(plain, x, grad_y)[0][0], got[0][0])


def test_rank_offsets_match_the_reference():
    config = CONFIGS["tetrajet"]
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    fast.rank = reference.rank = 3
    x, grad_y = linear_inputs(seed=4)
    assert_same_passes(
        training_passes(fast, x, grad_y, calls=1),
        training_passes(reference, x, grad_y, calls=1),
        summed_bias=True,
    )


def test_statistics_steps_take_the_reference_and_agree():
    config = CONFIGS["tetrajet"]
    fast, reference = seeded_layer(config, "triton"), seeded_layer(config, "torch")
    fast.stats, reference.stats = {}, {}
    x, grad_y = linear_inputs(seed=5)
    assert_same_passes(
        training_passes(fast, x, grad_y, calls=1),
        training_passes(reference, x, grad_y, calls=1),
        summed_bias=True,
    )
    assert fast.stats.keys() == reference.stats.keys() and len(fast.stats) > 0


@pytest.mark.parametrize("name", ["mxfp4", "tetrajet"])
def test_backward_operands_are_saved_packed(name):
    """X is kept as 4-bit codes and scale codes, not as a copy in its own dtype."""
    x, _ = linear_inputs(seed=6)
    saved = saved_tensors(seeded_layer(CONFIGS[name], "triton"), x)
    # (in, tokens / 2) codes and (in, tokens / 32) scales for X (74 tokens padded to 96), W's
    # grad_input operand (out, in) in the compute dtype, and the call's seed
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [
            ((96, 3), torch.uint8),
            ((96, 48), torch.uint8),
            ((70, 96), torch.float32),
            ((), torch.int64),
        ]
    )
    reference_saved = saved_tensors(seeded_layer(CONFIGS[name], "torch"), x)
    assert any(t.is_floating_point() and t.numel() == x.numel() for t in reference_saved)


def test_executor_choice_and_reasons():
    assert fast_gap(CONFIGS["tetrajet"]) is None
    assert fast_gap(load_recipe("nvfp4").linear) is None
    assert fast_gap(load_recipe("ue5m3-hadamard-sr").linear) is None
    assert fast_gap(load_recipe("tseng-baseline").linear) is None
    ties_up = LinearConfig(grad_input_dy=QuantSpec.preset("nvfp4", rounding="ties_up"))
    assert fast_gap(ties_up) == "grad_input_dy: rounding 'ties_up' (kernels: rne, sr, away, eden)"
    square_with_rht = LinearConfig(forward_w=NVFP4_2D, forward_hadamard=HadamardConfig(16))
    assert fast_gap(square_with_rht) == "forward_w: 2-D tiles with a Hadamard transform"
    doubled = LinearConfig(
        forward_x=CEIL, grad_weight_x=QuantSpec.preset("nvfp4"), double_quant=True
    )
    assert fast_gap(doubled) is None  # its column direction takes a launch of its own
    odd_group = LinearConfig(grad_input_dy=QuantSpec.preset("nvfp4-eden", eden_group=48))
    assert fast_gap(odd_group) == "grad_input_dy: eden_group 48 (kernels: a power of two)"
    assert fast_gap(LinearConfig(forward_w=CEIL, dge=DGEConfig())) == "DGE"
    assert seeded_layer(CONFIGS["tetrajet"], "torch").executor() == ("reference", "backend torch")
    cpu = QuantLinear(32, 32, config=CONFIGS["tetrajet"], backend="auto")
    assert cpu.executor(torch.zeros(1, 32)) == ("reference", "a cpu tensor")


def test_executor_summary_names_the_reference_and_why():
    from fp4cli.linear import executor_summary

    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)).to(DEVICE)
    quantize_model(model, "tetrajet", seed=0, backend="triton")
    assert executor_summary(model) == "quantized layers: 2 on the fast executor"
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 8)).to(DEVICE)
    quantize_model(model, "tseng-baseline", seed=0, skip=(), backend="triton")
    assert executor_summary(model) == "quantized layers: 2 on the fast executor"
    model = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(DEVICE)
    quantize_model(model, "wang-fp4", seed=0, skip=(), backend="triton")
    assert executor_summary(model) == "quantized layers: 1 on the vector-wise executor"
    model = torch.nn.Sequential(torch.nn.Linear(32, 32)).to(DEVICE)
    quantize_model(model, LinearConfig(forward_w=CEIL, dge=DGEConfig()), seed=0)
    assert executor_summary(model) == (
        "quantized layers: 1 on the reference (DGE; vector-wise: forward_w: block 32 "
        "(vector-wise kernels: row, column, tensor))"
    )


def test_nvfp4_saves_x_packed_with_its_tensor_amax():
    """NVFP4's X operand for grad_weight: codes, one E4M3 scale per 16 tokens (after RHT-16)
    and the tensor amax its decoding needs."""
    x, _ = linear_inputs(seed=6)
    saved = saved_tensors(seeded_layer(CONFIGS["nvfp4"], "triton"), x)
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [
            ((96, 40), torch.uint8),  # 74 tokens padded to 80 by the RHT-16
            ((96, 5), torch.uint8),
            ((1,), torch.float32),
            ((70, 96), torch.float32),
            ((), torch.int64),  # the call's seed
        ]
    )


def test_outer_blocks_across_tiles_and_ragged_ends():
    """TetraJet-v2's FP32 scale per 128 values: several outer blocks along every direction
    (tokens, in and out features past 128, none a multiple of it), each found in its tile."""
    fast = seeded_layer(CONFIGS["tetrajet-v2"], "triton", in_features=260, out_features=136)
    reference = seeded_layer(CONFIGS["tetrajet-v2"], "torch", in_features=260, out_features=136)
    x, grad_y = linear_inputs((1, 140, 260), 136, seed=7)
    assert_same_passes(
        training_passes(fast, x, grad_y, calls=1),
        training_passes(reference, x, grad_y, calls=1),
        summed_bias=True,
    )


def test_tetrajet_v2_saves_x_packed_with_an_amax_per_outer_block():
    """X's grad_weight operand: codes and E4M3 scales per 16 tokens (after RHT-16), and one
    float32 amax per 128 tokens of each feature; nothing of X in 16 bits."""
    x, _ = linear_inputs(seed=6)
    saved = saved_tensors(seeded_layer(CONFIGS["tetrajet-v2"], "triton"), x)
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [
            ((96, 40), torch.uint8),  # 74 tokens padded to 80 by the RHT-16
            ((96, 5), torch.uint8),
            ((96, 1), torch.float32),  # one outer block of 128 tokens
            ((80, 96), torch.float32),  # W's grad_input operand: 70 outputs padded by RHT-16
            ((), torch.int64),  # the call's seed
        ]
    )
