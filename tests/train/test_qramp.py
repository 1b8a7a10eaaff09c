"""Q-Ramping as TetraJet's released optimizer computes it, pinned to values worked by hand from
its formulas (adamw_bs_ramping.py, Qengine_DeiT.py)."""

import math

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.linear import LinearConfig, QuantLinear
from fp4cli.quant import QuantSpec, fake_quantize
from fp4cli.recipes import QRampConfig, load_recipe
from fp4cli.store import RunStore
from fp4cli.tasks.base import steps_per_epoch
from fp4cli.techniques import QEMAConfig
from fp4cli.train import run_training
from fp4cli.train.config import ConfigError, TrainConfig, for_recipe
from fp4cli.train.progress import SilentReporter
from fp4cli.train.qramp import QRampAdamW, calibrate, update_periods

LR, B1, B2, EPS = 0.1, 0.9, 0.999, 1e-8


def _weight(value=1.0, weight_decay=0.0):
    param = nn.Parameter(torch.tensor([value]))
    optimizer = QRampAdamW([param], lr=LR, betas=(B1, B2), eps=EPS, weight_decay=weight_decay)
    return param, optimizer


def _steps(param, optimizer, gradient, count):
    values = []
    for _ in range(count):
        param.grad = torch.tensor([gradient])
        optimizer.step()
        values.append(param.item())
    return values


