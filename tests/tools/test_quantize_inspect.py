"""`fp4 quantize-inspect`: hand-checked measurements, the three sources, outputs and errors."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.analysis.quant_inspect import (
    TensorReport,
    make_variants,
    measure,
    summarize,
    weight_tensors,
)
from fp4cli.cli.main import app
from fp4cli.quant import QuantSpec, fake_quantize
from fp4cli.store import RunStore
from fp4cli.techniques.hadamard import rht
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def variant(preset: str, hadamard: int | None = None):
    return make_variants([preset], [hadamard] if hadamard else [])[-1]


def grid_blocks(exponents: list[float]) -> torch.Tensor:
    """One row of 32 E2M1 grid values (signs alternating, +-6 in each half) per exponent k,
    times 2^k: every block's amax is 6 * 2^k."""
    pattern = E2M1_GRID.repeat(4) * torch.tensor([1.0, -1.0]).repeat(16)  # (32,)
    return torch.exp2(torch.tensor(exponents))[:, None] * pattern  # (rows, 32)


@pytest.mark.parametrize("preset", ["mxfp4", "mxfp4-ceil", "nvfp4", "mxfp4-ue5m3"])
def test_grid_values_times_powers_of_two_are_exact(preset):
    m = measure(grid_blocks([-3, 0, 2, 5]), variant(preset))
    assert m is not None
    assert m.rel_mse == 0 and m.snr_db > 300
    assert m.clipped == 0 and m.flushed == 0


def test_all_zero_tensor():
    m = measure(torch.zeros(4, 64), variant("mxfp4"))
    assert m is not None
    assert (m.rel_mse, m.clipped, m.flushed) == (0, 0, 0)
    assert m.scale_exponents == {} and m.zero_blocks == 8 and m.nan_blocks == 0


def test_a_tensor_of_nan_has_no_error_not_an_exact_one():
    m = measure(torch.full((4, 64), math.nan), variant("mxfp4"))
    assert m is not None and m.nonfinite == 256 and m.nan_blocks == 8
    assert all(math.isnan(getattr(m, name)) for name in ("rel_mse", "snr_db", "clipped", "flushed"))


def test_one_inf_leaves_the_error_undefined_and_the_shares_measured():
    x = torch.ones(4, 64)
    x[0, 0] = math.inf
    m = measure(x, variant("mxfp4"))
    assert m is not None and m.nonfinite == 1
    assert math.isnan(m.rel_mse) and math.isnan(m.snr_db)
    assert m.clipped == 0 and m.flushed == 0
    summary = summarize([_report("inf", x), _report("ones", torch.ones(4, 64))], [variant("mxfp4")])
    assert summary["mxfp4"].nonfinite == 1 and math.isnan(summary["mxfp4"].rel_mse)


def _report(name: str, x: torch.Tensor) -> TensorReport:
    report = TensorReport(name, tuple(x.shape), False)
    report.measurements = {"mxfp4": measure(x, variant("mxfp4"))}
    return report


def test_one_outlier_per_block_flushes_the_rest():
    x = torch.ones(8, 64)
    x[:, ::32] = 1024.0  # scale 2^(10 - 2): 1 / 256 rounds to 0
    for preset in ("mxfp4", "mxfp4-ceil"):
        m = measure(x, variant(preset))
        assert m is not None
        assert m.flushed == pytest.approx(31 / 32) and m.clipped == 0
        assert m.rel_mse == pytest.approx(31 / (1024**2 + 31))


def test_floor_rule_clips_what_ceil_keeps():
    x = torch.ones(4, 32)
    x[:, 0] = 7.0  # floor: scale 2^(2 - 2) = 1, and 7 > 6 saturates; ceil: scale 2
    assert measure(x, variant("mxfp4")).clipped == pytest.approx(1 / 32)
    assert measure(x, variant("mxfp4-ceil")).clipped == 0


