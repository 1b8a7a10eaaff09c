"""vit: image classification with a timm VisionTransformer (DeiT-Tiny-like by default).

The patch size is scaled to the image size (32x32 images, 4x4 patches: 64 tokens). Data: see
tasks/data.py (CIFAR-10, an ImageFolder tree, or scikit-learn's digits resized up). Train batches
get a random crop (zero padding S/8) and, where that keeps the label, a random mirror.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import Batch, TaskDefaults, register_task, step_generator
from .common import check_multiple, evaluation, model_description, pick_size, with_model_fields
from .data import augment, load_images, normalize

EVAL_BATCH = 256


@dataclass(frozen=True)
class VitSize:
    image_size: int
    patch_size: int
    embed_dim: int
    depth: int
    num_heads: int
    mlp_ratio: float = 4.0


SIZES = {
    "debug": VitSize(image_size=16, patch_size=4, embed_dim=48, depth=2, num_heads=2),
    "default": VitSize(image_size=32, patch_size=4, embed_dim=192, depth=12, num_heads=3),
    # DeiT-Tiny (TetraJet's model): 224x224 images in 16x16 patches, 192 wide, 12 blocks, 3 heads
    "deit-tiny": VitSize(image_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3),
    # DeiT-Small: 224x224 images in 16x16 patches (196 tokens), 384 wide, 12 blocks, 6 heads
    "deit-small": VitSize(image_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6),
}
DEFAULTS = {
    "debug": TaskDefaults(steps=20, batch_size=32, lr=1e-3),
    "default": TaskDefaults(
        steps=2000, batch_size=128, lr=1e-3, weight_decay=0.05, warmup_steps=100, eval_every=250
    ),
    "deit-tiny": TaskDefaults(
        steps=2000, batch_size=128, lr=5e-4, weight_decay=0.05, warmup_steps=100, eval_every=250
    ),
    "deit-small": TaskDefaults(
        steps=2000, batch_size=128, lr=5e-4, weight_decay=0.05, warmup_steps=100, eval_every=250
    ),
}
MODEL_FIELDS = tuple(f.name for f in fields(VitSize))  # every field: --set model.FIELD=VALUE


class VitTask:
    name = "vit"
    primary_metric = "top1"

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
        self.train_images = self.data.train_images.to(device)  # (N, 3, S, S) uint8
        self.train_labels = self.data.train_labels.to(device)  # (N,)
        self.train_examples: int | None = len(self.train_labels)
        self.val_images = self.data.val_images.to(device)  # (M, 3, S, S) uint8
        self.val_labels = self.data.val_labels.to(device)  # (M,)

    def _make_model(self) -> nn.Module:
        from timm.models.vision_transformer import VisionTransformer

        c = self.config
        return VisionTransformer(
            img_size=c.image_size,
            patch_size=c.patch_size,
            in_chans=3,
            num_classes=self.data.num_classes,
            embed_dim=c.embed_dim,
            depth=c.depth,
            num_heads=c.num_heads,
            mlp_ratio=c.mlp_ratio,
        )

    def build_model(self) -> nn.Module:
        return self._make_model().to(self.device)

    def batch(self, step: int, batch_size: int, seed: int) -> Batch:
        generator = step_generator(seed, step)
        index = torch.randint(0, len(self.train_labels), (batch_size,), generator=generator)
        index = index.to(self.device)
        images = augment(self.train_images[index], generator, self.data.flips_keep_label)
        return Batch({"images": normalize(images, self.data), "labels": self.train_labels[index]})

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        logits = model(batch["images"])  # (B, classes)
        return F.cross_entropy(logits.float(), batch["labels"])

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        loss_sum, correct = 0.0, 0
        with evaluation(model, self.device):
            for start in range(0, len(self.val_labels), EVAL_BATCH):
                images = self.val_images[start : start + EVAL_BATCH]  # (b, 3, S, S) uint8
                labels = self.val_labels[start : start + EVAL_BATCH]
                logits = model(normalize(images, self.data)).float()  # (b, classes)
                loss_sum += F.cross_entropy(logits, labels, reduction="sum").item()
                correct += int((logits.argmax(-1) == labels).sum())
        count = len(self.val_labels)
        return {"val_loss": loss_sum / count, "top1": 100.0 * correct / count}

    def describe(self) -> dict[str, Any]:
        return {
            **model_description(self.name, self.size, self.config, self._make_model),
            **self.data.describe(),
        }


def _sized(size: VitSize, model: dict[str, Any] | None) -> VitSize:
    """The size with its architecture fields overridden, checked: whole patches, heads that
    split the width."""
    config = with_model_fields("vit", size, model, MODEL_FIELDS)
    check_multiple("vit", "image_size", config.image_size, "patch_size", config.patch_size)
    check_multiple("vit", "embed_dim", config.embed_dim, "num_heads", config.num_heads)
    return config


@register_task("vit")
def create_vit(
    size: str = "default",
    data: str | Path | None = None,
    device: torch.device | None = None,
    model: dict[str, Any] | None = None,
) -> VitTask:
    return VitTask(size, data, device or torch.device("cpu"), model)
