"""`fp4 bench quantize` and fp4cli.bench: end to end on the CPU, byte accounting, failure notes.

The Triton rows run under TRITON_INTERPRET=1 (`make test` sets it); without it they must carry the
note saying so. Nothing here asserts on a measured time.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from fp4cli.bench import CONFIGS, BenchRow, Case, run_quantize_bench
from fp4cli.bench.quantize import COMPILE_TIMEOUT_S
from fp4cli.bench.traffic import quant_traffic
from fp4cli.cli.main import app
from fp4cli.quant.backend import interpreter_on, triton_available
from fp4cli.store import RunStore

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
TRITON_RUNS = triton_available() and interpreter_on()
SMALL = ["--shapes", "64x64", "--iters", "1", "--device", "cpu"]
ROWS_PER_CASE = [
    ("copy", "torch"),
    ("quantize", "triton"),
    ("quantize", "torch"),
    ("fake-quantize", "triton"),
    ("fake-quantize", "torch"),
    ("dequantize", "triton"),
]


def bench(*args: str) -> Any:
    return runner.invoke(app, ["bench", "quantize", *args], env=WIDE)


def test_quantize_command_prints_and_stores(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    args = [*SMALL, "--configs", "mxfp4,nvfp4", "--backends", "triton,torch"]
    result = bench(*args, "--store", str(path))
    assert result.exit_code == 0, result.output
    for header in ("shape", "config", "kernel", "backend", "GB/s", "x copy", "Triton speedup"):
        assert header in result.stdout
    words = " ".join(result.stdout.split())
    assert "fake-quantize" in words and "nvfp4: the tensor amax pass reads the input" in words
    assert result.stdout.rstrip().endswith(str(path))
    with RunStore(path) as store:
        rows = store.benchmarks("quantize")
    measured = [row for row in rows if row["name"] == "gbps"]
    expected = [(c, k, b) for c in ("mxfp4", "nvfp4") for k, b in ROWS_PER_CASE]
    # a two-level spec's passes timed apart: the amax, and the quantization given it
    expected += [("nvfp4", "tensor-amax", "triton"), ("nvfp4", "quantize-given-amax", "triton")]
    # a 2-D tensor quantized along its rows and down its columns from one read
    expected += [(c, "quantize-pair", "triton") for c in ("mxfp4", "nvfp4")]
    expected += [("nvfp4", "pair-amax", "triton")]  # the pair's amax pass alone
    if not TRITON_RUNS:
        assert "needs CUDA or TRITON_INTERPRET=1" in result.stdout
        expected = [key for key in expected if key[2] != "triton"]
    keys = [
        (r["config"]["config"], r["config"]["kernel"], r["config"]["backend"]) for r in measured
    ]
    assert sorted(keys) == sorted(expected)
    ratios = [row for row in rows if row["name"] == "copy_ratio"]
    assert len(ratios) == len(expected) - 2  # every measurement but the two copies
    assert Counter(row["unit"] for row in rows) == {"GB/s": len(measured), "x": len(ratios)}
    for row in rows:
        assert row["value"] > 0 and row["device"].startswith("cpu")
        assert row["versions"]["torch"] == torch.__version__
        config = row["config"]
        assert (config["shape"], config["dtype"], config["axis"], config["iters"]) == (
            [64, 64], "bf16", -1, 1,
        )  # fmt: skip
        assert config["timing"] == "loop"


@pytest.mark.skipif(not TRITON_RUNS, reason="runs the kernels under TRITON_INTERPRET=1")
def test_interpreted_triton_rows_are_one_call_and_said_so(tmp_path: Path) -> None:
    """Triton's interpreter takes seconds a call (minutes for 5 loops of 20 with a Hadamard
    transform): its rows are timed over one call, stored as such, and the run says why."""
    path = tmp_path / "fp4.db"
    args = ["--shapes", "64x64", "--iters", "3", "--device", "cpu", "--configs", "mxfp4"]
    result = bench(*args, "--backends", "triton,torch", "--store", str(path))
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.split())
    assert "note: TRITON_INTERPRET=1 on the CPU" in words
    assert "3 calls per loop (triton rows, interpreted: 1 call)" in words
    with RunStore(path) as store:
        rows = [row for row in store.benchmarks("quantize") if row["name"] == "gbps"]
    iters = {(r["config"]["kernel"], r["config"]["backend"]): r["config"]["iters"] for r in rows}
    assert {key: n for key, n in iters.items() if key[1] == "triton"} == {
        ("quantize", "triton"): 1, ("fake-quantize", "triton"): 1, ("dequantize", "triton"): 1,
        ("quantize-pair", "triton"): 1,
    }  # fmt: skip
    assert iters[("quantize", "torch")] == iters[("copy", "torch")] == 3


def test_no_store_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "fp4.db"
    result = bench(
        *SMALL, "--configs", "mxfp4", "--backends", "torch", "--store", str(path), "--no-store"
    )
    assert result.exit_code == 0, result.output
    assert "quantize" in result.stdout and "not stored" in result.stdout
    assert not path.exists()


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--shapes", "12x", "shape '12x'"),
        ("--shapes", "0x5", "at least 1"),
        ("--shapes", "axb", "shape 'axb'"),
        ("--configs", "mxfp4,mxfp5", "unknown config 'mxfp5'"),
        ("--dtype", "fp8", "dtype"),
        ("--backends", "triton,cuda", "backends"),
        ("--axis", "2", "axis 2 is out of range"),
        ("--device", "gpu", "device"),
        ("--timing", "wall", "'wall' is not one of loop, graph"),
        ("--timing", "graph", "CUDA graphs need a CUDA device"),
    ],
)
def test_bad_requests_are_one_line_exit_2(
    tmp_path: Path, option: str, value: str, fragment: str
) -> None:
    path = tmp_path / "fp4.db"
    result = bench("--shapes", "8x32", "--device", "cpu", option, value, "--store", str(path))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr
    assert not path.exists()


def test_help_names_every_config_and_the_compile_default() -> None:
    group = runner.invoke(app, ["bench", "--help"], env=WIDE)
    assert group.exit_code == 0 and "quantize" in group.stdout
    command = runner.invoke(app, ["bench", "quantize", "--help"], env=WIDE)
    assert command.exit_code == 0
    for name in CONFIGS:
        assert name in command.stdout
    options = {
        param.name: param
        for param in get_command(app).commands["bench"].commands["quantize"].params
    }
    assert options["compile_timeout"].default == COMPILE_TIMEOUT_S


def test_traffic_of_a_hand_computed_case() -> None:
    mxfp4 = quant_traffic((64, 64), torch.bfloat16, -1, CONFIGS["mxfp4"])
    assert (mxfp4.input, mxfp4.codes, mxfp4.scales, mxfp4.values) == (8192, 2048, 128, 8192)
    assert mxfp4.kernel_bytes("copy") == 16384
    assert mxfp4.kernel_bytes("quantize") == 8192 + 2048 + 128
    assert mxfp4.kernel_bytes("fake-quantize") == 8192 + 8192
    assert mxfp4.kernel_bytes("dequantize") == 2048 + 128 + 8192
    nvfp4 = quant_traffic((64, 64), torch.bfloat16, -1, CONFIGS["nvfp4"])
    assert nvfp4.scales == 64 * 4 + 4  # a UE4M3 byte per 16 values, plus the FP32 tensor scale
    assert nvfp4.kernel_bytes("tensor-amax") == 8192  # one read
    assert nvfp4.kernel_bytes("quantize-given-amax") == nvfp4.kernel_bytes("quantize")
    # The Hadamard transform pads 40 to 64 along the axis: codes, scales and values follow it.
    rht = quant_traffic((48, 40), torch.float16, -1, CONFIGS["mxfp4-rht32-sr"])
    assert (rht.input, rht.codes, rht.scales, rht.values) == (3840, 1536, 96, 6144)
    columns = quant_traffic((64, 48), torch.float32, 0, CONFIGS["mxfp4"])
    assert (columns.input, columns.codes, columns.scales) == (12288, 1536, 96)
    # the pair adds the other direction: 64 rows of 48 values padded to 64 (32 bytes, 2 scales)
    assert columns.across == 64 * 32 + 64 * 2
    assert columns.kernel_bytes("quantize-pair") == 12288 + 1536 + 96 + 64 * 34
    assert rht.across == 40 * 32 + 40 * 2  # 40 columns of 48 rows, transformed to 64
    assert quant_traffic((4, 64, 64), torch.float32, -1, CONFIGS["mxfp4"]).across == 0
    # one direction alone: its own codes + scales, or its values (padded by the transform)
    assert rht.kernel_bytes("pair-rows") == 3840 + 48 * 32 + 48 * 2
    assert rht.kernel_bytes("pair-cols") == 3840 + 40 * 32 + 40 * 2
    assert rht.kernel_bytes("pair-rows-values") == 3840 + 48 * 64 * 2
    assert rht.kernel_bytes("pair-cols-values") == 3840 + 64 * 40 * 2
    for kernel in ("pair-amax", "pair-rows-amax", "pair-cols-amax"):
        assert nvfp4.kernel_bytes(kernel) == 8192  # one read


@pytest.mark.skipif(not TRITON_RUNS, reason="runs the kernels under TRITON_INTERPRET=1")
def test_pair_row_is_both_directions_of_the_kernels() -> None:
    """The quantize-pair call gives each direction's codes of `quantize` along that axis, and
    only 2-D shapes get the row."""
    from fp4cli.bench.calls import SEED, kernel_call
    from fp4cli.kernels.quantization.launch_pair import quantize_pair
    from fp4cli.quant import quantize

    config = CONFIGS["mxfp4-rht32-sr"]
    x = torch.randn(40, 72, generator=torch.Generator().manual_seed(3))
    real = quantize_pair
    results = []

    def keep(*args, **kwargs):
        results.append(real(*args, **kwargs))
        return results[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("fp4cli.kernels.quantization.launch_pair.quantize_pair", keep)
        kernel_call("quantize-pair", "triton", x, config, -1)()
    ((row, col),) = results
    for axis, out in ((1, row), (0, col)):
        want = quantize(x, config.spec, axis, SEED, hadamard=config.hadamard, backend="torch")
        assert torch.equal(out.codes, want.codes) and torch.equal(out.scales, want.scales)
    rows = run_quantize_bench([(2, 32, 32)], ["mxfp4"], backends=["triton"], iters=1,
                              device="cpu", warmup=0, repeats=1)  # fmt: skip
    assert "quantize-pair" not in {r.kernel for r in rows}


@pytest.mark.skipif(not TRITON_RUNS, reason="runs the kernels under TRITON_INTERPRET=1")
@pytest.mark.parametrize("config_name", ["mxfp4-rht32-sr", "nvfp4-eden-rht128"])
def test_pair_direction_rows_are_each_direction_alone(config_name) -> None:
    """pair-rows / pair-cols give `quantize`'s codes along that axis, and the -values kernels
    `fake_quantize`'s values; `--pair-directions` adds the four rows to a 2-D case only."""
    from fp4cli.bench.calls import SEED, kernel_call
    from fp4cli.quant import fake_quantize, quantize

    config = CONFIGS[config_name]
    x = torch.randn(130, 72, generator=torch.Generator().manual_seed(4))
    reference = dict(hadamard=config.hadamard, hadamard_seed=SEED, backend="torch")
    for axis, name in ((1, "rows"), (0, "cols")):
        (out,) = [o for o in kernel_call(f"pair-{name}", "triton", x, config, -1)() if o]
        want = quantize(x, config.spec, axis, SEED, **reference)
        assert torch.equal(out.codes, want.codes) and torch.equal(out.scales, want.scales)
        (out,) = [o for o in kernel_call(f"pair-{name}-values", "triton", x, config, -1)() if o]
        want = fake_quantize(x, config.spec, axis, SEED, out_dtype=x.dtype, **reference)
        assert torch.equal(out.values, want)
    rows = run_quantize_bench([(2, 32, 32), (32, 32)], ["mxfp4"], backends=["triton"],
                              iters=1, device="cpu", warmup=0, repeats=1,
                              pair_directions=True)  # fmt: skip
    kernels = Counter(r.kernel for r in rows)
    assert all(kernels[k] == 1 for k in ("pair-rows", "pair-cols", "pair-rows-values",
                                          "pair-cols-values", "quantize-pair"))  # fmt: skip