def test_scale_exponent_histogram_of_known_block_scales():
    x = grid_blocks([-3, 0, 2, 2])
    assert measure(x, variant("mxfp4")).scale_exponents == {-3: 1, 0: 1, 2: 2}
    # Two-level: the block scale over the tensor scale, so the same exponents (per 16 values).
    nvfp4 = measure(x, variant("nvfp4"))
    assert nvfp4.scale_exponents == {-3: 2, 0: 2, 2: 4} and nvfp4.tensor_scale == 112.0
    # fp8-e4m3 per row: amax / 448 = 6 * 2^k / 448, floor(log2) = k - 7.
    assert measure(x, variant("fp8-e4m3")).scale_exponents == {-10: 1, -7: 1, -5: 2}


def test_hadamard_error_is_measured_in_the_rotated_domain():
    torch.manual_seed(0)
    w = torch.randn(8, 64)
    m = measure(w, variant("mxfp4", 32))
    rotated = rht(w, -1, 32, 0)
    quantized = fake_quantize(w, QuantSpec.preset("mxfp4"), hadamard=32, hadamard_seed=0)
    error = (quantized - rotated).square().sum() / rotated.square().sum()
    assert m.rel_mse == pytest.approx(float(error), rel=1e-6)
    assert measure(torch.randn(8, 48), variant("mxfp4", 32)) is None  # 48: not whole blocks


def test_summary_weights_by_elements_and_skips_n_a():
    small, large = grid_blocks([0]), torch.ones(4, 64)
    large[:, ::32] = 1024.0
    variants = make_variants(["mxfp4"], [64])
    reports = []
    for name, x in (("small", small), ("large", large)):
        report = TensorReport(name, tuple(x.shape), False)
        report.measurements = {v.label: measure(x, v) for v in variants}
        reports.append(report)
    summary = summarize(reports, variants)
    assert summary["mxfp4"].flushed == pytest.approx((256 * 31 / 32) / (32 + 256))
    rel_mse = 256 * (31 / (1024**2 + 31)) / (32 + 256)  # the exact tensor adds 0
    assert summary["mxfp4"].rel_mse == pytest.approx(rel_mse)
    assert summary["mxfp4"].snr_db == pytest.approx(-10 * math.log10(rel_mse), rel=1e-5)
    assert summary["mxfp4+rht64"].tensors == 1 and summary["mxfp4+rht64"].elements == 256


def test_weight_tensors_pick_2d_weights_and_mark_skipped_layers():
    state = {
        "blocks.0.fc.weight": torch.zeros(4, 8),
        "blocks.0.fc.bias": torch.zeros(4),
        "blocks.0.fc.weight_ema": torch.zeros(4, 8),
        "conv.weight": torch.zeros(4, 4, 3, 3),
        "head.weight": torch.zeros(2, 8),
    }
    picked = weight_tensors(state, ["head"])
    assert [(t.name, t.high_precision) for t in picked] == [
        ("blocks.0.fc.weight", False),
        ("head.weight", True),
    ]


def invoke(*args: str):
    return runner.invoke(app, ["quantize-inspect", *args], env=WIDE)


