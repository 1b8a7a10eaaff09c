"""The training step runner (fp4cli/train/step.py) on the CPU: eager steps, learning rates on the
device, batches copied into captured buffers, and the one-line errors of the step options.
CUDA-graph replays themselves are tested on a GPU (tests/gpu/test_gpu_fast_linear.py)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fp4cli.store import RunStore
from fp4cli.tasks.base import Batch
from fp4cli.train import run_training
from fp4cli.train.config import ConfigError, TrainConfig
from fp4cli.train.progress import SilentReporter
from fp4cli.train.step import (
    StepRunner,
    _clone,
    _copy_into,
    device_learning_rates,
    plain_step,
    set_learning_rate,
)


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _loss(model, batch):
    return F.mse_loss(model(batch["inputs"]), batch["targets"])


def _batches(count):
    generator = torch.Generator().manual_seed(1)
    return [Batch({"inputs": torch.randn(5, 8, generator=generator),
                   "targets": torch.randn(5, 4, generator=generator)})
            for _ in range(count)]  # fmt: skip


def test_eager_runner_is_the_plain_training_loop():
    runner_model, loop_model = _model(), _model()
    runner_opt = torch.optim.AdamW(runner_model.parameters(), lr=1e-2)
    loop_opt = torch.optim.AdamW(loop_model.parameters(), lr=1e-2)
    runner = StepRunner(runner_model, runner_opt, _loss, 0.5, torch.device("cpu"))
    for batch in _batches(4):
        loss, norm = runner(batch)
        loop_opt.zero_grad()
        expected = _loss(loop_model, batch)
        expected.backward()
        expected_norm = torch.nn.utils.clip_grad_norm_(loop_model.parameters(), 0.5)
        loop_opt.step()
        assert torch.equal(loss, expected.detach()) and torch.equal(norm, expected_norm)
    for a, b in zip(runner_model.parameters(), loop_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert runner.graph is None and runner.eager_steps == 4


def test_steps_asked_to_run_eagerly_take_the_plain_model():
    """A compiled model's statistics steps (and first step) run the model before compilation."""
    model = _model()
    calls = []

    class Recorded(nn.Module):
        def __init__(self, name):
            super().__init__()
            self.name, self.inner = name, model

        def forward(self, inputs):
            calls.append(self.name)
            return self.inner(inputs)

    compiled, plain = Recorded("compiled"), Recorded("plain")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    runner = StepRunner(compiled, optimizer, _loss, None, torch.device("cpu"), plain_model=plain)
    for index, batch in enumerate(_batches(3)):
        runner(batch, eager=index == 1)
    assert calls == ["compiled", "plain", "compiled"]


def test_plain_step_returns_the_norm_before_clipping():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss, norm = plain_step(model, optimizer, _loss, _batches(1)[0], 1e-6, autocast=False)
    assert norm > 1e-6 and loss.requires_grad is False


def test_learning_rates_as_device_tensors_update_in_place():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    device_learning_rates(optimizer, torch.device("cpu"))
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and float(lr) == pytest.approx(3e-4)
    set_learning_rate(optimizer, 1e-3)
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(1e-3)
    plain = torch.optim.AdamW(model.parameters(), lr=3e-4)
    set_learning_rate(plain, 2e-3)
    assert plain.param_groups[0]["lr"] == 2e-3


def test_batches_are_copied_into_buffers_of_the_same_strides():
    windows = torch.arange(40).reshape(4, 10)
    batch = Batch({"inputs": windows[:, :-1], "targets": windows[:, 1:]})
    static = _clone(batch)
    for name in ("inputs", "targets"):
        assert static[name].stride() == batch[name].stride()
        assert static[name].data_ptr() != batch[name].data_ptr()
        assert torch.equal(static[name], batch[name])
    nested = _clone((torch.zeros(2), {"a": torch.ones(3)}))
    assert isinstance(nested, tuple) and torch.equal(nested[1]["a"], torch.ones(3))
    later = Batch({"inputs": windows[:, :-1] + 100, "targets": windows[:, 1:] + 100})
    _copy_into(static, later)
    assert torch.equal(static["inputs"], later["inputs"])
    with pytest.raises(ValueError, match="batches of one shape"):
        _copy_into(static, Batch({"inputs": windows, "targets": windows}))
    with pytest.raises(TypeError, match="batches of tensors"):
        _copy_into(static, "not a batch")


def test_step_options_are_checked(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 2}
    with pytest.raises(ConfigError, match="cuda_graph: needs a CUDA device"):
        run_training({**flags, "cuda_graph": True}, [], store, reporter=SilentReporter())
    with pytest.raises(ConfigError, match="compile: must be true or false"):
        TrainConfig(compile="yes")
    with pytest.raises(ConfigError, match="size: must be a size name"):
        TrainConfig(size="")


def test_compile_and_cuda_graph_may_change_on_resume(tmp_path):
    """Speed options, not numerics: a resumed run may set them (other flags are refused)."""

    class StopAt(SilentReporter):
        def update(self, step, loss, samples_per_s):
            if step == 2:
                raise KeyboardInterrupt

    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 4, "log_every": 1,
             "checkpoint_every": 1}  # fmt: skip
    cut, _ = run_training(flags, [], store, reporter=StopAt())
    assert cut.status == "interrupted"
    with pytest.raises(ConfigError, match="--cuda-graph and --recompute may change"):
        run_training({"lr": 0.1}, [], store, resume=cut.run_id, reporter=SilentReporter())
    speed = {"compile": False, "cuda_graph": False, "recompute": True}
    resumed, _ = run_training(speed, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert resumed.status == "finished"


def test_a_run_says_which_executor_its_layers_take(tmp_path):
    class Messages(SilentReporter):
        def __init__(self):
            self.lines = []

        def message(self, text):
            self.lines.append(text)

    reporter = Messages()
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 1}
    run_training(flags, [], RunStore(tmp_path / "fp4.db"), reporter=reporter)
    assert reporter.lines[0].startswith("quantized layers: ")
    assert "on the reference (a cpu tensor)" in reporter.lines[0]
    assert "steps: eager (CUDA graphs need a CUDA device; this run is on the cpu)" in reporter.lines


def test_steps_replay_from_a_cuda_graph_wherever_the_run_allows_it():
    from fp4cli.recipes import load_recipe
    from fp4cli.train.distributed import Distributed
    from fp4cli.train.loop import step_mode

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    one, two = Distributed(), Distributed(world_size=2)
    tetrajet, default = load_recipe("tetrajet"), TrainConfig()
    assert step_mode(default, tetrajet, cuda, one) == (True, step_mode(default, tetrajet, cuda,
                                                                       one)[1])  # fmt: skip
    assert "replayed from a CUDA graph" in step_mode(default, load_recipe("bf16"), cuda, one)[1]
    off = step_mode(TrainConfig(cuda_graph=False), tetrajet, cuda, one)
    assert off == (False, "steps: eager (--no-cuda-graph)")
    for device, dist, recipe, why in [
        (cpu, one, tetrajet, "CUDA graphs need a CUDA device; this run is on the cpu"),
        (cuda, two, tetrajet, "a CUDA graph step runs on one process; this run has 2"),
        (cuda, one, load_recipe("tetrajet-qramp"), "Q-Ramping updates its optimizer on the host"),
    ]:
        assert step_mode(default, recipe, device, dist) == (False, f"steps: eager ({why})")
