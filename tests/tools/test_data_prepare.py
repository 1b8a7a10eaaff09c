"""`fp4 data prepare` and `fp4 data info`: token folders from text, folders, JSONL and the
Python sources, with bytes, a BPE trained on the source or a tokenizer.json; atomic output;
one-line errors that leave nothing behind; training on the result."""

from __future__ import annotations

import gzip
import json
import os
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.tasks import corpus, prepare
from fp4cli.tasks.base import TaskError, create_task

runner = CliRunner()
RECORDS = [f"record {i}: def f(x):\n    return x * {i} + 1\n" for i in range(120)]


def invoke(*args: str):
    return runner.invoke(app, ["data", *args])


def write_jsonl(path, texts):
    path.write_text("".join(json.dumps({"text": text, "id": i}) + "\n" for i, text in
                            enumerate(texts)))  # fmt: skip
    return path


def tokens(folder, split):
    meta = json.loads((folder / "meta.json").read_text())
    return np.fromfile(folder / f"{split}.bin", dtype={"uint16": "<u2", "uint32": "<u4"}[
        meta["dtype"]])  # fmt: skip


def all_tokens(folder):
    return np.concatenate([tokens(folder, "train"), tokens(folder, "val")])


def leftovers(folder):
    """What a failed preparation left in the folder."""
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_bytes_of_a_folder_are_its_files_in_order(tmp_path):
    source = tmp_path / "src"
    (source / "sub").mkdir(parents=True)
    (source / "b.md").write_text("# title\n")
    (source / "a.txt").write_bytes("héllo\n".encode())
    write_jsonl(source / "sub" / "c.jsonl", ["first", "", "second"])
    (source / "skip.bin").write_bytes(b"\0\1")
    out = tmp_path / "out"
    result = invoke("prepare", str(source), str(out), "--quiet")
    assert result.exit_code == 0, result.output
    expected = "héllo\n".encode() + b"# title\n" + b"first" + b"second"
    assert all_tokens(out).tobytes() == np.frombuffer(expected, np.uint8).astype("<u2").tobytes()
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["dtype"], meta["tokenizer"]["kind"]) == (256, "uint16",
                                                                              "bytes")  # fmt: skip
    assert meta["train_tokens"] + meta["val_tokens"] == len(expected)
    assert meta["val_tokens"] == round(len(expected) * 0.05)
    assert (meta["source"]["kind"], meta["source"]["files"], meta["source"]["documents"]) == (
        "folder", 3, 4)  # fmt: skip
    assert leftovers(out) == ["meta.json", "train.bin", "val.bin"]