@pytest.mark.skipif(not TRITON_RUNS, reason="runs the kernels under TRITON_INTERPRET=1")
@pytest.mark.parametrize("config_name", ["mxfp4-ue5m3-rht32-sr", "nvfp4-rht16-sr", "nvfp4"])
def test_pair_amax_rows_give_each_directions_tensor_amax(config_name) -> None:
    """pair-amax gives both directions' tensor amaxes of `quantize` (of x transformed along
    each axis), pair-rows-amax / pair-cols-amax one."""
    from fp4cli.bench.calls import SEED, kernel_call
    from fp4cli.quant import quantize

    config = CONFIGS[config_name]
    x = torch.randn(96, 72, generator=torch.Generator().manual_seed(5)) * 3
    reference = dict(hadamard=config.hadamard, hadamard_seed=SEED, backend="torch")
    want = [quantize(x, config.spec, axis, SEED, **reference).tensor_amax for axis in (1, 0)]
    row_amax, col_amax = kernel_call("pair-amax", "triton", x, config, -1)()[:2]
    assert torch.equal(row_amax, want[0].reshape(1)) and torch.equal(col_amax, want[1].reshape(1))
    alone = kernel_call("pair-rows-amax", "triton", x, config, -1)()
    assert torch.equal(alone[0], want[0].reshape(1)) and alone[1] is None
    alone = kernel_call("pair-cols-amax", "triton", x, config, -1)()
    assert alone[0] is None and torch.equal(alone[1], want[1].reshape(1))


