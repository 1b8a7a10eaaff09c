"""diffusion: DDPM noise prediction with a small diffusers UNet2DModel.

Images (labels ignored) from tasks/data.py, scaled to [-1, 1]. A batch holds clean images, the
noise, the timesteps and the noisy images (scheduler.add_noise); the loss is the MSE between the
predicted and the true noise. eval_loss: the same MSE over fixed held-out images at 10 evenly
spaced timesteps with fixed noise.
"""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Batch, TaskDefaults, register_task, step_generator
from .common import check_multiple, evaluation, model_description, pick_size, with_model_fields
from .data import load_images

TRAIN_TIMESTEPS = 1000
EVAL_TIMESTEPS = 10
EVAL_NOISE_SEED = 2_718_281
EVAL_BATCH = 128


@dataclass(frozen=True)
class DiffusionSize:
    image_size: int
    block_out_channels: tuple[int, ...]
    layers_per_block: int
    norm_num_groups: int
    attention_head_dim: int
    eval_images: int  # held-out images evaluated (at every eval timestep)


SIZES = {
    "debug": DiffusionSize(16, (16, 32), 1, 8, 8, eval_images=16),
    "default": DiffusionSize(32, (64, 128, 128), 2, 32, 32, eval_images=256),
}
# --set model.FIELD=VALUE: the UNet's shape (not the evaluation set's)
MODEL_FIELDS = (
    "image_size",
    "block_out_channels",
    "layers_per_block",
    "norm_num_groups",
    "attention_head_dim",
)
DEFAULTS = {
    "debug": TaskDefaults(steps=20, batch_size=16, lr=1e-3, weight_decay=0.0),
    "default": TaskDefaults(
        steps=2000, batch_size=64, lr=3e-4, weight_decay=0.0, warmup_steps=100, eval_every=250
    ),
}


@functools.cache
def _diffusers() -> tuple[Any, Any]:
    """(UNet2DModel, DDPMScheduler), imported offline and quietly: nothing may download, no
    telemetry, no import-time warnings."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("DISABLE_TELEMETRY", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import diffusers

        diffusers.utils.logging.set_verbosity_error()
        return diffusers.UNet2DModel, diffusers.DDPMScheduler


class DiffusionTask:
    name = "diffusion"
    primary_metric = "eval_loss"

    def __init__(
        self,
        size: str,
        data: str | Path | None,
        device: torch.device,
        model: dict[str, Any] | None = None,
    ) -> None:
        self.size = size
        self.config = _sized(pick_size(self.name, SIZES, size), model)
        self.defaults = DEFAULTS[size]
        self.device = device
        self.data = load_images(data, self.config.image_size)
        _, scheduler_class = _diffusers()
        self.scheduler = scheduler_class(num_train_timesteps=TRAIN_TIMESTEPS)
        self.train_images = self.data.train_images.to(device)  # (N, 3, S, S) uint8
        self.train_examples: int | None = len(self.train_images)
        self.eval_images = self.data.val_images[: self.config.eval_images].to(device)
        steps = torch.linspace(0, TRAIN_TIMESTEPS - 1, EVAL_TIMESTEPS)
        self.eval_timesteps = steps.round().long().tolist()  # 0, 111, ..., 999

    def _make_model(self) -> nn.Module:
        c = self.config
        levels = len(c.block_out_channels)  # attention only at the lowest resolution
        unet_class, _ = _diffusers()
        return unet_class(
            sample_size=c.image_size,
            in_channels=3,
            out_channels=3,
            block_out_channels=c.block_out_channels,
            layers_per_block=c.layers_per_block,
            down_block_types=("DownBlock2D",) * (levels - 1) + ("AttnDownBlock2D",),
            up_block_types=("AttnUpBlock2D",) + ("UpBlock2D",) * (levels - 1),
            norm_num_groups=c.norm_num_groups,
            attention_head_dim=c.attention_head_dim,
        )

    def build_model(self) -> nn.Module:
        return self._make_model().to(self.device)

    def batch(self, step: int, batch_size: int, seed: int) -> Batch:
        generator = step_generator(seed, step)
        index = torch.randint(0, len(self.train_images), (batch_size,), generator=generator)
        timesteps = torch.randint(0, TRAIN_TIMESTEPS, (batch_size,), generator=generator)
        shape = (batch_size, *self.train_images.shape[1:])
        noise = torch.randn(shape, generator=generator).to(self.device)  # (B, 3, S, S)
        timesteps = timesteps.to(self.device)
        images = _to_unit_range(self.train_images[index.to(self.device)])  # (B, 3, S, S)
        noisy = self.scheduler.add_noise(images, noise, timesteps)
        return Batch({"images": images, "noise": noise, "timesteps": timesteps, "noisy": noisy})

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        predicted = model(batch["noisy"], batch["timesteps"]).sample  # (B, 3, S, S)
        return F.mse_loss(predicted.float(), batch["noise"])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        images = _to_unit_range(self.eval_images)  # (E, 3, S, S)
        squared_error, count = 0.0, 0
        with evaluation(model, self.device):
            for index, timestep in enumerate(self.eval_timesteps):
                noise = torch.randn(images.shape, generator=step_generator(EVAL_NOISE_SEED, index))
                noise = noise.to(self.device)
                timesteps = torch.full((len(images),), timestep, device=self.device)
                noisy = self.scheduler.add_noise(images, noise, timesteps)
                for chunk in range(0, len(images), EVAL_BATCH):
                    part = slice(chunk, chunk + EVAL_BATCH)
                    predicted = model(noisy[part], timesteps[part]).sample.float()
                    squared_error += F.mse_loss(predicted, noise[part], reduction="sum").item()
                    count += predicted.numel()
        return {"eval_loss": squared_error / count}

    def describe(self) -> dict[str, Any]:
        return {
            **model_description(self.name, self.size, self.config, self._make_model),
            "train_timesteps": TRAIN_TIMESTEPS,
            "eval_timesteps": self.eval_timesteps,
            "eval_images": len(self.eval_images),
            **self.data.describe(),
        }


def _sized(size: DiffusionSize, model: dict[str, Any] | None) -> DiffusionSize:
    """The size with its architecture fields overridden, checked: group norms that split every
    level's channels, images that halve evenly down to the lowest level."""
    config = with_model_fields("diffusion", size, model, MODEL_FIELDS)
    for channels in config.block_out_channels:
        check_multiple(
            "diffusion", "block_out_channels", channels, "norm_num_groups", config.norm_num_groups
        )
    halvings = 2 ** (len(config.block_out_channels) - 1)
    check_multiple(
        "diffusion", "image_size", config.image_size, "block_out_channels' halvings", halvings
    )
    return config


def _to_unit_range(images: torch.Tensor) -> torch.Tensor:
    """uint8 0..255 -> float -1..1."""
    return images.float() / 127.5 - 1.0


@register_task("diffusion")
def create_diffusion(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> DiffusionTask:
    return DiffusionTask(size, data, device or torch.device("cpu"), model)