def test_bpe_trained_on_the_source_round_trips_and_its_file_reproduces_it(tmp_path):
    from tokenizers import Tokenizer

    source = write_jsonl(tmp_path / "records.jsonl", RECORDS)
    bpe, again = tmp_path / "bpe", tmp_path / "again"
    result = invoke("prepare", str(source), str(bpe), "--tokenizer", "bpe:400", "--quiet")
    assert result.exit_code == 0, result.output
    meta = json.loads((bpe / "meta.json").read_text())
    assert meta["tokenizer"]["kind"] == "bpe" and 257 < meta["vocab_size"] <= 400
    assert meta["tokenizer"]["requested_vocab_size"] == 400
    ids = all_tokens(bpe)
    eot = meta["eot_token"]
    assert eot is not None and int((ids == eot).sum()) == len(RECORDS)  # one after each record
    tokenizer = Tokenizer.from_file(str(bpe / "tokenizer.json"))
    first = ids[: int(np.argmax(ids == eot))].tolist()
    assert tokenizer.decode(first) == RECORDS[0]
    result = invoke("prepare", str(source), str(again), "--tokenizer",
                    str(bpe / "tokenizer.json"), "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert np.array_equal(all_tokens(again), ids)
    assert json.loads((again / "meta.json").read_text())["tokenizer"]["kind"] == "file"


def test_gzipped_jsonl_as_c4_ships_it(tmp_path):
    plain = write_jsonl(tmp_path / "records.jsonl", RECORDS)
    (tmp_path / "c4.json.gz").write_bytes(gzip.compress(plain.read_bytes()))
    for source in ("records.jsonl", "c4.json.gz"):
        result = invoke("prepare", str(tmp_path / source), str(tmp_path / source[:2]), "--quiet")
        assert result.exit_code == 0, result.output
    assert np.array_equal(all_tokens(tmp_path / "re"), all_tokens(tmp_path / "c4"))
    assert json.loads((tmp_path / "c4" / "meta.json").read_text())["source"]["kind"] == "jsonl"


def test_train_and_set_model_fields_on_a_prepared_folder(tmp_path):
    source = write_jsonl(tmp_path / "records.jsonl", RECORDS * 4)
    out, db = tmp_path / "tokens", tmp_path / "s.db"
    assert invoke("prepare", str(source), str(out), "--tokenizer", "bpe:300").exit_code == 0
    for task in ("llama", "gpt"):
        args = ["train", "--task", task, "--size", "debug", "--steps", "2", "--data", str(out),
                "--recipe", "mxfp4", "--device", "cpu", "--store", str(db), "--quiet",
                "--set", "checkpoints=false", "--set", "model.n_layer=1"]  # fmt: skip
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    runs = {run["task"]: run for run in RunStore(db).list_runs()}
    described = runs["llama"]["config"]["task"]
    assert described["dataset"] == "tokens" and described["model"]["n_layer"] == 1
    assert described["model"]["vocab_size"] == 320  # the folder's 300, rounded up to 64s
    assert runs["gpt"]["config"]["train"]["model"] == {"n_layer": 1}


def test_python_sources_with_a_small_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "PYTHON_SOURCES_CAP", 400_000)
    out = tmp_path / "py"
    result = invoke("prepare", "python-sources", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    meta = json.loads((out / "meta.json").read_text())
    source = meta["source"]
    assert source["kind"] == "python-sources" and source["cap_bytes"] == 400_000
    assert meta["train_tokens"] + meta["val_tokens"] == source["bytes"] <= 400_000
    assert source["python"] == ".".join(map(str, sys.version_info[:3]))
    assert len(source["file_list_sha256"]) == 64 and source["documents"] <= source["files"]


def test_an_existing_folder_is_replaced_only_with_force(tmp_path):
    source = write_jsonl(tmp_path / "r.jsonl", RECORDS)
    out = tmp_path / "out"
    assert invoke("prepare", str(source), str(out)).exit_code == 0
    result = invoke("prepare", str(source), str(out))
    assert result.exit_code == 2 and "--force replaces them" in result.stderr
    assert invoke("prepare", str(source), str(out), "--force").exit_code == 0


@pytest.mark.parametrize("stage", ["tokenize", "meta"])
def test_an_interrupted_prepare_leaves_nothing_that_loads(tmp_path, monkeypatch, stage):
    source = write_jsonl(tmp_path / "r.jsonl", RECORDS)
    out = tmp_path / "out"
    assert invoke("prepare", str(source), str(out)).exit_code == 0

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if stage == "tokenize":  # stopped while the tokens are being written
        monkeypatch.setattr(prepare, "_split_tail", interrupt)
    else:  # stopped after the .bin files are in place, before meta.json
        original = prepare._write_atomic
        monkeypatch.setattr(prepare, "_write_atomic", lambda path, text: interrupt()
                            if path.name == "meta.json" else original(path, text))  # fmt: skip
    with pytest.raises(KeyboardInterrupt):
        prepare.prepare_tokens(source, out, "bytes", force=True)
    assert not any(name.endswith(".partial") for name in leftovers(out))
    assert "meta.json" not in leftovers(out)
    with pytest.raises(TaskError, match="has no meta.json"):
        create_task("gpt", "debug", data=out)


def make_fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    return [str(tmp_path / "pipe")]


def source_file(name, content):
    def make(tmp_path):
        path = tmp_path / name
        path.write_text(content) if isinstance(content, str) else path.write_bytes(content)
        return [str(path)]

    return make


def empty_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    return [str(tmp_path / "empty")]


def with_tokenizer(tokenizer):
    def make(tmp_path):
        (tmp_path / "ok.txt").write_text("some text " * 50)
        (tmp_path / "tokenizer.json").write_text('{"model": "not a tokenizer"}')
        return [str(tmp_path / "ok.txt"), "--tokenizer", tokenizer.format(tmp=tmp_path)]

    return make


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda tmp: [str(tmp / "missing.txt")], "does not exist"),
        (source_file("empty.txt", ""), "is empty"),
        (empty_folder, "has no .txt, .md, .py, .jsonl, .jsonl.gz, .json.gz, .parquet files"),
        (make_fifo, "is not a file or folder: a named pipe"),
        (source_file("bad.jsonl", '{"text": "a"}\n{"text": \n'), "bad.jsonl line 2 is not JSON"),
        (source_file("no_text.jsonl", '{"body": "a"}\n'), 'line 1 has no "text" string'),
        (source_file("blank.jsonl", '{"text": ""}\n\n'), "holds no text"),
        (source_file("one.txt", "x"), "gives 1 tokens: too few for two splits"),
        (source_file("cut.json.gz", gzip.compress(b'{"text": "abc"}\n' * 50)[:-12]), "cannot read"),
        (with_tokenizer("{tmp}/tokenizer.json"), "tokenizer.json is not a tokenizer.json"),
        (with_tokenizer("{tmp}/missing.json"), "no such file; give bytes, bpe:VOCAB"),
        (with_tokenizer("bpe:4294967297"), "larger than uint32 ids can hold"),
        (with_tokenizer("bpe:many"), "the vocabulary must be a whole number"),
        (with_tokenizer("bpe:100"), "must exceed 257"),
    ],
)
def test_bad_sources_are_one_line_errors_and_write_nothing(tmp_path, make, message):
    out = tmp_path / "out"
    result = invoke("prepare", *make(tmp_path), str(out), "--quiet")
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr
    assert not out.exists()  # not even the folder


def test_parquet_without_pyarrow_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow fails
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "data.parquet").write_bytes(b"PAR1")
    result = invoke("prepare", str(tmp_path / "data.parquet"), str(tmp_path / "out"))
    assert result.exit_code == 2 and "needs pyarrow (pip install pyarrow)" in result.stderr


def test_parquet_text_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"text": ["one two", None, "three"]}), tmp_path / "good.parquet")
    pq.write_table(pa.table({"body": ["one"]}), tmp_path / "bad.parquet")
    result = invoke("prepare", str(tmp_path / "good.parquet"), str(tmp_path / "good"))
    assert result.exit_code == 0, result.output
    assert all_tokens(tmp_path / "good").tobytes() == np.frombuffer(
        b"one twothree", np.uint8).astype("<u2").tobytes()  # fmt: skip
    result = invoke("prepare", str(tmp_path / "bad.parquet"), str(tmp_path / "bad"))
    assert result.exit_code == 2 and "has no text column (columns: body)" in result.stderr


def test_info_checks_every_id(tmp_path):
    source = write_jsonl(tmp_path / "r.jsonl", RECORDS)
    out = tmp_path / "out"
    assert invoke("prepare", str(source), str(out)).exit_code == 0
    result = invoke("info", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["vocab_size"] == 256
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps(meta | {"vocab_size": 100}))  # ids up to 255
    result = invoke("info", str(out), "--quiet")
    assert result.exit_code == 2 and "outside the vocabulary of 100" in result.stderr
