"""`fp4 bench layer` and fp4cli.bench.layer on the CPU: cases, rows, ratios, the bytes saved for
the backward, errors and the store. Nothing here asserts on a measured time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.bench import layer as bench
from fp4cli.cli.main import app
from fp4cli.quant.backend import interpreter_on, triton_available
from fp4cli.store import RunStore
from fp4cli.train.memory import forward_saved_bytes

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
CPU = torch.device("cpu")
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")
KERNELS_RUN = pytest.mark.skipif(
    not (triton_available() and interpreter_on()), reason="needs TRITON_INTERPRET=1 and triton"
)


def run(*args: str) -> Any:
    return runner.invoke(app, ["bench", "layer", *args], env=WIDE)


def test_layer_command_prints_and_stores(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = run("--shapes", "64x32x48", "--recipes", "mxfp4", "--backends", "torch",
                 "--device", "cpu", "--iters", "1", "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    for text in ("64x32x48", "nn.Linear", "reference (backend torch)", "saved MiB", "x bf16",
                 "host us"):  # fmt: skip
        assert text in result.stdout
    with RunStore(path) as store:
        rows = store.benchmarks("layer")
    measured = {(row["config"]["recipe"], row["name"]) for row in rows}
    assert measured == {
        (recipe, name)
        for recipe in ("bf16", "mxfp4")
        for name in (
            "layer_ms",
            "host_us",
            "saved_memory",
            "vs_bf16",
            "host_vs_bf16",
            "saved_vs_bf16",
        )  # fmt: skip
    }
    configs = {row["config"]["recipe"]: row["config"] for row in rows}
    assert configs["mxfp4"]["timing"] == "loop" and configs["mxfp4"]["tokens"] == 64
    assert configs["bf16"]["executor"] == "nn.Linear"


def test_cases_put_bf16_first_on_one_backend() -> None:
    shapes = [(bench.LayerShape(64, 32, 48), ""), (bench.LayerShape(8, 16, 16), "")]
    found = bench.cases(shapes, ["mxfp4", "bf16"], ["triton", "torch"])
    assert [(c.recipe, c.backend) for c in found[:3]] == [
        ("bf16", "triton"), ("mxfp4", "triton"), ("mxfp4", "torch"),
    ]  # fmt: skip
    assert [c.shape_text for c in found] == ["64x32x48"] * 3 + ["8x16x16"] * 3


def test_gemm_modes_multiply_the_quantized_recipes(tmp_path: Path) -> None:
    """--gemm measures each quantized recipe in each mode (bf16 once), labelled and stored."""
    shapes = [(bench.LayerShape(64, 32, 48), "")]
    found = bench.cases(shapes, ["bf16", "mxfp4"], ["torch"], ["dequantized", "fast"])
    assert [(c.label, c.gemm) for c in found] == [
        ("bf16", ""), ("mxfp4 gemm=dequantized", "dequantized"), ("mxfp4 gemm=fast", "fast"),
    ]  # fmt: skip
    layer, _ = bench.build_layer(found[2], CPU)
    assert layer.config.gemm == "fast"
    path = tmp_path / "fp4.db"
    result = run("--shapes", "64x32x48", "--recipes", "mxfp4", "--backends", "torch", "--gemm",
                 "exact", "--device", "cpu", "--iters", "1", "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mxfp4 gemm=exact" in result.stdout
    with RunStore(path) as store:
        stored = {(r["config"]["recipe"], r["config"]["gemm"]) for r in store.benchmarks("layer")}
    assert stored == {("bf16", ""), ("mxfp4", "exact")}


def test_layer_graph_modes_multiply_the_quantized_recipes(monkeypatch: pytest.MonkeyPatch) -> None:
    """--layer-graphs measures each quantized recipe in each mode (bf16 once), each case inside
    its mode; not with --timing graph, whose calls are one CUDA graph already."""
    shapes = [(bench.LayerShape(64, 32, 48), "")]
    found = bench.cases(shapes, ["bf16", "mxfp4"], ["torch"], [""], ["off", "always"])
    assert [c.label for c in found] == ["bf16", "mxfp4", "mxfp4 layer graphs always"]
    cuda = torch.device("cuda")
    with pytest.raises(bench.BenchError, match="not with --timing graph, whose calls are one"):
        bench.check_layer_request(shapes, 1, "graph", cuda, ["off", "auto"])
    bench.check_layer_request(shapes, 1, "loop", cuda, ["off", "auto"])
    seen = []

    def built(case: Any, device: Any) -> Any:
        from fp4cli.replay import graph_mode

        seen.append(graph_mode())
        raise RuntimeError("not built here")

    monkeypatch.setattr(bench, "build_layer", built)
    rows = [bench.measure_case(case, CPU, 1, "loop") for case in found]
    assert seen == ["off", "off", "always"] and all(row.note for row in rows)
    assert rows[2].stored_config()["layer_graphs"] == "always"


def test_named_sets_are_the_gemm_benchmarks_layers() -> None:
    """A GEMM set's M x N x K is the layer K -> N on M tokens, named."""
    shapes = bench.parse_layer_shapes("gpt2-small, 64x32x48")
    assert [(s.tokens, s.in_features, s.out_features) for s, _ in shapes] == [
        (8192, 768, 2304), (8192, 768, 768), (8192, 768, 3072), (8192, 3072, 768), (64, 32, 48),
    ]  # fmt: skip
    assert shapes[0][1] == "gpt2 qkv" and shapes[-1][1] == ""
    case = bench.cases(shapes[:1], ["bf16"], ["triton"])[0]
    assert case.name == "gpt2 qkv" and case.shape_text == "8192x768x2304"


