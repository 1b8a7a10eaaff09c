"""`fp4 bench step` and fp4cli.bench.step on the CPU: cases, rows, ratios, the batch search,
errors and the store. Nothing here asserts on a measured time."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.bench import step as bench
from fp4cli.cli.main import app
from fp4cli.linear import quantized_layers
from fp4cli.quant.backend import interpreter_on
from fp4cli.store import RunStore
from fp4cli.train.memory import saved_bytes

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


def run(*args: str) -> Any:
    return runner.invoke(app, ["bench", "step", *args], env=WIDE)


def test_step_command_prints_and_stores(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = run("--tasks", "gpt", "--size", "debug", "--device", "cpu", "--modes", "eager",
                 "--recipes", "mxfp4,bf16", "--backends", "torch", "--steps", "1",
                 "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    for text in ("ms/step", "x bf16", "peak GiB", "gpt debug x8", "8 reference"):
        assert text in result.stdout
    with RunStore(path) as store:
        rows = store.benchmarks("step")
    measured = {(row["config"]["recipe"], row["name"]) for row in rows}
    assert {("bf16", "step_ms"), ("mxfp4", "step_ms"), ("mxfp4", "vs_bf16")} <= measured
    assert {("bf16", "saved_memory"), ("mxfp4", "saved_vs_bf16")} <= measured
    assert ("bf16", "peak_memory") not in measured  # no CUDA: no peak memory
    assert all(row["config"]["size"] == "debug" for row in rows)


def test_cases_put_bf16_first_on_one_backend() -> None:
    found = bench.cases(["gpt", "vit"], None, None, ["mxfp4", "bf16"], ["triton", "torch"],
                        ["eager", "graph"])  # fmt: skip
    first = found[0]
    assert (first.task, first.size, first.batch, first.recipe) == ("gpt", "gpt2-small", 8, "bf16")
    assert [c.recipe for c in found[:3]] == ["bf16", "mxfp4", "mxfp4"]
    assert sum(c.recipe == "bf16" for c in found) == 4  # 2 tasks x 2 modes, one backend each
    assert {c.size for c in found if c.task == "vit"} == {"deit-small"}


def test_gemm_modes_multiply_the_quantized_recipes(tmp_path: Path) -> None:
    found = bench.cases(["gpt"], "debug", None, ["mxfp4"], ["torch"], ["eager"], ["exact", "fast"])
    assert [c.label for c in found] == ["bf16", "mxfp4 gemm=exact", "mxfp4 gemm=fast"]
    runner, _, _ = bench.build_step(found[2], torch.device("cpu"))
    layers = quantized_layers(runner.model).values()
    assert layers and {layer.config.gemm for layer in layers} == {"fast"}
    path = tmp_path / "fp4.db"
    result = run("--tasks", "gpt", "--size", "debug", "--device", "cpu", "--modes", "eager",
                 "--recipes", "mxfp4", "--backends", "torch", "--gemm", "fast", "--steps", "1",
                 "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mxfp4 gemm=fast" in result.stdout
    with RunStore(path) as store:
        stored = {(r["config"]["recipe"], r["config"]["gemm"]) for r in store.benchmarks("step")}
    assert stored == {("bf16", ""), ("mxfp4", "fast")}


def test_layer_graph_modes_multiply_the_quantized_recipes(monkeypatch) -> None:
    found = bench.cases(["gpt"], "debug", None, ["mxfp4"], ["torch"], ["eager"], [""], [False],
                        ["off", "always"])  # fmt: skip
    assert [c.label for c in found] == ["bf16", "mxfp4", "mxfp4 layer graphs always"]
    cuda = torch.device("cuda")
    with pytest.raises(bench.BenchError, match="not with modes graph, whose step is one CUDA"):
        bench.check_step_request(["eager", "graph"], 5, cuda, [False], ["off", "auto"])
    bench.check_step_request(["eager", "compile"], 5, cuda, [False], ["off", "auto"])
    seen = []

    def built(case, device):
        from fp4cli.replay import graph_mode

        seen.append(graph_mode())
        raise RuntimeError("not built here")

    monkeypatch.setattr(bench, "build_step", built)
    for case in found:
        assert bench.measure_case(case, torch.device("cpu"), 1).note
    assert seen == ["off", "off", "always"]


def test_ratios_to_the_baseline() -> None:
    case = bench.StepCase("gpt", "debug", 8, "bf16", "triton", "eager")
    baseline = bench.StepRow(case, ms=10.0, peak_gib=2.0)
    row = bench.StepRow(case, ms=13.0, peak_gib=1.5, saved_gib=0.5, baseline=baseline)
    assert row.vs_baseline == pytest.approx(1.3) and row.memory_vs_baseline == pytest.approx(0.75)
    assert row.saved_vs_baseline is None  # the baseline has no saved bytes
    baseline.saved_gib = 2.0
    assert row.saved_vs_baseline == pytest.approx(0.25)
    assert bench.StepRow(case, note="out of memory", baseline=baseline).measurements() == []


@pytest.mark.skipif(not interpreter_on(), reason="the fast executor needs TRITON_INTERPRET=1 here")
def test_saved_bytes_show_the_packed_activations() -> None:
    """One forward's saved tensors: the fast executor keeps X packed, the reference (torch
    backend) keeps what bf16 keeps."""
    saved = {}
    for recipe, backend in (("bf16", "torch"), ("mxfp4", "torch"), ("mxfp4", "triton")):
        case = bench.StepCase("gpt", "debug", 8, recipe, backend, "eager")
        runner, batches, _ = bench.build_step(case, torch.device("cpu"))
        model, loss_of = runner.model, runner.loss_of
        saved[recipe, backend] = saved_bytes(model, loss_of, batches[0], torch.device("cpu"))
    assert saved["mxfp4", "torch"] == saved["bf16", "torch"]
    assert saved["mxfp4", "triton"] < 0.85 * saved["bf16", "torch"]


def test_failed_cases_get_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(case: Any, device: Any) -> Any:
        raise RuntimeError("no kernel for this\nsecond line")

    monkeypatch.setattr(bench, "build_step", broken)
    case = bench.StepCase("gpt", "debug", 8, "mxfp4", "triton", "eager")
    row = bench.measure_case(case, torch.device("cpu"), 1)
    assert row.ms is None and row.note == "RuntimeError: no kernel for this"

    def silent(case: Any, device: Any) -> Any:
        raise RuntimeError()  # no message: the note is the error's type

    monkeypatch.setattr(bench, "build_step", silent)
    assert bench.measure_case(case, torch.device("cpu"), 1).note == "RuntimeError"


def test_interleaved_cases_alternate_their_timed_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every case of a task and mode is built first, then one loop of each in turn, 3 rounds;
    a case that fails to build gets a note and the others are measured."""
    calls: list[str] = []

    class Runner:
        def __init__(self, name: str) -> None:
            self.name, self.model, self.loss_of = name, None, None

        def __call__(self, batch: Any) -> None:
            calls.append(self.name)

    def build(case: Any, device: Any) -> Any:
        if case.recipe == "tetrajet":
            raise RuntimeError("no room")
        return Runner(case.recipe), [0, 1], "48 fast"

    monkeypatch.setattr(bench, "build_step", build)
    monkeypatch.setattr("fp4cli.train.memory.saved_bytes", lambda *args: 2**29)
    case_list = bench.cases(["gpt"], "debug", 8, ["bf16", "mxfp4", "tetrajet"], ["triton"],
                            ["eager"])  # fmt: skip
    rows = bench.run_step_bench(case_list, torch.device("cpu"), 2, interleave=True)
    warm_up, timed = calls[:12], calls[12:]
    assert warm_up == ["bf16"] * 6 + ["mxfp4"] * 6
    assert timed == ["bf16", "bf16", "mxfp4", "mxfp4"] * 3
    bf16, mxfp4, tetrajet = rows
    assert bf16.ms is not None and mxfp4.ms is not None and mxfp4.baseline is bf16
    assert mxfp4.saved_gib == 0.5 and mxfp4.executors == "48 fast"
    assert tetrajet.ms is None and tetrajet.note == "RuntimeError: no room"