@pytest.mark.skipif(not TRITON_RUNS, reason="runs the kernels under TRITON_INTERPRET=1")
def test_pair_amax_rows_come_with_a_two_level_configs_2d_cases() -> None:
    """pair-amax for a two-level config's 2-D case; pair-rows-amax and pair-cols-amax with
    `--pair-directions` too."""
    for directions in (False, True):
        rows = run_quantize_bench([(32, 32), (2, 32, 32)], ["nvfp4", "mxfp4"], backends=["triton"],
                                  iters=1, device="cpu", warmup=0, repeats=1,
                                  pair_directions=directions)  # fmt: skip
        kernels = Counter((r.case.config.name, r.kernel) for r in rows if "amax" in r.kernel)
        expected = {("nvfp4", "tensor-amax"): 2, ("nvfp4", "quantize-given-amax"): 2,
                    ("nvfp4", "pair-amax"): 1}  # fmt: skip
        if directions:
            expected |= {("nvfp4", "pair-rows-amax"): 1, ("nvfp4", "pair-cols-amax"): 1}
        assert kernels == expected


def test_row_arithmetic() -> None:
    case = Case((1000, 1000), torch.bfloat16, -1, CONFIGS["mxfp4"])
    row = BenchRow(case, "quantize", "torch", 2_000_000, 1, ms=1.0, copy_gbps=4.0, triton_ms=0.5)
    assert row.gbps == pytest.approx(2.0) and row.copy_ratio == pytest.approx(0.5)
    assert row.triton_speedup == pytest.approx(2.0)
    assert [name for name, _, _ in row.measurements()] == ["gbps", "copy_ratio"]
    triton = BenchRow(case, "quantize", "triton", 2_000_000, 1, ms=0.5, triton_ms=0.5)
    assert triton.triton_speedup is None
    failed = BenchRow(case, "quantize", "compile", 2_000_000, 1, note="out of memory")
    assert failed.gbps is None and failed.measurements() == []