def test_step_size_at_a_given_step_and_period_by_hand():
    """Period 4, constant gradient g: updates at global steps 4 and 8, each with the mean
    gradient g, lr times the 4 accumulated steps, and the bias correction of the global step:
    step(t) = lr * 4 / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    param, optimizer = _weight()
    optimizer.set_periods({param: torch.tensor([4.0])})
    g = 0.5
    values = _steps(param, optimizer, g, 8)
    assert values[:3] == [1.0, 1.0, 1.0] and values[4:7] == [values[3]] * 3

    m, v = (1 - B1) * g, (1 - B2) * g * g  # one moment update at t = 4
    step4 = LR * 4 / (1 - B1**4) * m / (math.sqrt(v) / math.sqrt(1 - B2**4) + EPS)
    assert values[3] == pytest.approx(1.0 - step4, abs=1e-6)  # 0.2325: 1.0 -> 0.7675
    m, v = B1 * m + (1 - B1) * g, B2 * v + (1 - B2) * g * g  # the second update, t = 8
    step8 = LR * 4 / (1 - B1**8) * m / (math.sqrt(v) / math.sqrt(1 - B2**8) + EPS)
    assert values[7] == pytest.approx(values[3] - step8, abs=1e-6)
    # a per-weight count (t = 1 at the first update) would have moved it 0.4, not 0.2325
    assert abs(1.0 - values[3] - LR * 4) > 0.1


def test_weight_decay_applies_every_step_to_every_weight():
    param, optimizer = _weight(weight_decay=0.1)
    optimizer.set_periods({param: torch.tensor([3.0])})
    values = _steps(param, optimizer, 0.0, 5)  # a zero gradient: Adam moves nothing
    expected = [(1 - LR * 0.1) ** k for k in range(1, 6)]
    assert values == pytest.approx(expected, rel=1e-6)


def test_update_when_the_count_is_a_multiple_of_the_period():
    """A period that changes under an accumulation: 4 steps counted under period 8, then
    period 3: count 5 is no multiple of 3 (no update), count 6 is (update, lr x 6)."""
    param, optimizer = _weight()
    optimizer.set_periods({param: torch.tensor([8.0])})
    assert _steps(param, optimizer, 0.5, 4) == [1.0] * 4
    optimizer.set_periods({param: torch.tensor([3.0])})  # the count carries over
    fifth, sixth = _steps(param, optimizer, 0.5, 2)
    assert fifth == 1.0
    m, v = (1 - B1) * 0.5, (1 - B2) * 0.25
    step = LR * 6 / (1 - B1**6) * m / (math.sqrt(v) / math.sqrt(1 - B2**6) + EPS)
    assert sixth == pytest.approx(1.0 - step, abs=1e-6)


def test_without_periods_it_is_adamw():
    torch.manual_seed(0)
    a = nn.Parameter(torch.randn(5, 3))
    b = nn.Parameter(a.detach().clone())
    ours = QRampAdamW([a], lr=1e-2, weight_decay=0.05)
    theirs = torch.optim.AdamW([b], lr=1e-2, weight_decay=0.05)
    for _ in range(6):
        grad = torch.randn(5, 3)
        a.grad, b.grad = grad.clone(), grad.clone()
        ours.step()
        theirs.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_a_non_finite_gradient_is_not_accumulated():
    param, optimizer = _weight()
    optimizer.set_periods({param: torch.tensor([2.0])})
    param.grad = torch.tensor([float("nan")])
    optimizer.step()
    param.grad = torch.tensor([0.5])
    optimizer.step()  # the mean of the accumulated gradient: (0 + 0.5) / 2
    m, v = (1 - B1) * 0.25, (1 - B2) * 0.0625
    step = LR * 2 / (1 - B1**2) * m / (math.sqrt(v) / math.sqrt(1 - B2**2) + EPS)
    assert param.item() == pytest.approx(1.0 - step, abs=1e-6)


def test_periods_by_hand():
    config = QRampConfig(alpha=16, beta=5)
    dist_w = torch.tensor([1.0, 1.0, 0.1, 0.0, 0.0])
    dist_q = torch.tensor([15.0, 16.0, 40.0, 0.0, 1.0])
    # floor((dQ / 16) / (dW + 1e-8)) * 5 + 1, at most 12
    assert update_periods(dist_w, dist_q, config, 12).tolist() == [1.0, 6.0, 12.0, 1.0, 12.0]


def test_calibration_counts_30_differences_of_31_steps_with_plain_q():
    """31 calibration steps; the first one only sets the starting point; Q(W) is the forward
    quantizer with plain rounding although Q-EMA is on; model and optimizer are restored."""
    spec = QuantSpec.preset("mxfp4-ceil")
    config = LinearConfig(forward_w=spec, qema=QEMAConfig(beta=0.5, warmup=0))
    layer = QuantLinear(32, 2, config=config, seed=0)
    model = nn.Sequential(layer)
    optimizer = QRampAdamW(model.parameters(), lr=1e-3)
    start = layer.weight.detach().clone()
    layer.weight_ema.copy_(start + 0.3 * torch.sign(torch.randn_like(start)))  # a far guide
    torch.manual_seed(1)
    path = [start + 0.2 * torch.randn_like(start) for _ in range(31)]  # the weights per step
    calls = []

    def train_step(i):
        calls.append(i)
        layer.weight.data.copy_(path[i])

    qramp = QRampConfig(alpha=0.5, beta=2, calibration_steps=30)
    result = calibrate(model, optimizer, train_step, qramp, max_period=1000)
    assert calls == list(range(31))
    assert torch.equal(layer.weight, start) and not optimizer.plain

    def distances(quantize):
        w = sum((path[i] - path[i - 1]).abs() for i in range(1, 31))
        q = sum((quantize(path[i]) - quantize(path[i - 1])).abs() for i in range(1, 31))
        return w, q

    plain = distances(lambda w: fake_quantize(w, spec))
    expected = update_periods(*plain, qramp, 1000)
    assert torch.equal(optimizer.state[layer.weight]["period"], expected)
    guided = distances(lambda w: fake_quantize(w, spec, guide=layer.weight_ema))
    assert not torch.equal(update_periods(*guided, qramp, 1000), expected)
    assert result["qramp_mean_period"] == pytest.approx(expected.mean().item())
    assert result["qramp_max_period"] == 1000


def test_no_gradient_clipping_with_q_ramping():
    qramp = load_recipe("tetrajet-qramp")
    assert for_recipe(TrainConfig(), qramp).grad_clip == 0.0  # the task default is off
    assert for_recipe(TrainConfig(grad_clip=0), qramp).grad_clip == 0.0
    assert for_recipe(TrainConfig(), load_recipe("tetrajet")).grad_clip is None
    with pytest.raises(ConfigError, match="grad_clip: Q-Ramping trains without gradient"):
        for_recipe(TrainConfig(grad_clip=1.0), qramp)
    args = ["train", "--recipe", "tetrajet-qramp", "--set", "grad_clip=1.0", "--device", "cpu"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "Q-Ramping trains without gradient clipping" in result.output


class _Task:
    def __init__(self, examples):
        self.train_examples = examples


def test_steps_per_epoch_drops_the_last_partial_batch():
    assert steps_per_epoch(_Task(1_281_167), 1024) == 1251  # DeiT on ImageNet
    assert steps_per_epoch(_Task(100), 256) == 1
    assert steps_per_epoch(_Task(None), 64) is None


def test_max_period_is_the_epoch_or_the_interval(tmp_path):
    """A task without epochs (regression) caps the periods at the calibration interval; the
    run trains without clipping and records the cap with each calibration."""
    store = RunStore(tmp_path / "s.db")
    flags = {"task": "regression", "size": "debug", "device": "cpu", "recipe": "tetrajet-qramp",
             "steps": 3, "checkpoints": False}  # fmt: skip
    overrides = ["optimizer.qramp.calibration_steps=2", "optimizer.qramp.interval=40"]
    result, trainer = run_training(flags, overrides, store, reporter=SilentReporter())
    assert result.status == "finished" and trainer.config.grad_clip == 0.0
    caps = [m["value"] for m in store.metrics(result.run_id, "qramp_max_period")]
    assert caps == [40.0]
    fixed = ["optimizer.qramp.calibration_steps=2", "optimizer.qramp.max_period=7"]
    result, _ = run_training(flags, fixed, store, reporter=SilentReporter())
    assert [m["value"] for m in store.metrics(result.run_id, "qramp_max_period")] == [7.0]