def test_interleaved_compiled_cases_run_under_a_limit_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Compiled cases held at once: their loops run under torch's recompilation limit times the
    cases, restored after; no saved bytes (the compiler's own)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    alone = getattr(config, name)
    limits: list[int] = []

    class Runner:
        model, loss_of = None, None

        def __call__(self, batch: Any) -> None:
            limits.append(getattr(config, name))

    monkeypatch.setattr(bench, "build_step", lambda case, device: (Runner(), [0, 1], "8 fast"))
    monkeypatch.setattr("fp4cli.train.memory.saved_bytes", lambda *args: 2**29)
    case_list = bench.cases(["gpt"], "debug", 8, ["bf16", "mxfp4", "tetrajet"], ["triton"],
                            ["compile"])  # fmt: skip
    rows = bench.run_step_bench(case_list, torch.device("cpu"), 1, interleave=True)
    assert limits and set(limits) == {alone * 3}
    assert getattr(config, name) == alone
    assert all(row.ms is not None and row.saved_gib is None for row in rows)


def test_compiled_models_held_together_each_keep_their_graph() -> None:
    """Past torch's recompilation limit a further model of the class runs eagerly; within
    `compiled_together` each is compiled."""
    import torch._dynamo

    class Scaled(torch.nn.Module):
        def __init__(self, factor: int) -> None:
            super().__init__()
            self.factor = factor

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.factor

    compiled: list[Any] = []

    def backend(graph: Any, inputs: Any) -> Any:
        compiled.append(graph)
        return graph.forward

    x = torch.ones(2)
    for together in (False, True):
        torch._dynamo.reset()
        compiled.clear()
        models = [torch.compile(Scaled(factor), backend=backend) for factor in range(12)]
        with bench.compiled_together(len(models)) if together else contextlib.nullcontext():
            outputs = [model(x) for model in models]
        assert [float(y[0]) for y in outputs] == list(range(12))
        assert (len(compiled) == 12) == together
    torch._dynamo.reset()


def test_interleaved_step_command_prints_every_case(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = run("--tasks", "gpt", "--size", "debug", "--device", "cpu", "--modes", "eager",
                 "--recipes", "mxfp4,bf16", "--backends", "torch", "--steps", "1",
                 "--interleave", "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "8 reference" in result.stdout
    with RunStore(path) as store:
        measured = {(row["config"]["recipe"], row["name"]) for row in store.benchmarks("step")}
    assert {("bf16", "step_ms"), ("mxfp4", "step_ms"), ("mxfp4", "vs_bf16")} <= measured


@pytest.mark.parametrize(("fits_below", "limit", "expected"), [(100, 1024, 96), (20, 1024, 20),
                                                               (5000, 64, 64)])  # fmt: skip
def test_max_batch_search(monkeypatch, fits_below, limit, expected) -> None:
    tried = []

    def measure(case: Any, device: Any, steps: int) -> Any:
        tried.append(case.batch)
        note = None if case.batch <= fits_below else "out of memory"
        return bench.StepRow(case, ms=1.0, note=note)

    monkeypatch.setattr(bench, "measure_case", measure)
    found = bench.max_batch("gpt", "debug", "bf16", "triton", torch.device("cpu"), 8, limit)
    assert found.max_batch is not None
    assert expected - expected // 8 <= found.max_batch <= expected <= fits_below
    assert (found.note is not None) == (expected == limit)
    assert len(tried) <= 12


def test_max_batch_reports_a_start_that_does_not_fit(monkeypatch) -> None:
    def out_of_memory(case: Any, device: Any, steps: int) -> Any:
        return bench.StepRow(case, note="out of memory")

    monkeypatch.setattr(bench, "measure_case", out_of_memory)
    found = bench.max_batch("gpt", "debug", "bf16", "triton", torch.device("cpu"), 8, 64)
    assert found.max_batch is None and found.note == "batch 8 does not fit"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--modes", "graph", "--device", "cpu"], "CUDA graphs need a CUDA device"),
        (["--modes", "jit"], "modes: 'jit' is not one of"),
        (["--backends", "cuda"], "backends: 'cuda' is not one of"),
        (["--tasks", "chess", "--modes", "eager"], "unknown task 'chess'; known: "),
        (
            ["--tasks", "gpt", "--size", "huge", "--modes", "eager"],
            "has no size 'huge'; sizes: debug, default, gpt2-small, gpt-345m, wide-2048",
        ),
        (["--recipes", "no-such-recipe", "--modes", "eager"], "no-such-recipe"),
        (["--recipes", "no-such-recipe"], "no-such-recipe"),  # named before the device's lack
        (["--steps", "0"], "--steps"),
        (["--recompute", "maybe"], "recompute: 'maybe' is not one of off, on"),
        (["--modes", "compile", "--recompute", "on"], "recompute: not with modes compile"),
        (["--parallel", "ddp"], "--parallel and --gather: with --nproc-per-node 2 or more"),
        (["--nproc-per-node", "2"], "modes graph: steps on several processes run eagerly"),
        (["--nproc-per-node", "2", "--modes", "eager", "--parallel", "zero"], "parallel: must"),
        (["--nproc-per-node", "2", "--modes", "eager", "--gather", "fp8"], "gather: packed, bf16"),
        (["--nproc-per-node", "2", "--modes", "eager", "--max-batch", "bf16"], "one process"),
        (["--layer-graphs", "some"], "layer-graphs: 'some' is not one of off, auto, always, res"),
        (["--modes", "eager", "--layer-graphs", "off,auto"], "auto: CUDA graphs need a CUDA"),
        (["--interleave", "--layer-graphs", "always"], "--interleave: not with --layer-graphs"),
        (["--interleave", "--modes", "eager", "--nproc-per-node", "2"], "on one process"),
    ],
)
def test_bad_requests_fail_in_one_line(args: list[str], message: str) -> None:
    device = [] if "--device" in args else ["--device", "cpu"]
    result = run(*args, *device, "--no-store")
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_the_benchmark_sizes_are_training_sizes() -> None:
    """GPT-2 small's and DeiT-Small's shapes, trainable with `fp4 train --size`."""
    from fp4cli.tasks import gpt, vit
    from fp4cli.tasks.base import task_defaults

    model = gpt.SIZES["gpt2-small"].model
    assert (model.n_layer, model.n_embd, model.n_head, model.block_size) == (12, 768, 12, 1024)
    deit = vit.SIZES["deit-small"]
    assert (deit.depth, deit.embed_dim, deit.num_heads, deit.image_size // deit.patch_size) == (
        12, 384, 6, 14,
    )  # fmt: skip
    for task, size in bench.BENCH_SIZES.items():
        assert task_defaults(task, size[0]) is not None


def test_a_step_on_two_processes_gathers_fp4_and_bf16_side_by_side(tmp_path: Path) -> None:
    """Under torchrun (gloo on the CPU): bf16, then nvfp4 with its weights gathered packed and
    in BF16; rank 0 alone stores the rows, the gather's bytes and the scaling among them."""
    import os
    import subprocess
    import sys

    path = tmp_path / "fp4.db"
    command = [sys.executable, "-m", "fp4cli.cli", "bench", "step", "--tasks", "gpt", "--size",
               "debug", "--recipes", "bf16,nvfp4", "--backends", "torch", "--modes", "eager",
               "--steps", "1", "--nproc-per-node", "2", "--device", "cpu", "--store",
               str(path)]  # fmt: skip
    env = {**os.environ, "COLUMNS": "250", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2 processes, FSDP2" in done.stdout
    assert "nvfp4 gather packed" in done.stdout and "nvfp4 gather bf16" in done.stdout
    with RunStore(path) as store:
        rows = store.benchmarks("step")
    gathers = {
        row["config"]["gather"]: row["value"] for row in rows if row["name"] == "gather_vs_bf16"
    }
    assert gathers["packed"] == pytest.approx(0.252, abs=1e-3) and gathers["bf16"] == 1.0
    assert {row["config"]["processes"] for row in rows} == {2}
    scaling = [row for row in rows if row["name"] == "scaling"]
    assert len(scaling) == 3 and all(row["value"] > 0 for row in scaling)
