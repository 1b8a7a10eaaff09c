"""OutControl (fp4cli.techniques.out_control, TetraJet-v2's mixed NVFP4 + MXFP8 Linear): the
channel count and schedule, the selection by summed norms, the split GEMMs on hand-checked
values, QuantLinear forward and backward, checkpoints, OsciReset on the FP4 channels, the
quantizer kernels, torch.compile, the CUDA-graph guard, the recipes and their one-line errors.
Training runs: test_out_control_train.py."""

import dataclasses

import pytest
import torch

import fp4cli
from fp4cli import LinearConfig, QuantLinear, QuantSpec
from fp4cli.linear.fast import fast_gap
from fp4cli.linear.function import QuantLinearFunction
from fp4cli.quant import fake_quantize
from fp4cli.quant.backend import interpreter_on, triton_available
from fp4cli.recipe_schema import OsciResetConfig, Recipe, RecipeError
from fp4cli.recipes import apply_overrides, load_recipe
from fp4cli.techniques import OutControlConfig
from fp4cli.techniques.osci_reset import OsciReset
from fp4cli.techniques.out_control import (
    MXFP8,
    channel_order,
    fp8_channel_count,
    phase,
    split_channels,
)

MXFP4 = QuantSpec.preset("mxfp4")


@pytest.mark.parametrize(
    ("in_features", "ratio", "multiple", "count"),
    [
        (768, 0.1, 128, 128),  # int(76.8) = 76, rounded up to 128 (the 150M model's d_model)
        (3072, 0.1, 128, 384),  # 307 -> 384
        (1536, 0.1, 128, 256),
        (64, 0.1, 128, 0),  # at most 64 rounded down to a multiple of 128: no FP8 channel
        (128, 0.1, 128, 128),  # every channel (the code stops on it)
        (64, 0.1, 16, 16),
        (64, 0.1, 1, 6),  # int(6.4)
        (256, 1, 128, 256),  # ratio 1: every channel
        (200, 1, 128, 128),
    ],
)
def test_the_fp8_channel_count_is_the_codes(in_features, ratio, multiple, count):
    config = OutControlConfig(ratio=ratio, multiple=multiple)
    assert fp8_channel_count(in_features, config) == count


def test_the_schedule_records_the_steps_after_record_start_then_splits():
    config = OutControlConfig(record_start=2, record_steps=3)  # steps 3, 4, 5 recorded
    phases = [phase(done, config) for done in range(8)]  # after 0..7 optimizer steps
    assert phases == ["before"] * 3 + ["recording"] * 3 + ["split"] * 2
    assert config.select_after == 5


def test_channels_are_ordered_by_their_summed_norms_largest_first():
    assert channel_order(torch.tensor([1.0, 3.0, 3.0, 2.0])).tolist() == [1, 2, 3, 0]  # stable
    fp8, fp4 = split_channels(torch.tensor([1, 2, 3, 0]), 1)
    assert fp8.tolist() == [1] and fp4.tolist() == [2, 3, 0]


def _layer(in_features=16, record_start=0, record_steps=2, **linear) -> QuantLinear:
    out_control = OutControlConfig(ratio=0.25, multiple=4, record_start=record_start,
                                   record_steps=record_steps)  # fmt: skip
    config = LinearConfig(forward_x=MXFP4, forward_w=MXFP4, out_control=out_control, **linear)
    return QuantLinear(in_features, 3, config=config, seed=0, backend="torch")


def _step(layer, optimizer, x):
    layer(x).square().sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_the_selection_sums_each_channels_norm_over_the_recorded_steps():
    """Channel j holds 7j mod 16 in every one of 4 tokens (norm 2 * value) at the recorded
    steps 1 and 2 (record_start 0): the largest values 15, 14, 13, 12 are channels 9, 2, 11,
    4, the 4 FP8 channels (int(16 * 0.25) = 4, a multiple of 4)."""
    layer = _layer()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)
    fp4cli.attach_qema(layer, optimizer)
    values = torch.tensor([(7 * j) % 16 for j in range(16)], dtype=torch.float32)
    _step(layer, optimizer, torch.full((4, 16), 100.0))  # step 0: not recorded
    assert layer.channel_norms.abs().sum() == 0 and layer.out_control_channels() is None
    _step(layer, optimizer, values.expand(4, 16))
    layer.eval()
    layer(torch.full((4, 16), 100.0))  # an evaluation call: not recorded
    layer.train()
    _step(layer, optimizer, -values.expand(4, 16))
    assert torch.equal(layer.channel_norms, 4 * values)
    channels = layer.out_control_channels()
    assert channels is not None
    assert channels[0].tolist() == [9, 2, 11, 4]
    expected = sorted(range(16), key=lambda j: -values[j].item())
    assert torch.cat(channels).tolist() == expected
    _step(layer, optimizer, torch.full((4, 16), 100.0))  # fixed from now on
    assert torch.cat(layer.out_control_channels()).tolist() == expected  # type: ignore[arg-type]


