"""Hostile and mistaken inputs: each is one `error:` line and exit code 2, quoting at most a
short excerpt, before any work starts; nothing is accepted that means something else."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore

runner = CliRunner()
TRAIN = ["train", "--task", "regression", "--size", "debug", "--device", "cpu"]


def fp4(tmp_path: Path, *args: str):
    return runner.invoke(app, list(args), env={"FP4_STORE": str(tmp_path / "s.db")})


def _one_line(result, fragment: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert fragment in lines[0], lines[0]
    assert len(lines[0]) <= 620


def _aliases(levels: int) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for level in range(1, levels):
        lines.append(f"a{level}: &a{level} [" + ", ".join([f"*a{level - 1}"] * 9) + "]")
    return "\n".join([*lines, f"skip: *a{levels - 1}"]) + "\n"


RECIPE_FILES = {
    "not-utf8": (b"description: \xff\xfe\n", "is not UTF-8 text"),
    "deep": (("a: " + "[" * 5000 + "]" * 5000 + "\n").encode(), "nested deeper than"),
    "alias-bomb": (_aliases(8).encode(), "aliases expand"),
    "self-alias": (b"skip: &s [*s]\n", "an alias refers to itself"),
    "dge-huge-k": (b"base: mxfp4\nlinear:\n  dge: {k: 1.0e308}\n", "k: must be a number > 1"),
    "too-large": (b"description: x\n" + b"# filler\n" * 150_000, "at most 1 MiB"),
}


@pytest.mark.parametrize("name", RECIPE_FILES)
def test_hostile_recipe_files(tmp_path, name):
    content, fragment = RECIPE_FILES[name]
    path = tmp_path / f"{name}.yaml"
    path.write_bytes(content)
    _one_line(fp4(tmp_path, "recipes", "show", str(path)), fragment)


def test_a_recipe_naming_a_large_file_as_base_quotes_an_excerpt(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("x" * 50_000 + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("base: big.yaml\n")
    result = fp4(tmp_path, "recipes", "show", str(recipe))
    _one_line(result, "must be a mapping")
    assert len(result.output) < 400


def test_recipe_paths_that_are_not_files(tmp_path):
    (tmp_path / "dir.yaml").mkdir()
    _one_line(fp4(tmp_path, "recipes", "show", str(tmp_path / "dir.yaml")), "not a regular file")
    os.mkfifo(tmp_path / "fifo.yaml")
    _one_line(fp4(tmp_path, "recipes", "show", str(tmp_path / "fifo.yaml")), "not a regular file")
    (tmp_path / "loop1.yaml").symlink_to(tmp_path / "loop2.yaml")
    (tmp_path / "loop2.yaml").symlink_to(tmp_path / "loop1.yaml")
    _one_line(fp4(tmp_path, "recipes", "show", str(tmp_path / "loop1.yaml")), "cannot resolve")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--nproc-per-node", "0"], "--nproc-per-node and --nnodes: must be positive"),
        (["--seed", "99999999999999999999"], "seed: must be an integer from 0 to 2^63 - 1"),
        (["--set", "steps=true"], "steps: must be a positive integer (got True)"),
        (["--steps", "1000000000000"], "steps: must be at most 10^9 (got 1000000000000)"),
        (["--set", "steps=1e12"], "steps: must be at most 10^9 (got 1000000000000)"),
        (["--lr", "inf"], "lr: must be a finite number"),
        (["--set", "grad_clip=.nan"], "grad_clip: must be a finite number"),
        (["--recipe", "no:such:recipe:x:"], "unknown recipe 'no:such:recipe:x:'"),
        (["--cuda-graph"], "cuda_graph: needs a CUDA device (this run is on cpu)"),
    ],
)
def test_training_options_that_mean_nothing(tmp_path, args, fragment):
    _one_line(fp4(tmp_path, *TRAIN, *args), fragment)
    assert not (tmp_path / "s.db").exists()  # a refused run leaves no store file


def test_resuming_from_a_missing_store_creates_none(tmp_path):
    _one_line(fp4(tmp_path, "train", "--resume", "r-1"), "no run store at")
    assert not (tmp_path / "s.db").exists()


SWEEP = "name: s\nbase: mxfp4\ntasks: [regression]\n"
LARGE_AXES = ("lr", "steps", "warmup_steps", "log_every")  # 11^4 = 14,641 points


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("train: {steps: true}\n", "train.steps: must be a positive integer"),
        (
            "axes:\n"
            + "".join(f"  {key}: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]\n" for key in LARGE_AXES),
            "more than a sweep trains",
        ),  # fmt: skip
        ("sample: 1000000\n", "sample: must be an integer from 1 to 10,000"),
        ("seeds: [-1]\n", "seeds: each must be from 0 to 2^63 - 1 (got -1)"),
    ],
)
def test_sweep_files_that_would_run_wrong_or_forever(tmp_path, body, fragment):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP + body)
    _one_line(fp4(tmp_path, "sweep", str(path), "--dry-run"), fragment)


def test_output_paths_are_checked_before_work(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.txt").write_text("x")
    folder, file = str(tmp_path / "folder"), str(tmp_path / "file.txt")
    RunStore(tmp_path / "s.db").close()
    _one_line(fp4(tmp_path, "report", "--csv", folder), "--csv: ")
    _one_line(fp4(tmp_path, "report", "--plots", file), "--plots: ")
    _one_line(fp4(tmp_path, "quantize-inspect", "--task", "regression", "--size", "debug",
                  "--csv", folder), "--csv: ")  # fmt: skip
    _one_line(fp4(tmp_path, "oscillation-report", "r-x", "--png", folder), "--png: ")
    _one_line(fp4(tmp_path, "report", "--csv", str(tmp_path / "file.txt" / "out.csv")),
              "is a file, not a folder")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["quantize", "--iters", "1000000000000"], "iters: must be from 1 to 10,000"),
        (["layer", "--iters", "10001"], "iters: must be from 1 to 10,000 (got 10001)"),
        (["step", "--steps", "1001"], "steps: must be from 1 to 1,000 (got 1001)"),
        (["gemm", "--rep-ms", "1000000000"], "rep_ms: must be from 1 to 60,000"),
    ],
)
def test_benchmarks_that_would_run_for_hours_are_refused(tmp_path, args, fragment):
    _one_line(fp4(tmp_path, "bench", *args, "--device", "cpu", "--no-store"), fragment)


def test_cpu_benchmarks_of_gpu_sized_shapes_are_refused(tmp_path):
    _one_line(fp4(tmp_path, "bench", "quantize", "--device", "cpu"), "too large to measure")


def test_error_text_is_not_markup_or_emoji(tmp_path):
    result = fp4(tmp_path, *TRAIN, "--recipe", ":x: [bold]y[/bold]")
    _one_line(result, "no such recipe file ':x: [bold]y[/bold]'")


def test_a_batch_that_cannot_fit_is_refused_before_training(tmp_path, monkeypatch):
    import fp4cli.train.memory as memory

    monkeypatch.setattr(memory, "free_bytes", lambda device: 2**30)  # 1 GiB free
    result = fp4(tmp_path, *TRAIN, "--batch-size", "100000000")
    _one_line(result, "batch_size: 100000000 needs about")
    assert "GiB are free on cpu; about" in result.output
    assert RunStore(tmp_path / "s.db").list_runs() == []
    assert fp4(tmp_path, *TRAIN, "--steps", "1", "--batch-size", "64").exit_code == 0


def test_the_estimate_grows_with_the_batch():
    import torch

    from fp4cli.tasks.base import create_task
    from fp4cli.train.memory import saved_bytes

    task = create_task("gpt", "debug")
    model = task.build_model()
    sizes = [saved_bytes(model, task.loss, task.batch(0, b, 0), torch.device("cpu"))
             for b in (1, 2, 4)]  # fmt: skip
    assert 0 < sizes[0] < sizes[1] < sizes[2]
    assert model.training  # the probe leaves the mode as it found it


def test_the_estimate_keeps_no_graph_alive():
    """Nothing of the probe's graph survives it: a graph kept alive holds each parameter's
    gradient accumulator, made on the default stream, which breaks a later CUDA-graph capture."""
    import gc

    import torch

    import fp4cli
    from fp4cli.tasks.base import create_task
    from fp4cli.train.memory import saved_bytes

    def graph_tensors() -> set[int]:
        gc.collect()
        return {
            id(o) for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.grad_fn is not None
        }

    task = create_task("gpt", "debug")
    model = task.build_model()
    fp4cli.quantize_model(model, "tetrajet", seed=0)
    before = graph_tensors()  # an earlier test's in this process (a compiled graph's fakes)
    assert saved_bytes(model, task.loss, task.batch(0, 1, 0), torch.device("cpu")) > 0
    assert graph_tensors() - before == set()


def test_the_estimate_counts_saved_tensors_whose_memory_would_be_reused():
    """Each saved tensor counts, also one whose memory a later tensor of the pass would reuse
    once nothing held it: four inputs of sin, each freed when its term is summed."""
    import torch

    from fp4cli.train.memory import forward_saved_bytes

    x = torch.randn(1000, requires_grad=True)

    def forward():
        total = torch.zeros(())
        for shift in range(4):
            total = total + (x + shift).sin().sum()  # sin saves its input, 4000 bytes
        return total

    assert forward_saved_bytes(forward) == 4 * 4000


@pytest.mark.parametrize("task", ["gpt", "vit"])
def test_a_data_path_in_a_symlink_loop(tmp_path, task):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    args = ["train", "--task", task, "--size", "debug", "--device", "cpu", "--data"]
    _one_line(fp4(tmp_path, *args, str(tmp_path / "a")), "cannot be resolved")


LONG = "n" * 300  # one path component over the 255 bytes a file name may have


def _bench_cpu(kind: str, shape: str) -> list[str]:
    return ["bench", kind, "--device", "cpu", "--shapes", shape]


LONG_NAMES = {
    "recipes show": ["recipes", "show", f"{LONG}.yaml"],
    "train --recipe": [*TRAIN, "--recipe", f"{LONG}.yaml"],
    "train gpt --data": ["train", "--task", "gpt", "--size", "debug", "--data", LONG],
    "train vit --data": ["train", "--task", "vit", "--size", "debug", "--data", LONG],
    "sweep": ["sweep", f"{LONG}.yaml", "--dry-run"],
    "quantize-inspect --file": ["quantize-inspect", "--file", f"{LONG}.pt"],
    "quantize-inspect --csv": ["quantize-inspect", "--task", "regression", "--csv", f"{LONG}.csv"],
    "quantize-inspect --png": ["quantize-inspect", "--task", "regression", "--png", f"{LONG}.png"],
    "quantize-inspect --store": ["quantize-inspect", "--store", f"{LONG}.db", "r-1"],
    "cost --recipe": ["cost", "--recipe", f"{LONG}.yaml"],
    "cost --store": ["cost", "--recipe", "mxfp4", "--measured", "--store", f"{LONG}.db"],
    "oscillation-report --png": ["oscillation-report", "r-1", "--png", f"{LONG}.png"],
    "oscillation-report --store": ["oscillation-report", "r-1", "--store", f"{LONG}.db"],
    "report --csv": ["report", "--csv", f"{LONG}.csv"],
    "report --plots": ["report", "--plots", LONG],
    "bench quantize --store": [*_bench_cpu("quantize", "64x64"), "--store", f"{LONG}.db"],
    "bench gemm --store": [*_bench_cpu("gemm", "64x64x64"), "--store", f"{LONG}.db"],
    "bench layer --recipes": [*_bench_cpu("layer", "64x64x64"), "--recipes", f"{LONG}.yaml"],
    "bench step --recipes": ["bench", "step", "--device", "cpu", "--recipes", f"{LONG}.yaml"],
    "reproduce study": ["reproduce", f"{LONG}.yaml", "--dry-run"],
    "reproduce --data": ["reproduce", "hu", "--data", LONG, "--dry-run"],
    "reproduce --plots": ["reproduce", "hu", "--plots", LONG, "--dry-run"],
}


@pytest.mark.parametrize("command", LONG_NAMES)
def test_a_file_name_too_long_is_one_line_naming_it(tmp_path, command, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = fp4(tmp_path, *LONG_NAMES[command])
    _one_line(result, "File name too long")
    assert "nnn...nnn" in result.output  # the path, its middle cut out


@pytest.mark.parametrize(
    ("make", "kind"), [("device", "a character device"), ("fifo", "a named pipe")]
)
def test_text_data_that_is_a_device_or_a_pipe_says_what_it_is(tmp_path, make, kind):
    path = Path("/dev/zero") if make == "device" else tmp_path / "fifo"
    if make == "fifo":
        os.mkfifo(path)
    args = ["train", "--task", "gpt", "--size", "debug", "--device", "cpu", "--data", str(path)]
    _one_line(fp4(tmp_path, *args), f"text data {path} is not a file or folder of text: {kind}")
