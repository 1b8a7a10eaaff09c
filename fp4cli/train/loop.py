"""One trainer for every task: AdamW, warmup + cosine, clipping, BF16 autocast on GPU,
evaluation, quantization statistics, checkpoints, resume, divergence detection.

Everything a run produces goes to the run store; a run that is interrupted (Ctrl-C, SIGTERM)
is marked so, one killed outright reads as `interrupted` and is marked so by the next command
that writes to the store.
Only the first stop signal raises (`signals.py`): one more while the run records its end is
ignored. A run that fails (a full disk) is marked `failed`.
Batches are a pure function of (seed, step), every random stream of the quantized layers is in
the model's state dict, and the open statistics windows and OsciReset's sums are in the
checkpoint, so a resumed run reproduces the uninterrupted one's metrics and statistics. A resume
never moves a run back: it trains to --steps, else to the steps the run was last given.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import platform
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from fp4cli.train import distributed
from fp4cli.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_sharded,
    prune_checkpoints,
    restore_rng,
    save_checkpoint,
    save_sharded,
)
from fp4cli.train.config import ConfigError, TrainConfig
from fp4cli.train.distributed import Distributed
from fp4cli.train.memory import check_batch_fits
from fp4cli.train.progress import Reporter, SilentReporter
from fp4cli.train.shapes import LayerShapes
from fp4cli.train.signals import (
    PEER_STOP_WAIT_S,
    Signals,
    Stop,
    install_stop_handler,
    restore_handlers,
    stopped_within,
)
from fp4cli.train.stats import QuantStatsCollector
from fp4cli.train.step import (
    StepRunner,
    device_learning_rates,
    set_learning_rate,
)


@dataclass
class RunResult:
    run_id: str
    status: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    checkpoint: str | None = None
    seconds: float = 0.0


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to lr * min_lr_ratio."""
    assert config.lr is not None and config.steps is not None
    warmup = config.warmup_steps or 0
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return config.lr * (config.min_lr_ratio + (1 - config.min_lr_ratio) * cosine)


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but no CUDA GPU is available")
    return device