# Hand case: 2 tokens, 4 channels, channel 2 in FP8. FP4 (MXFP4, scale 2^(floor(log2 amax) - 2)):
# token 0's channels 0, 1, 3 (amax 6, scale 1): 6, 2.4 -> 2, 1; token 1's (amax 3, scale 1/2):
# -3, 0.5, 0.26 -> 0.25; the weight's (amax 1, scale 1/4): 1, 0.5, -1 exactly. FP8 (E4M3, scale
# 2^ceil(log2(amax / 448))): 1.3 alone in its block -> 1.3 * 256 = 332.8 -> 320 -> 1.25; 6 -> 6.
X = torch.tensor([[6.0, 2.4, 1.3, 1.0], [-3.0, 0.5, 6.0, 0.26]])
W = torch.tensor([[1.0, 0.5, 1.3, -1.0]])
CHANNELS = (torch.tensor([2]), torch.tensor([3, 0, 1]))


def _apply(config, x=X, w=W, channels=CHANNELS):
    seed = torch.tensor(0)
    return QuantLinearFunction.apply(x, w, None, config, seed, None, None, "torch", 0, channels)


def _config(fmt=MXFP8, **fields):
    out_control = OutControlConfig(multiple=1, format=fmt)
    return LinearConfig(forward_x=MXFP4, forward_w=MXFP4, out_control=out_control, **fields)


def test_the_split_forward_is_fp4_on_the_fp4_channels_plus_fp8_on_the_others():
    y = _apply(_config())
    # 6 * 1 + 2 * 0.5 + 1 * -1 + 1.25 * 1.25;  -3 * 1 + 0.5 * 0.5 + 0.25 * -1 + 6 * 1.25
    assert y.tolist() == [[7.5625], [4.5]]
    # unsplit, 1.3 in FP4: token 0's -> 1.5; W's (scale 1/4: 5.2 -> 6) -> 1.5; token 1's
    # block has amax 6 (scale 1): 0.26 -> 0.5
    unsplit = _apply(_config(), channels=None)
    assert unsplit.tolist() == [[6 + 1 + 1.5 * 1.5 - 1], [-3 + 0.25 + 6 * 1.5 - 0.5]]


def test_with_a_high_precision_format_the_chosen_channels_are_exact():
    y = _apply(_config(fmt=None))
    assert torch.allclose(y, torch.tensor([[6 + 1 - 1 + 1.3 * 1.3], [-3 + 0.25 - 0.25 + 6 * 1.3]]))


def test_the_split_backward_on_hand_values():
    """grad_input: dY times the forward's mixed weight (double quantization); grad_weight:
    the FP4 channels' columns by grad_weight's quantizers along the tokens (MXFP4: exact on
    these values), the FP8 channel's by the format, from the forward's mixed X."""
    config = _config(grad_weight_dy=MXFP4, grad_weight_x=MXFP4, double_quant=True)
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    y = _apply(config, x, w)
    y.backward(torch.tensor([[1.0], [2.0]]))
    w_mixed = torch.tensor([1.0, 0.5, 1.25, -1.0])
    assert torch.equal(x.grad, torch.stack([w_mixed, 2 * w_mixed]))
    # X's mixed columns: [6, -3], [2, 0.5], [1.25, 6], [1, 0.25]; dW = 1 * row 0 + 2 * row 1
    assert w.grad.tolist() == [[0.0, 3.0, 1.25 + 12.0, 1.5]]


def test_the_fp8_columns_of_dw_are_the_formats_product_along_the_tokens():
    """Without double quantization dW's FP8 columns are F(dY)^T F(X_8), both quantized along
    the tokens from the high-precision tensors; the FP4 columns (grad_weight in high
    precision here) dY^T X_4."""
    torch.manual_seed(0)
    x, w, dy = torch.randn(40, 8), torch.randn(5, 8), torch.randn(40, 5)
    fp8, fp4 = [6, 1], [0, 2, 3, 4, 5, 7]
    x.requires_grad_(), w.requires_grad_()
    _apply(_config(), x, w, (torch.tensor(fp8), torch.tensor(fp4))).backward(dy)
    dy_8 = fake_quantize(dy, MXFP8, axis=0)
    x_8 = fake_quantize(x.detach()[:, fp8], MXFP8, axis=0)
    assert torch.equal(w.grad[:, fp8], dy_8.t() @ x_8)
    assert torch.equal(w.grad[:, fp4], dy.t() @ x.detach()[:, fp4])