def test_failures_become_notes(monkeypatch: pytest.MonkeyPatch) -> None:
    import fp4cli.bench.calls as calls

    def no_compiler(fn: Any) -> Any:
        raise RuntimeError("no C++ compiler\nmore detail")

    def out_of_memory(*args: Any, **kwargs: Any) -> Any:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4 GiB")

    monkeypatch.setattr(calls.torch, "compile", no_compiler)
    monkeypatch.setattr(calls, "quantize", out_of_memory)
    rows = run_quantize_bench([(8, 32)], ["mxfp4"], backends=("torch", "compile"), iters=1,
                              device="cpu", warmup=0, repeats=1)  # fmt: skip
    notes = {(row.kernel, row.backend): row.note for row in rows}
    assert notes == {
        ("copy", "torch"): None,
        ("quantize", "torch"): "out of memory",
        ("quantize", "compile"): "compile failed: RuntimeError: no C++ compiler",
        ("fake-quantize", "torch"): None,
        ("fake-quantize", "compile"): "compile failed: RuntimeError: no C++ compiler",
    }


def test_a_slow_compile_is_given_up_once_per_config(monkeypatch: pytest.MonkeyPatch) -> None:
    import fp4cli.bench.calls as calls

    def endless_compile(fn: Any) -> Any:
        def compiled(x: torch.Tensor) -> Any:
            time.sleep(30)
            return fn(x)

        return compiled

    monkeypatch.setattr(calls.torch, "compile", endless_compile)
    rows = run_quantize_bench([(8, 32), (16, 32)], ["mxfp4"], backends=("compile",), iters=1,
                              device="cpu", warmup=1, repeats=1, compile_timeout_s=0.2)  # fmt: skip
    notes = [row.note for row in rows if row.backend == "compile"]
    assert (
        notes
        == ["compile timed out (gave up after 0.2 s)"] * 2 + ["not compiled: timed out at 8x32"] * 2
    )