def test_ratios_to_the_baseline() -> None:
    case = bench.LayerCase(bench.LayerShape(64, 32, 48), "bf16", "triton")
    baseline = bench.LayerRow(case, "loop", ms=2.0, saved_mib=4.0)
    row = bench.LayerRow(case, "loop", ms=3.0, saved_mib=1.0, baseline=baseline)
    assert row.vs_baseline == pytest.approx(1.5) and row.saved_vs_baseline == pytest.approx(0.25)
    assert row.tflops == pytest.approx(3 * 2 * 64 * 32 * 48 / 3e9)
    assert bench.LayerRow(case, "loop", note="out of memory").measurements() == []


def test_a_failed_case_gets_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(case: Any, device: Any) -> Any:
        raise RuntimeError("no kernel for this\nsecond line")

    monkeypatch.setattr(bench, "build_layer", broken)
    row = bench.measure_case(
        bench.LayerCase(bench.LayerShape(64, 32, 48), "mxfp4", "torch"), CPU, 1, "loop"
    )
    assert row.ms is None and row.note == "RuntimeError: no kernel for this"


def _saved(recipe: str, backend: str, shape: tuple[int, int, int]) -> tuple[int, str]:
    case = bench.LayerCase(bench.LayerShape(*shape), recipe, backend)
    layer, executor = bench.build_layer(case, CPU)
    x, _ = bench.layer_data(case.shape, CPU)
    return forward_saved_bytes(lambda: bench.layer_forward(layer, x)), executor


def test_bf16_and_the_reference_save_the_bf16_input_and_weight() -> None:
    tokens, in_features, out_features = 96, 64, 32
    expected = 2 * (tokens * in_features + out_features * in_features)
    assert _saved("bf16", "torch", (tokens, in_features, out_features)) == (expected, "nn.Linear")
    saved, executor = _saved("mxfp4", "torch", (tokens, in_features, out_features))
    assert (saved, executor) == (expected, "reference (backend torch)")


SEED_BYTES = 8  # the call's seed, an int64 the backward pass reads


@KERNELS_RUN
def test_the_fast_executor_saves_the_input_packed() -> None:
    """X kept as E2M1 codes (half a byte) and E8M0 scales (a byte per 32) instead of bf16; W's
    grad_input operand as bf16 values; the call's seed (8 bytes)."""
    tokens, in_features, out_features = 256, 64, 32
    baseline, _ = _saved("bf16", "torch", (tokens, in_features, out_features))
    saved, executor = _saved("mxfp4", "triton", (tokens, in_features, out_features))
    assert executor == "fast"
    packed_x = tokens * in_features // 2 + tokens * in_features // 32
    assert saved == packed_x + 2 * out_features * in_features + SEED_BYTES
    assert saved < 0.35 * baseline


@KERNELS_RUN
def test_gemm_fast_keeps_the_weight_operand_packed_too() -> None:
    tokens, in_features, out_features = 256, 64, 32
    case = bench.LayerCase(bench.LayerShape(tokens, in_features, out_features), "mxfp4",
                           "triton", gemm="fast")  # fmt: skip
    layer, executor = bench.build_layer(case, CPU)
    x, _ = bench.layer_data(case.shape, CPU)
    saved = forward_saved_bytes(lambda: bench.layer_forward(layer, x))
    packed_x = tokens * in_features // 2 + tokens * in_features // 32
    packed_w = out_features * in_features // 2 + out_features * in_features // 32
    assert (saved, executor) == (packed_x + packed_w + SEED_BYTES, "fast")