def test_the_layer_computes_as_without_out_control_until_the_channels_are_chosen():
    split = _layer(in_features=32, record_start=1, record_steps=1)
    plain = QuantLinear(32, 3, config=dataclasses.replace(split.config, out_control=None),
                        seed=0, backend="torch")  # fmt: skip
    plain.load_state_dict(split.state_dict(), strict=False)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.01) for m in (split, plain)]
    for layer, optimizer in zip((split, plain), optimizers, strict=True):
        fp4cli.attach_qema(layer, optimizer)
    torch.manual_seed(1)
    for step in range(4):  # chosen after step 2
        x = torch.randn(6, 32)
        x[:, 5] *= 20  # the loudest channel
        outputs = [layer(x) for layer in (split, plain)]
        if step < 3:
            assert torch.equal(outputs[0], outputs[1])
        else:
            assert not torch.equal(outputs[0], outputs[1])
        for output, optimizer in zip(outputs, optimizers, strict=True):
            output.square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    channels = split.out_control_channels()
    assert channels is not None and channels[0][0] == 5 and len(channels[0]) == 8


def test_a_split_layer_matches_the_mixed_product_forward_and_backward():
    layer = _layer(in_features=32, record_start=0, record_steps=1)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.0)
    fp4cli.attach_qema(layer, optimizer)
    torch.manual_seed(2)
    for _ in range(2):
        _step(layer, optimizer, torch.randn(6, 32))
    channels = layer.out_control_channels()
    assert channels is not None
    fp8, fp4 = channels
    x = torch.randn(6, 32, requires_grad=True)
    y = layer(x)
    w = layer.weight.detach()
    x_q = torch.empty_like(x)
    x_q[:, fp4] = fake_quantize(x.detach()[:, fp4], MXFP4, axis=1)
    x_q[:, fp8] = fake_quantize(x.detach()[:, fp8], MXFP8, axis=1)
    w_q = layer.quantized_weight()
    assert torch.equal(w_q[:, fp4], fake_quantize(w[:, fp4], MXFP4, axis=1))
    assert torch.equal(w_q[:, fp8], fake_quantize(w[:, fp8], MXFP8, axis=1))
    assert torch.allclose(y, x_q @ w_q.t() + layer.bias, atol=1e-6)
    y.sum().backward()
    assert x.grad is not None and torch.allclose(x.grad, torch.ones(6, 3) @ w)  # dY in HP
    assert layer.weight.grad is not None and torch.isfinite(layer.weight.grad).all()


def test_a_checkpoint_keeps_the_selection_and_the_sums_being_recorded():
    """Interrupted after step 2 of steps 1-4 recorded (record_start 0, record_steps 4): the
    loaded layer records the rest and chooses as the uninterrupted one does."""
    batches = [torch.randn(6, 16, generator=torch.Generator().manual_seed(i)) for i in range(7)]

    def train(layer, optimizer, steps):
        for x in steps:
            _step(layer, optimizer, x)

    torch.manual_seed(0)  # the same initial weights
    whole = _layer(record_steps=4)
    whole_opt = torch.optim.AdamW(whole.parameters(), lr=0.01)
    fp4cli.attach_qema(whole, whole_opt)
    train(whole, whole_opt, batches)

    torch.manual_seed(0)
    first = _layer(record_steps=4)
    first_opt = torch.optim.AdamW(first.parameters(), lr=0.01)
    fp4cli.attach_qema(first, first_opt)
    train(first, first_opt, batches[:3])
    assert first.channel_norms.abs().sum() > 0 and first.out_control_channels() is None
    state = {"model": first.state_dict(), "optimizer": first_opt.state_dict()}
    assert {"out_control_steps", "channel_norms", "channel_order"} <= set(state["model"])

    resumed = _layer(record_steps=4)
    resumed_opt = torch.optim.AdamW(resumed.parameters(), lr=0.01)
    fp4cli.attach_qema(resumed, resumed_opt)
    resumed.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optimizer"])
    train(resumed, resumed_opt, batches[3:])
    for name, tensor in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], tensor), name
    assert resumed.out_control_channels() is not None

    fresh = _layer(record_steps=4)  # a split layer's state dict splits a fresh one
    fresh.load_state_dict(whole.state_dict())
    x = torch.randn(6, 16)
    assert torch.equal(fresh(x), whole(x))