def test_an_interrupted_bench_keeps_the_cases_it_measured(tmp_path: Path, monkeypatch) -> None:
    """Each case is stored as soon as it is measured: stopping during the second case keeps the
    first one's rows, and the command says so on one line and exits 130."""
    from fp4cli.bench import quantize as bench_quantize

    measured_case = bench_quantize._Runner.case_rows
    calls = []

    def interrupted_on_second(self, case):
        calls.append(case)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return measured_case(self, case)

    monkeypatch.setattr(bench_quantize._Runner, "case_rows", interrupted_on_second)
    path = tmp_path / "fp4.db"
    result = bench(*SMALL, "--configs", "mxfp4,nvfp4", "--backends", "torch", "--store", str(path))
    assert result.exit_code == 130
    with RunStore(path) as store:
        rows = store.benchmarks("quantize")
    assert rows and {row["config"]["config"] for row in rows} == {"mxfp4"}
    assert result.output.strip().splitlines()[-1] == (
        f"interrupted: {len(rows)} measurements stored in {path}"
    )


def test_a_sigterm_stops_a_bench_as_ctrl_c_does(tmp_path: Path) -> None:
    """SIGTERM to `fp4 bench`: the cases measured so far are kept, one line says so, exit 130."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "fp4.db"
    command = [sys.executable, "-m", "fp4cli.cli", "bench", "quantize", "--shapes", "512x512",
               "--configs", "mxfp4,nvfp4,mxfp4-ceil", "--backends", "torch", "--device", "cpu",
               "--iters", "10000", "--store", str(path)]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not path.exists() and time.monotonic() < deadline:  # the recorder opens the store
        time.sleep(0.2)
    time.sleep(1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1].startswith("interrupted: ") and "Traceback" not in err


def test_a_call_graph_capture_refuses_gets_a_note() -> None:
    from fp4cli.bench.quantize import _failure_note

    refused = RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
    assert _failure_note("torch", refused, "graph") == (
        "cannot be captured in a CUDA graph (RuntimeError: CUDA error: operation not permitted"
        " when stream is capturing)"
    )
    assert _failure_note("torch", refused, "loop") is None  # raised: not a graph's refusal
    assert _failure_note("torch", RuntimeError("bad shape"), "graph") is None
    assert _failure_note("torch", torch.OutOfMemoryError("capturing"), "graph") == "out of memory"


def test_an_outer_block_config_takes_no_amax_pass(tmp_path: Path) -> None:
    """nvfp4-outer128 finds each outer block's amax in the quantize pass: no tensor-amax or
    quantize-given-amax rows, and the caption's second read names nvfp4 alone."""
    path = tmp_path / "fp4.db"
    result = bench(*SMALL, "--configs", "nvfp4-outer128,nvfp4", "--backends", "triton",
                   "--store", str(path))  # fmt: skip
    assert result.exit_code == 0, result.output
    words = " ".join(result.stdout.split())
    assert " nvfp4: the tensor amax pass reads the input" in words
    assert "nvfp4-outer128, nvfp4:" not in words and "nvfp4-outer128:" not in words
    with RunStore(path) as store:
        kernels = {(r["config"]["config"], r["config"]["kernel"])
                   for r in store.benchmarks("quantize")}  # fmt: skip
    if TRITON_RUNS:
        assert ("nvfp4", "tensor-amax") in kernels
        assert ("nvfp4-outer128", "quantize-pair") in kernels
    assert not any(k[0] == "nvfp4-outer128" and "amax" in k[1] for k in kernels)


def test_pair_directions_flag_adds_the_lone_directions_rows() -> None:
    result = bench(*SMALL, "--configs", "mxfp4", "--backends", "triton", "--pair-directions",
                   "--no-store")  # fmt: skip
    assert result.exit_code == 0, result.output
    for kernel in ("pair-rows", "pair-cols", "pair-rows-values", "pair-cols-values"):
        assert kernel in result.stdout
    plain = bench(*SMALL, "--configs", "mxfp4", "--backends", "triton", "--no-store")
    assert "pair-rows" not in plain.stdout
    for extra, message in (
        (["--backends", "torch"], "add triton to --backends"),
        (["--backends", "triton", "--shapes", "2x32x32"], "times 2-D tensors"),
    ):
        refused = bench(*SMALL, "--configs", "mxfp4", "--pair-directions", *extra)
        assert refused.exit_code != 0 and message in refused.output
