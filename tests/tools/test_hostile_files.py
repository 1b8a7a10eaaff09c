"""Files fp4cli reads never run code: a checkpoint or a CIFAR-10 batch whose unpickling would
write a marker file is refused in one line, and the marker is never written."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.tasks.base import TaskError, create_task
from fp4cli.train import run_training
from fp4cli.train.checkpoint import CheckpointError, load_checkpoint, read_plain
from fp4cli.train.progress import SilentReporter
from tests.train.test_tasks import write_cifar


def fp4(tmp_path: Path, *args: str):
    return CliRunner().invoke(app, list(args), env={"FP4_STORE": str(tmp_path / "s.db")})


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


def _random_bytes(size: int) -> bytes:
    return random.Random(0).randbytes(size)


def test_random_bytes_on_resume_are_not_a_checkpoint(tmp_path):
    store = RunStore(tmp_path / "fp4.db")
    run_id, path = _train_to_a_checkpoint(store)
    path.write_bytes(_random_bytes(4000))
    with pytest.raises(CheckpointError) as error:
        run_training({"steps": 3}, [], store, resume=run_id, reporter=SilentReporter())
    message = str(error.value)
    assert f"cannot read {path}: not a checkpoint (unreadable)" in message
    assert "weights_only" not in message and "\n" not in message


@pytest.mark.parametrize("content", [_random_bytes(4000), b"plain text, not a torch file"])
def test_a_file_to_inspect_that_is_not_tensors_never_suggests_unsafe_loading(tmp_path, content):
    path = tmp_path / "t.pt"
    path.write_bytes(content)
    result = fp4(tmp_path, "quantize-inspect", "--file", str(path))
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output == f"error: cannot read {path}: not a torch file of tensors (unreadable)\n"


def test_a_file_to_inspect_holding_code_is_refused(tmp_path):
    marker, path = tmp_path / "ran", tmp_path / "t.pt"
    torch.save({"w": torch.ones(2, 2), "x": WritesMarker(marker)}, path)
    result = fp4(tmp_path, "quantize-inspect", "--file", str(path))
    assert result.exit_code == 2 and not marker.exists()
    assert "system); refused unread" in result.output and "weights_only" not in result.output


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


@pytest.mark.parametrize(
    ("labels", "fragment"),
    [
        ([0, 1, -1, 2, 3, 4], "label -1 at position 2 is outside 0-9"),
        ([0, 10, 1, 12, 2, 3], "label 10 at position 1 is outside 0-9 (and 1 more)"),
        ([0, 1, 2], "6 images but 3 labels"),
    ],
)
def test_a_cifar_batch_with_a_bad_label_names_it(tmp_path, labels, fragment):
    folder = write_cifar(tmp_path / "cifar")
    batch = folder / "data_batch_3"
    with batch.open("rb") as file:
        content = pickle.load(file)
    batch.write_bytes(pickle.dumps(content | {b"labels": labels}))
    with pytest.raises(TaskError) as error:
        create_task("vit", "debug", data=folder)
    assert str(error.value) == f"CIFAR-10 batch {batch}: {fragment}"


def test_real_cifar_batches_still_load(tmp_path):
    folder = write_cifar(tmp_path / "cifar")
    task = create_task("vit", "debug", data=folder)
    assert task.data.name == "cifar10" and len(task.train_labels) > 0