def test_osci_reset_watches_only_the_fp4_channels_of_a_split_layer():
    """One MXFP4 block holds the FP4 channels 0..23 (amax 6 in channel 0: scale 1); channels
    24..31 are FP8. Channel 1 and channel 25 oscillate across 2.5; only channel 1 is reset."""
    layer = _layer(in_features=32, record_start=0, record_steps=1)
    state = layer.state_dict()
    state["out_control_steps"] = torch.tensor(2)  # chosen: 8 FP8 channels first
    state["channel_order"] = torch.cat([torch.arange(24, 32), torch.arange(24)])
    layer.load_state_dict(state)
    fp8, fp4 = layer.out_control_channels()  # type: ignore[misc]
    assert fp8.tolist() == list(range(24, 32)) and fp4.tolist() == list(range(24))
    osci = OsciReset(layer, OsciResetConfig(start_step=0, period=4, track_steps=2, threshold=8))

    def put(value):
        with torch.no_grad():
            layer.weight.zero_()
            layer.weight[:, 0] = 6.0
            layer.weight[:, 1] = layer.weight[:, 25] = value

    for step, value in enumerate((2.49, 2.51, 2.49)):
        put(value)
        assert osci.after_step(step) is None
    assert osci.tracked[""]["columns"].tolist() == list(range(24))
    assert osci.tracked[""]["weight_moves"].shape == (3, 24)
    put(2.51)
    assert osci.after_step(3) == 3 / (3 * 24)  # channel 1 of each row, of the FP4 weights
    assert (layer.weight[:, 1] == 3.0).all() and (layer.weight[:, 25] == 2.51).all()


def test_the_fused_executors_refuse_it_with_a_reason():
    config = load_recipe("tetrajet-v2-outcontrol").linear
    assert fast_gap(config) is not None and "OutControl" in fast_gap(config)  # type: ignore[operator]
    assert fast_gap(load_recipe("tetrajet-v2").linear) is None
    name, why = QuantLinear(256, 8, config=config, seed=0).executor()
    assert name == "reference" and why


def test_the_recipes_resolve_and_the_base_recipe_is_unchanged():
    outcontrol, full = load_recipe("tetrajet-v2-outcontrol"), load_recipe("tetrajet-v2-full")
    base = load_recipe("tetrajet-v2")
    assert outcontrol.linear.out_control == OutControlConfig(0.1, 128, 501, 50, MXFP8)
    assert dataclasses.replace(outcontrol.linear, out_control=None) == base.linear
    assert full.linear == outcontrol.linear
    assert full.osci_reset == load_recipe("tetrajet-v2-osci").osci_reset
    assert "out_control" not in base.to_dict()["linear"]
    for recipe in (outcontrol, full):
        assert Recipe.from_dict(recipe.to_dict()) == recipe
    high = apply_overrides(outcontrol, ["linear.out_control.format=null"])
    assert high.linear.out_control is not None and high.linear.out_control.format is None
    added = apply_overrides(base, ["linear.out_control.record_start=3"])
    assert added.linear.out_control == OutControlConfig(record_start=3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("linear.out_control.ratio=1.5", "linear.out_control.ratio: must be in \\(0, 1\\]"),
        ("linear.out_control.ratio=0", "linear.out_control.ratio: must be in \\(0, 1\\]"),
        ("linear.out_control.format=mxfp4", "linear.out_control.format: an FP8 element"),
        ("linear.out_control.multiple=0", "multiple: must be an integer of at least 1"),
        ("linear.out_control.record_steps=0", "record_steps: must be an integer of at least 1"),
        ("linear.out_control.record_start=-1", "record_start: must be an integer of at least 0"),
        ("linear.out_control.format=mxfp9", "linear.out_control.format: unknown preset"),
        ("linear.out_control.channels=3", "linear.out_control.channels: unknown key"),
        ("linear.forward.x=null", "linear.out_control: needs a quantized forward activation"),
        ("linear.double_quant=false linear.forward.hadamard=16", "with a forward Hadamard"),
        ("linear.outliers={}", "out_control: cannot be combined with outlier clamping"),
    ],
)
def test_bad_options_are_one_line_errors(override, message):
    with pytest.raises(RecipeError, match=message) as error:
        apply_overrides(load_recipe("tetrajet-v2-outcontrol"), override.split())
    assert "\n" not in str(error.value)


def _chosen(layer, order):
    """`layer` with its channels chosen in `order`, as a state dict loaded after the schedule."""
    state = layer.state_dict()
    state["out_control_steps"] = torch.tensor(layer.config.out_control.select_after + 1)
    state["channel_order"] = order
    layer.load_state_dict(state)
    return layer


