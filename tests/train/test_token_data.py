"""Token folders as --data of the language-model tasks (tasks/tokens.py): both dtypes,
memory-mapped windows, and one-line errors for every bad folder; the python-sources corpus."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch

from fp4cli.tasks import corpus, text
from fp4cli.tasks.base import TaskError, create_task, step_generator
from fp4cli.tasks.tokens import DataError, token_dtype

BLOCK = 32  # the debug sizes' block size


def write_folder(folder, train, val, dtype="uint16", vocab=300, **meta):
    """A token folder: the ids as raw little-endian `dtype`, and a meta.json."""
    folder.mkdir(parents=True, exist_ok=True)
    little = {"uint16": "<u2", "uint32": "<u4"}[dtype]
    np.asarray(train, dtype=little).tofile(folder / "train.bin")
    np.asarray(val, dtype=little).tofile(folder / "val.bin")
    fields = {"vocab_size": vocab, "dtype": dtype, "train_tokens": len(train),
              "val_tokens": len(val), **meta}  # fmt: skip
    (folder / "meta.json").write_text(json.dumps(fields))
    return folder


def ramp(count: int, vocab: int, offset: int = 0) -> np.ndarray:
    return (np.arange(count, dtype=np.int64) * 7 + offset) % vocab


@pytest.mark.parametrize(("dtype", "vocab", "model_vocab"),
                         [("uint16", 300, 320), ("uint32", 70_000, 70_016)])  # fmt: skip
@pytest.mark.parametrize("task_name", ["gpt", "llama"])
def test_a_token_folder_of_either_dtype_gives_windows_of_its_ids(
    tmp_path, task_name, dtype, vocab, model_vocab
):
    train = ramp(4000, vocab)
    train[123] = vocab - 1  # the largest id there is: above 65,535 for uint32
    folder = write_folder(tmp_path / "tokens", train, ramp(500, vocab, 3), dtype, vocab)
    task = create_task(task_name, "debug", data=folder)
    described = task.describe()
    assert (described["dataset"], described["dtype"], described["vocab_size"]) == (
        "tokens", dtype, vocab)  # fmt: skip
    assert described["model"]["vocab_size"] == model_vocab  # rounded up to a multiple of 64
    assert (described["train_tokens"], described["val_tokens"]) == (4000, 500)
    assert isinstance(task.data.tokens.train_tokens, np.memmap)
    assert task.train_examples == (4000 - 1) // BLOCK

    batch = task.batch(step=2, batch_size=4, seed=5)
    starts = torch.randint(0, 4000 - BLOCK, (4,), generator=step_generator(5, 2))
    for row, start in enumerate(starts.tolist()):
        assert batch["inputs"][row].tolist() == train[start : start + BLOCK].tolist()
        assert batch["targets"][row].tolist() == train[start + 1 : start + BLOCK + 1].tolist()
    model = task.build_model()
    assert model(batch["inputs"]).shape == (4, BLOCK, model_vocab)
    metrics = task.evaluate(model)
    assert set(metrics) == {"val_loss", "val_ppl"}  # not bytes: no bits per byte
    assert metrics["val_ppl"] == pytest.approx(np.exp(metrics["val_loss"]), rel=1e-6)


def test_byte_tokens_report_bits_per_byte(tmp_path):
    folder = write_folder(tmp_path / "bytes", ramp(1000, 256), ramp(200, 256), vocab=256,
                          tokenizer={"kind": "bytes", "vocab_size": 256})  # fmt: skip
    task = create_task("gpt", "debug", data=folder)
    metrics = task.evaluate(task.build_model())
    assert set(metrics) == {"val_loss", "val_bpb"}
    assert metrics["val_bpb"] == pytest.approx(metrics["val_loss"] / np.log(2))


def truncated(tmp_path):
    folder = write_folder(tmp_path / "t", ramp(1000, 300), ramp(100, 300))
    with (folder / "train.bin").open("ab") as handle:
        handle.write(b"\x01")  # half a uint16
    meta = json.loads((folder / "meta.json").read_text())
    del meta["train_tokens"]
    (folder / "meta.json").write_text(json.dumps(meta))
    return folder


def disagreeing(tmp_path):
    return write_folder(tmp_path / "d", ramp(1000, 300), ramp(100, 300), train_tokens=999)


def too_large_a_vocabulary(tmp_path):
    return write_folder(tmp_path / "v", ramp(1000, 300), ramp(100, 300), vocab=70_000)


def no_meta(tmp_path):
    folder = write_folder(tmp_path / "n", ramp(1000, 300), ramp(100, 300))
    (folder / "meta.json").unlink()
    return folder


def meta_not_json(tmp_path):
    folder = write_folder(tmp_path / "j", ramp(1000, 300), ramp(100, 300))
    (folder / "meta.json").write_text("vocab_size: 300")
    return folder


def unknown_dtype(tmp_path):
    folder = write_folder(tmp_path / "u", ramp(1000, 300), ramp(100, 300))
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps(meta | {"dtype": "int8"}))
    return folder


def no_val(tmp_path):
    folder = write_folder(tmp_path / "m", ramp(1000, 300), ramp(100, 300))
    (folder / "val.bin").unlink()
    return folder


def too_few_tokens(tmp_path):
    return write_folder(tmp_path / "f", ramp(1000, 300), ramp(20, 300))


def val_id_outside(tmp_path):
    val = ramp(100, 300)
    val[50] = 301
    return write_folder(tmp_path / "o", ramp(1000, 300), val)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (truncated, "has 2,001 bytes, not a whole number of uint16 tokens"),
        (disagreeing, "says 999 train tokens but train.bin holds 1,000"),
        (too_large_a_vocabulary, "vocab_size 70,000 is larger than uint16 ids can hold"),
        (no_meta, "has no meta.json"),
        (meta_not_json, "meta.json is not JSON"),
        (unknown_dtype, "dtype must be one of uint16, uint32 (got 'int8')"),
        (no_val, "has no val.bin"),
        (too_few_tokens, "holds 20 tokens; block size 32 needs at least 33"),
        (val_id_outside, "holds token id 301, outside the vocabulary of 300"),
    ],
)
def test_bad_token_folders_are_one_line_errors(tmp_path, make, message):
    folder = make(tmp_path)
    with pytest.raises(TaskError) as error:
        create_task("llama", "debug", data=folder)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(tmp_path) in str(error.value)


def test_a_train_id_outside_the_vocabulary_stops_its_batch(tmp_path):
    train = np.full(1000, 299)
    train[::40] = 400  # every window meets one
    folder = write_folder(tmp_path / "tokens", train, ramp(100, 300))
    task = create_task("gpt", "debug", data=folder)
    with pytest.raises(DataError, match="train.bin holds token id 400, outside the vocabulary"):
        task.batch(0, 4, seed=0)


def test_token_dtypes_hold_their_vocabularies():
    assert (token_dtype(256), token_dtype(65_536), token_dtype(65_537)) == (
        "uint16", "uint16", "uint32")  # fmt: skip
    assert token_dtype(2**32) == "uint32"
    with pytest.raises(DataError, match="larger than uint32 ids can hold"):
        token_dtype(2**32 + 1)


def test_python_sources_are_listed_in_a_fixed_order_with_provenance():
    listed = corpus.python_sources(cap=3_000_000)
    again = corpus.python_sources(cap=3_000_000)
    assert listed.files == again.files and listed.files
    provenance = listed.provenance
    assert provenance["file_list_sha256"] == again.provenance["file_list_sha256"]
    assert provenance["python"] == ".".join(map(str, sys.version_info[:3]))
    assert provenance["bytes"] == sum(listed.sizes) <= 3_000_000
    assert provenance["files"] == len(listed.files)
    assert all(file.suffix == ".py" for file in listed.files)
    stdlib = provenance["stdlib"]
    assert all(str(file).startswith(stdlib) for file in listed.files)  # stdlib comes first
    assert "site-packages" not in str(listed.files[-1])
    larger = corpus.python_sources(cap=6_000_000)
    assert larger.files[: len(listed.files)] == listed.files  # a prefix of one order


def test_python_sources_as_data(monkeypatch):
    monkeypatch.setattr(corpus, "PYTHON_SOURCES_CAP", 1_000_000)
    monkeypatch.setattr(text, "_CACHE", {})
    described = create_task("gpt", "debug", data="python-sources").describe()
    assert described["dataset"] == "python-sources"
    assert described["train_bytes"] + described["val_bytes"] == described["source"]["bytes"]
    assert described["source"]["cap_bytes"] == 1_000_000
    assert described["model"]["vocab_size"] == 256