def test_the_triton_backend_needs_kernels_that_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = run("--shapes", "64x32x48", "--device", "cpu", "--no-store")
    assert result.exit_code == 2, result.output
    assert "backends: triton needs triton and a CUDA device" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--shapes", "64x32"], "expected tokens x in_features x out_features"),
        (["--shapes", "gpt3"], "shape 'gpt3': expected tokens x in_features x out_features"),
        (["--shapes", "gpt3"], "or one of square, gpt2-small, llama-7b"),
        (["--shapes", "64x0x32"], "every dimension must be at least 1"),
        (["--shapes", "8192x4096x11008"], "too large to measure on the CPU"),
        (["--timing", "graph"], "CUDA graphs need a CUDA device"),
        (["--timing", "wall"], "timing: 'wall' is not one of loop, graph"),
        (["--backends", "cuda"], "backends: 'cuda' is not one of"),
        (["--recipes", "no-such-recipe"], "no-such-recipe"),
        (["--gemm", "quick"], "gemm: 'quick' is not one of dequantized, exact, fast"),
        (["--layer-graphs", "some"], "layer-graphs: 'some' is not one of off, auto, always, res"),
        (["--layer-graphs", "off,auto"], "layer graphs auto: CUDA graphs need a CUDA device"),
    ],
)
def test_bad_requests_fail_in_one_line(args: list[str], message: str) -> None:
    shapes = [] if "--shapes" in args else ["--shapes", "64x32x48"]
    result = run(*args, *shapes, "--device", "cpu", "--no-store")
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_interleaved_cases_alternate_their_timed_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each shape's cases are built and warmed up first, then one timed loop and one host loop
    of each in turn, 5 rounds; a case that fails to build gets a note, the others are measured
    against their shape's bf16."""
    calls: list[str] = []

    def prepared(row: Any, device: Any) -> Any:
        if row.case.recipe == "tetrajet":
            raise RuntimeError("no room")
        row.executor, row.saved_mib = "fast", 1.0
        return lambda: calls.append(row.case.recipe)

    monkeypatch.setattr(bench, "prepared_call", prepared)
    shapes = [(bench.LayerShape(64, 32, 48), ""), (bench.LayerShape(32, 32, 32), "")]
    found = bench.cases(shapes, ["bf16", "mxfp4", "tetrajet"], ["torch"])
    rows = bench.run_layer_bench(found, CPU, 2, interleave=True)
    first_shape = calls[: 6 + 2 * 5 * 4]  # warm-up 3 each, then per round 2 + 2 calls each
    assert first_shape[:6] == ["bf16"] * 3 + ["mxfp4"] * 3
    assert (
        first_shape[6:]
        == ["bf16"] * 4
        + ["mxfp4"] * 4
        + ["bf16"] * 4
        + ["mxfp4"] * 4
        + (["bf16"] * 4 + ["mxfp4"] * 4) * 3
    )
    assert len(calls) == 2 * len(first_shape)
    bf16, mxfp4, tetrajet = rows[:3]
    assert bf16.ms is not None and bf16.host_us is not None and mxfp4.ms is not None
    assert mxfp4.baseline is bf16 and rows[4].baseline is rows[3]
    assert mxfp4.executor == "fast" and mxfp4.saved_vs_baseline == 1.0
    assert tetrajet.ms is None and tetrajet.note == "RuntimeError: no room"


def test_interleave_takes_the_loop_timing() -> None:
    shapes = [(bench.LayerShape(64, 32, 48), "")]
    with pytest.raises(bench.BenchError, match="--interleave: with --timing loop"):
        bench.check_layer_request(shapes, 1, "graph", torch.device("cuda"), ["off"], True)
    bench.check_layer_request(shapes, 1, "loop", CPU, ["off"], True)


def test_interleaved_layer_command_prints_every_case(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = run("--shapes", "64x32x48", "--recipes", "bf16,mxfp4", "--backends", "torch",
                 "--device", "cpu", "--iters", "1", "--interleave",
                 "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "reference (backend torch)" in result.stdout and "nn.Linear" in result.stdout
    with RunStore(path) as store:
        measured = {(row["config"]["recipe"], row["name"]) for row in store.benchmarks("layer")}
    assert {("bf16", "host_us"), ("mxfp4", "layer_ms"), ("mxfp4", "host_vs_bf16")} <= measured