def test_file_source_json(tmp_path):
    path = tmp_path / "tensors.pt"
    tensors = {"a": torch.randn(16, 64), "b": torch.randn(16), "c": {"d": torch.randn(2, 4, 32)}}
    torch.save({**tensors, "n": torch.arange(64).reshape(8, 8)}, path)
    result = invoke("--file", str(path), "--spec", "mxfp4", "--hadamard", "64", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [t["name"] for t in data["tensors"]] == ["a", "c.d"]
    assert [v["label"] for v in data["variants"]] == ["mxfp4", "mxfp4+rht64"]
    first = data["tensors"][0]["results"]["mxfp4"]
    assert set(first) >= {"rel_mse", "snr_db", "clipped", "flushed", "scale_exponents"}
    assert sum(first["scale_exponents"].values()) == 16 * 2
    assert data["tensors"][1]["results"]["mxfp4+rht64"] is None
    assert data["summary"]["mxfp4+rht64"]["tensors"] == 1


def test_single_tensor_file_table_csv_and_png(tmp_path):
    path, png, table = tmp_path / "w.pt", tmp_path / "h.png", tmp_path / "t.csv"
    torch.save(grid_blocks([-1, 3]), path)
    result = invoke("--file", str(path), "--png", str(png), "--csv", str(table))
    assert result.exit_code == 0, result.output
    assert "exact" in result.stdout and "mxfp4-ue5m3" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = list(csv.DictReader(table.open()))
    assert [row["spec"] for row in rows] == ["mxfp4", "mxfp4-ceil", "nvfp4", "mxfp4-ue5m3"]
    assert rows[0]["tensor"] == "w" and rows[0]["scale_exponents"] == "-1:1 3:1"


def test_a_file_of_nan_is_reported_not_finite_in_table_json_and_csv(tmp_path):
    path, table = tmp_path / "nan.pt", tmp_path / "t.csv"
    torch.save(torch.full((4, 64), math.nan), path)
    result = invoke("--file", str(path), "--spec", "mxfp4", "--csv", str(table))
    assert result.exit_code == 0, result.output
    assert "exact" not in result.stdout and "not finite" in result.stdout
    assert "(+8 NaN/Inf)" in result.stdout
    row = next(csv.DictReader(table.open()))
    assert (row["snr_db"], row["rel_mse"], row["nonfinite"]) == ("", "", "256")
    data = json.loads(invoke("--file", str(path), "--spec", "mxfp4", "--json").stdout)
    summary = data["summary"]["mxfp4"]
    assert summary["snr_db"] is None and summary["rel_mse"] is None
    assert summary["nonfinite"] == 256


def test_many_tensors_with_a_progress_bar_keep_stdout_json(tmp_path):
    path = tmp_path / "many.pt"
    torch.save({f"layer{i}.weight": torch.randn(4, 32) for i in range(14)}, path)
    result = invoke("--file", str(path), "--spec", "mxfp4-sr", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["tensors"]) == 14
    assert invoke("--file", str(path), "--quiet").exit_code == 0


def test_task_source():
    result = invoke("--task", "regression", "--size", "debug", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    names = [t["name"] for t in data["tensors"]]
    assert names == ["layers.0.weight", "layers.1.weight", "head.weight"]
    assert data["source"] == {"kind": "task", "task": "regression", "size": "debug"}
    assert 10 < data["summary"]["mxfp4"]["snr_db"] < 30


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    store = RunStore(tmp_path_factory.mktemp("store") / "s.db")
    flags = {"task": "regression", "size": "debug", "steps": 4, "device": "cpu"}
    result, _ = run_training(flags, [], store, reporter=SilentReporter())
    return store, result.run_id


def test_run_source_marks_skipped_layers(trained_store):
    store, run_id = trained_store
    result = invoke(run_id[:-2], "--store", str(store.path), "--metric", "flushed")
    assert result.exit_code == 0, result.output
    assert "head.weight *" in result.stdout and "flushed share" in result.stdout
    result = invoke(run_id, "--store", str(store.path), "--json", "--spec", "nvfp4")
    data = json.loads(result.stdout)
    assert data["source"]["run"] == run_id and data["source"]["step"] == 4
    assert {t["name"]: t["high_precision"] for t in data["tensors"]} == {
        "layers.0.weight": False,
        "layers.1.weight": False,
        "head.weight": True,
    }


def test_bad_inputs_are_one_line_errors(tmp_path, trained_store):
    store, _ = trained_store
    no_checkpoint = store.create_run("regression", "mxfp4", 0, {}, "cpu", {})
    one_d = tmp_path / "one_d.pt"
    torch.save({"bias": torch.zeros(8)}, one_d)
    text = tmp_path / "text.pt"
    text.write_text("not a torch file")
    cases = [
        ([], "exactly one source"),
        (["--task", "regression", "--file", str(one_d)], "exactly one source"),
        (["--file", str(tmp_path / "missing.pt")], "no such file"),
        (["--file", str(one_d)], "no floating-point tensor"),
        (["--file", str(text)], "cannot read"),
        (["--task", "regression", "--spec", "mxfp5"], "presets: mxfp4, mxfp4-ceil"),
        (["--task", "regression", "--hadamard", "48"], "power of two in 16..256"),
        (["--task", "regression", "--metric", "snr"], "--metric"),
        (["--size", "debug", "--file", str(one_d)], "--size only applies"),
        ([no_checkpoint, "--store", str(store.path)], "has no checkpoint"),
        (["r-nope", "--store", str(store.path)], "unknown run"),
    ]
    for args, message in cases:
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, args
        assert message in result.stderr, (args, result.stderr)
