"""Files fp4cli reads never run code: a checkpoint or a CIFAR-10 batch whose unpickling would
write a marker file is refused in one line, and the marker is never written."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest
import torch

from fp4cli.store import RunStore
from fp4cli.tasks.base import TaskError, create_task
from fp4cli.train import run_training
from fp4cli.train.checkpoint import CheckpointError, load_checkpoint, read_plain
from fp4cli.train.progress import SilentReporter
from tests.train.test_tasks import write_cifar


class WritesMarker:
    """Unpickling this calls os.system: what a hostile file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _train_to_a_checkpoint(store: RunStore) -> tuple[str, Path]:
    flags = {"task": "regression", "size": "debug", "device": "cpu", "steps": 2,
             "checkpoint_every": 1}  # fmt: skip
    result, _ = run_training(flags, [], store, reporter=SilentReporter())
    return result.run_id, Path(store.latest_checkpoint(result.run_id)["path"])


def test_a_checkpoint_holding_code_is_refused_on_resume(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    run_id, path = _train_to_a_checkpoint(store)
    state = torch.load(path, weights_only=True)
    marker = tmp_path / "ran"
    state["extra"] = {"payload": WritesMarker(marker)}
    torch.save(state, path)
    with pytest.raises(CheckpointError, match="refused unread") as error:
        run_training({"steps": 3}, [], store, resume=run_id, reporter=SilentReporter())
    assert not marker.exists()
    assert "\n" not in str(error.value) and str(path) in str(error.value)


@pytest.mark.parametrize("damage", ["truncated", "garbage", "not a dict"])
def test_damaged_checkpoints_are_one_line_errors(tmp_path, damage):
    store = RunStore(tmp_path / "fp4.db")
    _, path = _train_to_a_checkpoint(store)
    if damage == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x00garbage" * 100)
    else:
        torch.save([1, 2, 3], path)
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(path, torch.device("cpu"))
    assert "\n" not in str(error.value) and len(str(error.value)) < 400


def test_plain_files_still_load(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"w": torch.ones(2), "step": 3, "names": ["a"], "cfg": {"lr": 0.1}}, path)
    assert read_plain(path)["step"] == 3


def test_a_cifar_batch_holding_code_is_refused(tmp_path):
    folder = write_cifar(tmp_path / "cifar")
    marker = tmp_path / "ran"
    with (folder / "data_batch_2").open("wb") as file:
        pickle.dump({b"data": WritesMarker(marker), b"labels": [0]}, file)
    with pytest.raises(TaskError, match="refused posix.system|refused os.system") as error:
        create_task("vit", "debug", data=folder)
    assert not marker.exists()
    assert "\n" not in str(error.value)


def test_real_cifar_batches_still_load(tmp_path):
    folder = write_cifar(tmp_path / "cifar")
    task = create_task("vit", "debug", data=folder)
    assert task.data.name == "cifar10" and len(task.train_labels) > 0
