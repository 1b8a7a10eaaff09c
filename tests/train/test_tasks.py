"""Every registered task at debug size on CPU: the Task contract, learning, FP4 conversion; and
the data sources of tasks/data.py and tasks/text.py, good and bad."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn
from PIL import Image

import fp4cli
from fp4cli.tasks.base import Batch, TaskError, create_task, task_names
from fp4cli.tasks.data import augment

# linear layers that the default skip patterns (head, lm_head, *embed*) keep in high precision
HIGH_PRECISION = {
    "regression": {"head"},
    "vit": {"head"},
    "gpt": {"lm_head"},
    "llama": {"lm_head"},
    "diffusion": {"time_embedding.linear_1", "time_embedding.linear_2"},
}
TEXT = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(40))


def same_batch(a: Batch, b: Batch) -> bool:
    return a.tensors.keys() == b.tensors.keys() and all(
        torch.equal(a[key], b[key]) for key in a.tensors
    )


def train_steps(task, model, batch: Batch, steps: int, lr: float) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = task.loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def plain_linear_names(model: nn.Module) -> set[str]:
    return {name for name, m in model.named_modules() if type(m) is nn.Linear}


def test_registry_and_bad_names():
    assert task_names() == ["diffusion", "gpt", "llama", "regression", "vit"]
    with pytest.raises(TaskError, match="unknown task 'nope'"):
        create_task("nope")
    with pytest.raises(TaskError, match="no size 'huge'"):
        create_task("vit", "huge")
    with pytest.raises(TaskError, match="draws its own data"):
        create_task("regression", "debug", data="somewhere")


@pytest.mark.parametrize("name", task_names())
def test_task_contract(name):
    task = create_task(name, "debug")
    assert task.name == name and task.size == "debug" and task.defaults.steps > 0
    torch.manual_seed(0)
    model = task.build_model()
    batch = task.batch(step=3, batch_size=8, seed=1)
    assert same_batch(batch, task.batch(step=3, batch_size=8, seed=1))
    assert not same_batch(batch, task.batch(step=4, batch_size=8, seed=1))
    assert not same_batch(batch, task.batch(step=3, batch_size=8, seed=2))
    loss = task.loss(model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)

    metrics = task.evaluate(model)
    assert task.primary_metric in metrics
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert model.training  # evaluate restores the mode
    assert task.evaluate(model) == metrics  # fixed held-out set, fixed noise

    described = task.describe()
    assert described["task"] == name and described["size"] == "debug"
    assert described["params"] == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", task_names())
def test_task_fits_a_fixed_batch(name):
    task = create_task(name, "debug")
    torch.manual_seed(0)
    model = task.build_model()
    losses = train_steps(task, model, task.batch(0, 16, seed=0), steps=8, lr=3e-3)
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize("name", task_names())
def test_tetrajet_quantizes_all_but_first_and_last(name):
    task = create_task(name, "debug")
    torch.manual_seed(0)
    model = task.build_model()
    all_linear = plain_linear_names(model)
    fp4cli.quantize_model(model, "tetrajet", seed=0)
    assert plain_linear_names(model) == HIGH_PRECISION[name]
    assert set(fp4cli.quantized_layers(model)) == all_linear - HIGH_PRECISION[name]
    before = [p.detach().clone() for p in model.parameters()]
    losses = train_steps(task, model, task.batch(0, 8, seed=0), steps=1, lr=1e-3)
    assert math.isfinite(losses[0])
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))


def test_augment_crops_and_mirrors():
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.uint8).reshape(2, 3, 8, 8)  # pad S/8 = 1
    generator = torch.Generator().manual_seed(0)
    shifts = torch.randint(0, 3, (2, 2), generator=generator)
    mirror = torch.rand(2, generator=generator) < 0.5
    out = augment(images, generator.manual_seed(0), flips=True)
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1))
    for i, ((dy, dx), flip) in enumerate(zip(shifts.tolist(), mirror.tolist(), strict=True)):
        expected = padded[i, :, dy : dy + 8, dx : dx + 8]
        assert torch.equal(out[i], expected.flip(-1) if flip else expected)


# --------------------------------------------------------------------------------------------
# data sources
# --------------------------------------------------------------------------------------------


def write_cifar(folder, files=("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4",
                               "data_batch_5", "test_batch"), per_file=6):  # fmt: skip
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in files:
        batch = {
            b"data": rng.integers(0, 256, (per_file, 3072), dtype=np.uint8),
            b"labels": [i % 3 for i in range(per_file)],
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def write_png(path, size, color):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)


def write_image_folder(root, per_class=5):
    for label, color in (("cat", (200, 30, 30)), ("dog", (30, 30, 200))):
        for i in range(per_class):
            write_png(root / label / f"{i}.png", (12 + i, 20), color)
    return root


def test_cifar_folder(tmp_path):
    folder = write_cifar(tmp_path / "cifar")
    task = create_task("vit", "debug", data=folder)
    info = task.describe()
    assert (info["dataset"], info["train_images"], info["val_images"]) == ("cifar10", 30, 6)
    assert info["num_classes"] == 3 and task.batch(0, 4, 0)["images"].shape == (4, 3, 16, 16)
    assert create_task("vit", "debug", data=str(folder)).data is task.data  # cached
    diffusion = create_task("diffusion", "debug", data=folder)
    assert diffusion.batch(0, 4, 0)["noisy"].shape == (4, 3, 16, 16)


def test_image_folder_split_and_layout(tmp_path):
    task = create_task("vit", "debug", data=write_image_folder(tmp_path / "flat"))
    info = task.describe()
    assert (info["dataset"], info["train_images"], info["val_images"]) == ("imagefolder", 8, 2)
    assert task.data.val_labels.tolist() == [0, 1]
    write_image_folder(tmp_path / "split" / "train", per_class=3)
    write_png(tmp_path / "split" / "val" / "dog" / "x.png", (16, 16), (0, 0, 0))
    info = create_task("vit", "debug", data=tmp_path / "split").describe()
    assert (info["train_images"], info["val_images"], info["num_classes"]) == (6, 1, 2)
    write_image_folder(tmp_path / "train_only" / "train")
    info = create_task("vit", "debug", data=tmp_path / "train_only").describe()
    assert (info["train_images"], info["val_images"], info["num_classes"]) == (8, 2, 2)


def test_text_file_and_folder(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    task = create_task("gpt", "debug", data=tmp_path / "corpus.txt")
    info = task.describe()
    assert info["dataset"] == "text-file"
    assert info["train_bytes"] + info["val_bytes"] == len(TEXT)
    folder = tmp_path / "folder"
    for name in ("a.txt", "b.md", "sub/c.py", "skip.bin", ".git/d.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(TEXT)
    info = create_task("gpt", "debug", data=folder).describe()
    assert (info["dataset"], info["files"]) == ("text-folder", 3)
    assert info["train_bytes"] + info["val_bytes"] == 3 * len(TEXT)


def bad_cifar(tmp_path):
    return write_cifar(tmp_path / "cifar", files=("data_batch_1", "test_batch"))


def corrupt_cifar(tmp_path):
    folder = write_cifar(tmp_path / "cifar")
    (folder / "data_batch_3").write_bytes(b"not a pickle")
    return folder


def broken_image(tmp_path):
    root = write_image_folder(tmp_path / "images")
    (root / "dog" / "bad.png").write_bytes(b"not a png")
    return root


def loose_images(tmp_path):
    write_png(tmp_path / "images" / "a.png", (8, 8), (1, 2, 3))
    return tmp_path / "images"


def empty_class(tmp_path):
    root = write_image_folder(tmp_path / "images")
    (root / "bird").mkdir()
    return root


def empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def short_text(tmp_path):
    (tmp_path / "short.txt").write_text("too short")
    return tmp_path / "short.txt"


def no_text_files(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "data.bin").write_bytes(b"\0" * 1000)
    return tmp_path / "bin"


@pytest.mark.parametrize(
    "task, make_data, message",
    [
        ("vit", lambda tmp: tmp / "missing", "does not exist"),
        ("gpt", lambda tmp: tmp / "missing.txt", "does not exist"),
        ("vit", empty_folder, "is empty"),
        ("diffusion", bad_cifar, "lacks data_batch_2"),
        ("vit", corrupt_cifar, "cannot read CIFAR-10 batch"),
        ("vit", broken_image, "cannot load image"),
        ("vit", loose_images, "no class subfolders"),
        ("vit", empty_class, "has no images"),
        ("vit", short_text, "not a folder"),
        ("gpt", empty_folder, "has no .txt, .md, .py files"),
        ("gpt", no_text_files, "has no .txt, .md, .py files"),
        ("gpt", short_text, "has 9 bytes"),
    ],
)
def test_bad_data_is_a_task_error(tmp_path, task, make_data, message):
    path = make_data(tmp_path)
    with pytest.raises(TaskError, match=message) as error:
        create_task(task, "debug", data=path)
    assert "\n" not in str(error.value)
    assert tmp_path.name in str(error.value)  # the message names the path