def test_a_layer_of_fewer_inputs_than_the_multiple_stays_unsplit():
    """The recipe's multiple of 128: a 64-input layer keeps every channel in FP4 after the
    schedule, and computes as the layer without OutControl."""
    config = dataclasses.replace(
        load_recipe("tetrajet-v2-outcontrol").linear,
        out_control=OutControlConfig(record_start=0, record_steps=1),
    )
    torch.manual_seed(0)
    layer = QuantLinear(64, 8, config=config, seed=0, backend="torch")
    plain = QuantLinear(64, 8, config=dataclasses.replace(config, out_control=None), seed=0,
                        backend="torch")  # fmt: skip
    plain.load_state_dict(layer.state_dict(), strict=False)
    _chosen(layer, torch.arange(63, -1, -1))
    assert layer.out_control_channels() is None
    x = torch.randn(4, 64)
    assert torch.equal(layer(x), plain(x))


@pytest.mark.skipif(
    not triton_available() or not (interpreter_on() or torch.cuda.is_available()),
    reason="the Triton kernels run only under TRITON_INTERPRET=1 or on a CUDA GPU",
)
def test_a_split_layer_gives_the_same_bits_with_the_quantizer_kernels():
    """The recipe's quantizers (NVFP4 with an outer block, SR, RHT, double quantization) on
    the FP4 channels of a split layer: backend "triton" equals the torch reference, forward
    and backward, two calls."""
    device = torch.device("cpu") if interpreter_on() else torch.device("cuda")
    config = dataclasses.replace(
        load_recipe("tetrajet-v2-outcontrol").linear,
        out_control=OutControlConfig(ratio=0.25, multiple=16, record_start=0, record_steps=1),
    )
    order = torch.randperm(64, generator=torch.Generator().manual_seed(3))
    passes = []
    for backend in ("torch", "triton"):
        torch.manual_seed(1)
        layer = _chosen(QuantLinear(64, 16, config=config, seed=3, backend=backend), order)
        layer.to(device)
        assert len(layer.out_control_channels()[0]) == 16  # type: ignore[index]
        generator = torch.Generator().manual_seed(4)
        calls = []
        for _ in range(2):
            x = (torch.randn(24, 64, generator=generator) * 3).to(device).requires_grad_()
            layer.zero_grad()
            y = layer(x)
            y.backward(torch.randn(24, 16, generator=generator).to(device))
            calls.append((y, x.grad, layer.weight.grad, layer.bias.grad))
        passes.append(calls)
    for torch_call, kernel_call in zip(*passes, strict=True):
        for a, b in zip(torch_call, kernel_call, strict=True):
            assert torch.equal(a, b)


def test_compiled_layer_records_chooses_and_splits_as_the_eager_one():
    """torch.compile (aot_eager) through the three phases: the phase is a host value the
    compiled code is specialized on, so the split takes effect; every output, weight and norm
    sum equals the eager layer's."""

    def run(compiled):
        torch.manual_seed(0)
        layer = _layer(in_features=32, record_start=1, record_steps=2)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
        fp4cli.attach_qema(layer, optimizer)
        model = torch.compile(layer, backend="aot_eager") if compiled else layer
        results = []
        for step in range(6):  # recorded: steps 2 and 3; split from step 4
            x = torch.randn(5, 32, generator=torch.Generator().manual_seed(step))
            x[:, 3] *= 10
            y = model(x)
            y.square().sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            results.append((y.detach(), layer.weight.detach().clone(), layer.channel_norms.clone()))
        return results, layer

    torch._dynamo.reset()
    eager, eager_layer = run(False)
    compiled, compiled_layer = run(True)
    for eager_step, compiled_step in zip(eager, compiled, strict=True):
        for a, b in zip(eager_step, compiled_step, strict=True):
            assert torch.equal(a, b)
    channels = compiled_layer.out_control_channels()
    assert channels is not None and channels[0][0] == 3
    assert torch.equal(torch.cat(channels), torch.cat(eager_layer.out_control_channels()))  # type: ignore[arg-type]


def test_a_cuda_graph_capture_before_the_split_fails_with_the_reason(monkeypatch):
    """The schedule counts on the host: a captured step would never advance it, and would
    keep the unsplit GEMMs. After the split a capture is allowed."""
    layer = _layer(record_start=2, record_steps=3)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    schedule = layer._out_control
    with pytest.raises(RuntimeError, match="after step 5; a CUDA graph captured before then"):
        schedule.refuse_capture()
    _chosen(layer, torch.arange(16))
    schedule.refuse_capture()
    assert layer.out_control_channels() is not None
