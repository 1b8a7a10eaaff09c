"""`fp4 bench gemm` and fp4cli.bench.gemm on the CPU: shapes, rows, errors, notes, the store.

The kernels' rows run under TRITON_INTERPRET=1 (`make test` sets it); without it they carry the
note saying why. Nothing here asserts on a measured time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.bench.configs import BenchError
from fp4cli.bench.gemm import GemmRow, run_gemm_bench
from fp4cli.bench.gemm_cases import SHAPE_SETS, GemmShape, parse_gemm_shapes, parse_impls
from fp4cli.cli.main import app
from fp4cli.quant.backend import interpreter_on, triton_available
from fp4cli.store import RunStore

runner = CliRunner()
WIDE = {"COLUMNS": "220"}
KERNELS = triton_available() and interpreter_on()
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning:triton.runtime.interpreter")


def bench(*args: str) -> Any:
    return runner.invoke(app, ["bench", "gemm", *args], env=WIDE)


def test_gemm_command_prints_and_stores(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    impls = "cublas-bf16,cublas-fp8,exact,fast"
    result = bench("--shapes", "40x32x64", "--impls", impls, "--device", "cpu",
                   "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    for header in ("M x N x K", "impl", "TFLOP/s", "x bf16", "rel err", "beyond bf16"):
        assert header in result.stdout
    assert "needs a GPU with FP8 tensor cores" in result.stdout
    with RunStore(path) as store:
        rows = store.benchmarks("gemm")
    measured = {(row["config"]["impl"], row["name"]) for row in rows}
    expected_impls = ["cublas-bf16"] + (["exact", "fast"] if KERNELS else [])
    for impl in expected_impls:
        for name in ("ms", "tflops", "x_cublas_bf16", "rel_error", "error_beyond_rounding"):
            assert (impl, name) in measured
    assert not any(impl == "cublas-fp8" for impl, _ in measured)
    assert all(row["config"]["m"] == 40 and row["config"]["k"] == 64 for row in rows)
    assert all(row["config"]["timing"] == "do-bench" for row in rows)
    if not KERNELS:
        assert "needs triton and CUDA" in result.stdout


def test_no_store_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = bench("--shapes", "16x16x32", "--impls", "cublas-bf16", "--device", "cpu",
                   "--no-store", "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "not stored" in result.stdout and not path.exists()


@pytest.mark.parametrize(
    "option, value, fragment",
    [
        ("--shapes", "64x64", "expected MxNxK"),
        ("--shapes", "gpt3", "square, gpt2-small, llama-7b"),
        ("--shapes", "0x8x8", "expected MxNxK"),
        ("--impls", "cublas-bf16,cutlass", "'cutlass' is not one of"),
        ("--device", "gpu", "device"),
        ("--shapes", "square", "too large to measure on the CPU"),
        ("--timing", "loop", "'loop' is not one of do-bench, graph"),
        ("--timing", "graph", "CUDA graphs need a CUDA device; use --timing do-bench"),
        ("--outlier-channels", "33", "outliers: 33 channels, but shape 8x8x32 has K = 32"),
        ("--outlier-channels", "-1", "--outlier-channels"),
    ],
)
def test_bad_requests_are_one_line_exit_2(tmp_path: Path, option, value, fragment) -> None:
    path = tmp_path / "fp4.db"
    args = {"--shapes": "8x8x32", "--impls": "cublas-bf16", "--device": "cpu", option: value}
    result = bench(*[item for pair in args.items() for item in pair], "--store", str(path))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr
    assert not path.exists()


def test_shape_sets_and_parsing() -> None:
    assert [s.text for s in parse_gemm_shapes("square")] == [
        "4096x4096x4096", "8192x8192x8192", "16384x16384x16384"
    ]  # fmt: skip
    gpt2 = parse_gemm_shapes("gpt2-small")
    assert {(s.n, s.k) for s in gpt2} == {(2304, 768), (768, 768), (3072, 768), (768, 3072)}
    assert all(s.m == 8192 for shapes in SHAPE_SETS.values() for s in shapes if s.m != s.k)
    llama = parse_gemm_shapes("llama-7b,128x64x32")
    assert (llama[2].n, llama[2].k) == (11008, 4096) and llama[-1] == GemmShape(128, 64, 32)
    assert parse_impls("exact,fast,exact") == ["exact", "fast"]
    with pytest.raises(BenchError):
        parse_impls("")


def test_row_arithmetic() -> None:
    row = GemmRow(GemmShape(1000, 1000, 1000), "exact", ms=2.0, baseline_ms=3.0, dot_scaled_ms=8.0)
    assert row.tflops == pytest.approx(1.0)  # 2e9 flop in 2 ms
    assert row.vs_baseline == pytest.approx(1.5) and row.vs_dot_scaled == pytest.approx(4.0)
    assert GemmRow(GemmShape(8, 8, 8), "fast", note="x").measurements() == []


@pytest.mark.skipif(not KERNELS, reason="the kernels run under TRITON_INTERPRET=1")
def test_errors_are_measured_against_float64() -> None:
    rows = run_gemm_bench([GemmShape(24, 16, 96)], ["cublas-bf16", "exact"], torch.device("cpu"))
    baseline, exact = rows
    # both hold the same bf16-rounded float32 products; cuBLAS-on-CPU rounds like float64
    assert baseline.beyond_rounding == 0.0
    assert exact.rel_error is not None and 0 < exact.rel_error < 1e-2
    assert exact.baseline_ms == baseline.ms


def test_outlier_channels_widen_the_rows_of_a() -> None:
    """The chosen channels of A are the scale times larger; B and the other channels are as
    without outliers, and the rows record it."""
    import fp4cli.bench.gemm as gemm_bench

    shape, cpu = GemmShape(16, 8, 256), torch.device("cpu")
    plain_a, plain_b = gemm_bench._operands(shape, cpu, gemm_bench.MXFP4)
    outliers = gemm_bench.Outliers(4, 256.0)
    a, b = gemm_bench._operands(shape, cpu, gemm_bench.MXFP4, outliers)
    channels = gemm_bench.outlier_channels(256, 4, cpu)
    assert channels.unique().numel() == 4
    assert torch.equal(b.dequantize(), plain_b.dequantize())
    wide = a.dequantize()[:, channels].abs().amax()
    assert wide > 50 * plain_a.dequantize()[:, channels].abs().amax()
    rows = run_gemm_bench([shape], ["cublas-bf16"], cpu, outliers=outliers)
    assert rows[0].stored_config()["outliers"] == "4 channels x256"
    assert rows[0].rel_error is not None and rows[0].rel_error < 1e-2
    with pytest.raises(BenchError, match="positive finite scale"):
        run_gemm_bench([shape], ["cublas-bf16"], cpu, outliers=gemm_bench.Outliers(4, 0.0))


def test_baseline_is_timed_first_and_last_and_the_faster_counts(monkeypatch) -> None:
    import fp4cli.bench.gemm as gemm_bench

    times = iter([5.0, 4.0])
    monkeypatch.setattr(gemm_bench, "_time_ms", lambda *args: next(times))
    rows = run_gemm_bench(
        [GemmShape(16, 16, 32)], ["cublas-bf16", "cublas-fp8"], torch.device("cpu")
    )
    baseline = rows[0]
    assert (baseline.first_ms, baseline.ms) == (5.0, 4.0)
    assert ("first_ms", 5.0, "ms") in baseline.measurements()
    assert rows[1].note == "needs a GPU with FP8 tensor cores"


def test_a_call_graph_capture_refuses_gets_a_note(monkeypatch) -> None:
    import fp4cli.bench.gemm as gemm_bench

    def refuse(*args):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(gemm_bench, "_time_ms", refuse)
    rows = gemm_bench._shape_rows(GemmShape(16, 16, 32), ["cublas-bf16"], torch.device("cpu"),
                                  1, "graph")  # fmt: skip
    assert rows[0].ms is None and rows[0].note.startswith("cannot be captured in a CUDA graph")
    with pytest.raises(RuntimeError, match="capturing"):  # timed another way: an error
        gemm_bench._shape_rows(GemmShape(16, 16, 32), ["cublas-bf16"], torch.device("cpu"),
                               1, "do-bench")  # fmt: skip