def versions() -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "none"
    return {
        "torch": torch.__version__,
        "triton": triton_version,
        "python": platform.python_version(),
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


class Trainer:
    """Builds a run from a resolved config and trains it, writing everything to `store` (which
    may be set after construction: construction refuses what the run cannot do)."""

    def __init__(
        self,
        config: TrainConfig,
        recipe: Any,
        task: Any,
        store: Any,
        dist: Distributed | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.config, self.recipe, self.task, self.store = config, recipe, task, store
        self.dist = dist or Distributed()
        distributed.check_config(self.dist, config, recipe)
        self.device = device if device is not None else pick_device(config.device)
        _check_step_options(config, recipe, self.device, self.dist)
        self.cuda_graph, self.step_note = step_mode(config, recipe, self.device, self.dist)
        self.model = self._build_model()  # the module itself (state dicts, statistics)
        assert config.batch_size is not None
        check_batch_fits(
            self.model, task, config.batch_size // self.dist.world_size, config.seed, self.device,
            config.recompute,
        )  # fmt: skip
        self.gather = distributed.packed_gather(self.model, self.dist, config)
        wrapped = distributed.wrap(self.model, self.dist, self.device)
        self.train_model: Any = torch.compile(wrapped) if config.compile else wrapped  # forward
        self.optimizer = self._build_optimizer()
        self.stats = QuantStatsCollector(self.model, enabled=config.stats_every > 0)
        self.step_runner = StepRunner(
            self.train_model, self.optimizer, self.task.loss, config.grad_clip, self.device,
            cuda_graph=self.cuda_graph, plain_model=wrapped, recompute=config.recompute,
            eager_if_capture_fails=config.cuda_graph is None,
        )  # fmt: skip
        self.osci_reset = osci_reset_for(self.model, self.recipe)
        self.run_id: str | None = None
        self.start_step = 0

    def _build_model(self) -> nn.Module:
        import fp4cli

        torch.manual_seed(self.config.seed)
        model = self.task.build_model().to(self.device)
        fp4cli.quantize_model(
            model, self.recipe, seed=self.config.seed, backend=self.config.backend
        )
        return model

    def _build_optimizer(self) -> torch.optim.Optimizer:
        import fp4cli
        from fp4cli.train.qramp import QRampAdamW

        decay: list[nn.Parameter] = []
        no_decay: list[nn.Parameter] = []
        for name, param in self.model.named_parameters():
            (no_decay if param.ndim < 2 or "embed" in name else decay).append(param)
        assert self.config.lr is not None
        groups: list[dict[str, Any]] = [
            {"params": decay, "weight_decay": self.config.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ]
        optimizer: torch.optim.Optimizer
        if self.recipe.qramp is not None:
            optimizer = QRampAdamW(groups, lr=self.config.lr)
        else:
            fused = self.device.type == "cuda"
            optimizer = torch.optim.AdamW(
                groups, lr=self.config.lr, fused=fused, capturable=self.cuda_graph
            )
        if self.cuda_graph:
            device_learning_rates(optimizer, self.device)
        fp4cli.attach_qema(self.model, optimizer)
        return optimizer

    def resolved(self) -> dict[str, Any]:
        return {
            "train": self.config.to_dict(),
            "recipe": self.recipe.to_dict(),
            "task": self.task.describe(),
        }

    def start(self) -> str:
        run_id = self.store.create_run(
            task=self.config.task,
            recipe=self.recipe.name,
            seed=self.config.seed,
            config=self.resolved(),
            device=device_name(self.device),
            versions=versions(),
            tags=self.config.tags,
            sweep=self.config.sweep,
            name=self.config.name,
            world_size=self.dist.world_size,
            parallel=self.config.parallel,
        )
        self.run_id = distributed.broadcast(run_id, self.dist)
        return self.run_id

    def resume(self, run_id: str, steps: int | None = None) -> None:
        """Continue `run_id` from its newest checkpoint (same run row in the store) to `steps`,
        or to the steps its checkpoint was trained towards (what an extended run was given)."""
        if self.dist.is_main:  # before reading a checkpoint that a live writer may replace
            self.store.check_resumable(run_id)
        checkpoint = self.store.latest_checkpoint(run_id) if self.dist.is_main else None
        path = distributed.broadcast(checkpoint["path"] if checkpoint else None, self.dist)
        if path is None:
            raise ConfigError(f"run {run_id} has no checkpoint to resume from")
        if self.config.parallel == "fsdp":
            state = load_sharded(path, self.model, self.optimizer)
        else:
            state = load_checkpoint(path, self.device)
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            extra = state.get("extra", {})
            if self.osci_reset is not None:
                self.osci_reset.load_state_dict(extra.get("osci_reset", {}))
            self.stats.load_state_dict(extra.get("quant_stats", {}))
        if self.cuda_graph:
            device_learning_rates(self.optimizer, self.device)
        restore_rng(state["rng"])
        self.start_step = int(state["step"])
        target = steps if steps is not None else _trained_towards(state, self.config)
        if target < self.start_step:  # before the store is touched: a resume never goes back
            raise ConfigError(
                f"--steps {target}: run {run_id} is at step {self.start_step}; a resume never "
                f"moves a run back (give --steps of at least {self.start_step})"
            )
        self.config = dataclasses.replace(self.config, steps=target)
        self.run_id = run_id
        self.store.reopen_run(run_id, self.start_step)

    def checkpoint_dir(self) -> Path:
        return Path(self.store.path).parent / "checkpoints" / str(self.run_id)

    def run(self, reporter: Reporter | None = None) -> RunResult:
        assert self.run_id is not None, "call start() or resume() first"
        reporter = reporter or SilentReporter()
        config = self.config
        assert config.steps is not None
        began = time.time()
        previous = install_stop_handler()
        reporter.start(config.steps, self.start_step, f"{config.task}/{self.recipe.name}")
        if not self.recipe.linear.is_high_precision:
            from fp4cli.linear import executor_summary

            reporter.message(executor_summary(self.model))
        if config.recompute:
            from fp4cli.linear.recompute import recompute_summary

            reporter.message(recompute_summary(self.model))
        reporter.message(self.step_note)
        if self.gather is not None:
            reporter.message(self.gather.summary())
            self.store.log_metrics(self.run_id, self.start_step, self.gather.metrics())
        if self.recipe.qramp is not None:
            reporter.message(
                f"Q-Ramping: periods up to {self._max_period()} steps, recalibrated every "
                f"{self.recipe.qramp.interval}; no gradient clipping (TetraJet's code has none)"
            )
        try:
            try:
                status, step = self._loop(reporter)
            except (Stop, KeyboardInterrupt, torch.OutOfMemoryError, MemoryError):
                raise
            except BaseException as error:  # a collective's error, or distributed checkpoint's
                # A rank whose peer stopped first (Ctrl-C, or torchrun ending the ranks) sees
                # the peer leave a collective before its own signal arrives: wait for it.
                if (
                    self.dist.world_size > 1
                    and not _failed_here(error)
                    and (Signals.received or stopped_within(PEER_STOP_WAIT_S))
                ):
                    raise Stop() from None
                raise
        except (Stop, KeyboardInterrupt):
            Signals.ending = True
            status, step = "interrupted", self._step
            self.store.finish_run(self.run_id, "interrupted", step=step, message="stopped")
        except (torch.OutOfMemoryError, MemoryError) as error:
            Signals.ending = True
            _release_frames(error)
            self.store.finish_run(self.run_id, "failed", step=self._step, message="out of memory")
            raise ConfigError(
                f"batch_size: out of memory on {self.device} at step {self._step}; "
                "use a smaller --batch-size"
            ) from None
        except BaseException as error:
            Signals.ending = True
            _release_frames(error)  # a failed write's open file holds the space it took
            message = _one_line(error)
            self.store.finish_run(self.run_id, "failed", step=self._step, message=message)
            if isinstance(error, OSError):  # a full disk, a lost mount: not the code
                raise ConfigError(f"{message} at step {self._step}") from None
            raise
        finally:
            reporter.finish()
            restore_handlers(previous)
        final = self.store.final_metrics(self.run_id)
        return RunResult(
            self.run_id, status, step, final, self._last_checkpoint, time.time() - began
        )

    _step = 0
    _last_checkpoint: str | None = None
    _saved_step = -1

    def _loop(self, reporter: Reporter) -> tuple[str, int]:
        config, model, task = self.config, self.train_model, self.task
        assert config.steps is not None and config.batch_size is not None
        run_id = self.run_id
        model.train()
        tick, samples = time.time(), 0
        for step in range(self.start_step, config.steps):
            self._step = step
            set_learning_rate(self.optimizer, lr_at(step, config))
            qramp = self.recipe.qramp
            if qramp is not None and step % qramp.interval == 0:
                self.store.log_metrics(run_id, step, self._calibrate(step))
            batch = distributed.shard(task.batch(step, config.batch_size, config.seed), self.dist)
            collect = config.stats_every > 0 and (step + 1) % config.stats_every == 0
            self.stats.begin(collect)
            shapes = LayerShapes(self.model) if step == self.start_step else None
            # statistics and the first step's layer shapes need the eager step's hooks
            loss, grad_norm = self.step_runner(batch, eager=collect or shapes is not None)
            if self.step_runner.capture_failure is not None and self.cuda_graph:
                self.cuda_graph = False  # said once
                reporter.message(f"steps: eager from step {step} (the CUDA graph capture "
                                 f"failed: {self.step_runner.capture_failure})")  # fmt: skip
            if shapes is not None:
                self.store.log_layers(run_id, shapes.rows())
            loss_value = distributed.mean_over_ranks(loss, self.dist)
            if not torch.isfinite(loss_value):
                self.store.finish_run(
                    run_id,
                    "diverged",
                    step=step,
                    diverged_step=step,
                    message=f"loss became {loss_value.item()} at step {step}",
                )
                reporter.message(f"diverged at step {step}: loss {loss_value.item()}")
                return "diverged", step
            grad_norm = distributed.local_value(grad_norm)
            self.stats.after_step()
            reset = self.osci_reset.after_step(step) if self.osci_reset is not None else None
            if reset is not None:
                self.store.log_metrics(run_id, step + 1, {"osci_reset_fraction": reset})
            samples += config.batch_size
            done = step + 1
            if done % config.log_every == 0 or done == config.steps:
                rate = samples / max(time.time() - tick, 1e-9)  # global samples per second
                values = {
                    "train_loss": loss_value.item(),
                    "grad_norm": grad_norm.item(),
                    "lr": lr_at(step, config),
                    "samples_per_s": rate,
                }
                self.store.log_metrics(run_id, done, values)  # also the run's heartbeat
                reporter.update(done, values["train_loss"], rate)
                tick, samples = time.time(), 0
            if collect:
                self.store.log_quant_stats(run_id, done, self.stats.rows())
            if config.eval_every and done % config.eval_every == 0 and done != config.steps:
                self.store.log_metrics(run_id, done, task.evaluate(model))
            if config.checkpoint_every and done % config.checkpoint_every == 0:
                self._save(done)
        self.store.log_metrics(run_id, config.steps, task.evaluate(model))
        if self._saved_step != config.steps:  # unless checkpoint_every just saved it
            self._save(config.steps)
        distributed.barrier(self.dist)
        self.store.finish_run(run_id, "finished", step=config.steps)
        return "finished", config.steps

    def _calibrate(self, step: int) -> dict[str, float]:
        """Q-Ramping calibration on batches of their own stream (seed + 1 + step)."""
        from fp4cli.train.qramp import QRampAdamW, calibrate

        config = self.config
        assert config.batch_size is not None

        def plain_step(i: int) -> None:
            batch = self.task.batch(i, config.batch_size, config.seed + 1 + step)
            batch = distributed.shard(batch, self.dist)
            with torch.autocast(
                self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
            ):
                loss = self.task.loss(self.train_model, batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()

        assert isinstance(self.optimizer, QRampAdamW)
        qramp = self.recipe.qramp
        result = calibrate(self.model, self.optimizer, plain_step, qramp, self._max_period())
        self.optimizer.zero_grad(set_to_none=True)
        return result

    def _max_period(self) -> int:
        """Q-Ramping's N_max: the recipe's, else the task's steps per epoch (TetraJet's code),
        else (a task without epochs) the calibration interval."""
        from fp4cli.tasks.base import steps_per_epoch

        qramp, batch_size = self.recipe.qramp, self.config.batch_size
        assert qramp is not None and batch_size is not None
        if qramp.max_period is not None:
            return int(qramp.max_period)
        return steps_per_epoch(self.task, batch_size) or qramp.interval

    def _save(self, step: int) -> None:
        self._saved_step = step
        if not self.config.checkpoints:
            return
        directory, config = self.checkpoint_dir(), self.resolved()
        if self.config.parallel == "fsdp":
            path = save_sharded(
                directory, step, self.model, self.optimizer, config, self.dist.is_main
            )
        elif self.dist.is_main:  # DDP: every rank holds the same state
            extra = self._extra_state()
            path = save_checkpoint(directory, step, self.model, self.optimizer, config, extra)
        distributed.barrier(self.dist)
        if self.dist.is_main:
            self.store.add_checkpoint(self.run_id, step, str(path))
            prune_checkpoints(directory, path)  # only now: the store's checkpoint exists
            self._last_checkpoint = str(path)

    def _extra_state(self) -> dict[str, Any]:
        """What a checkpoint holds besides the model and optimizer: OsciReset's tracked sums
        and the open statistics windows (a resumed run records the same statistics)."""
        extra: dict[str, Any] = {}
        if self.osci_reset is not None:
            extra["osci_reset"] = self.osci_reset.state_dict()
        if self.stats.enabled:
            extra["quant_stats"] = self.stats.state_dict()
        return extra


def _trained_towards(state: dict[str, Any], config: TrainConfig) -> int:
    """The steps a checkpoint's run was trained towards (a run extended by --steps keeps its
    new steps there), else `config`'s."""
    saved = state.get("config", {}).get("train", {}).get("steps")
    assert saved is not None or config.steps is not None
    return int(saved) if saved is not None else int(config.steps or 0)


def _failed_here(error: BaseException) -> bool:
    """Whether this process's own write failed (a full disk, a lost mount), not a peer."""
    return isinstance(error, (OSError, CheckpointError))


def _one_line(error: BaseException) -> str:
    """An error's text on one line, at most 500 characters."""
    text = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, OSError) and error.filename is not None:
        text = f"cannot use {error.filename}: {error.strerror or text}"
    return text[:500]


def _release_frames(error: BaseException) -> None:
    """Drop the locals of the frames a failure passed through, and of the errors it chained
    to. A write that failed on a full disk leaves its file open there: its space stays taken
    and the store cannot record the failure until it is closed."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)
        pending += [current.__cause__, current.__context__]
    gc.collect()


def _check_step_options(
    config: TrainConfig, recipe: Any, device: torch.device, dist: Distributed
) -> None:
    """One-line errors for step options this run cannot take (CUDA graphs asked for)."""
    if config.cuda_graph is not True:
        return
    if device.type != "cuda":
        raise ConfigError(f"cuda_graph: needs a CUDA device (this run is on {device.type})")
    if dist.world_size > 1:
        raise ConfigError("cuda_graph: runs on one process (not with --nproc-per-node)")
    if recipe.qramp is not None:
        raise ConfigError("cuda_graph: not with Q-Ramping (its optimizer updates on the host)")


def osci_reset_for(model: nn.Module, recipe: Any) -> Any:
    """The recipe's OsciReset over the model's quantized layers, or None."""
    if recipe.osci_reset is None:
        return None
    from fp4cli.techniques.osci_reset import OsciReset, OsciResetError

    try:
        return OsciReset(model, recipe.osci_reset)
    except OsciResetError as error:
        raise ConfigError(str(error)) from None


def step_mode(
    config: TrainConfig, recipe: Any, device: torch.device, dist: Distributed
) -> tuple[bool, str]:
    """(whether the steps replay from a CUDA graph, the line that says so): as `cuda_graph`
    asks, or where it is None (the default) wherever the run allows it: one process on a CUDA
    device, an optimizer that updates on the device (not Q-Ramping's)."""
    if config.cuda_graph is False:
        return False, "steps: eager (--no-cuda-graph)"
    why_not = None
    if device.type != "cuda":
        why_not = f"CUDA graphs need a CUDA device; this run is on the {device.type}"
    elif dist.world_size > 1:
        why_not = f"a CUDA graph step runs on one process; this run has {dist.world_size}"
    elif recipe.qramp is not None:
        why_not = "Q-Ramping updates its optimizer on the host"
    if why_not is not None:
        return False, f"steps: eager ({why_not})"
    return True, "steps: replayed from a CUDA graph after 3 eager ones (--no-cuda-graph: eager)"
