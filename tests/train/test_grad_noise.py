"""FP4 All the Way: the recipe, the weight gradients' noise statistic (hand cases, the
collector, a CPU run) and `fp4 report`'s column for the step the ratio fell below sqrt(3)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from fp4cli.analysis.grad_noise import (
    PAPER_THRESHOLD,
    GradNoisePoint,
    crossing_step,
    grad_noise_series,
    load_grad_noise,
)
from fp4cli.cli.main import app
from fp4cli.linear import LinearConfig, QuantLinear
from fp4cli.quant import QuantSpec
from fp4cli.recipes import load_recipe
from fp4cli.store import RunStore
from fp4cli.train.stats import QuantStatsCollector
from fp4cli.train.stats_grad_noise import gradient_noise, noise_ratio

runner = CliRunner()


def test_the_recipe_is_nvfp4_with_rtn_forward_and_sr_on_dy_and_on_x_of_dw():
    linear = load_recipe("fp4-all-the-way").linear
    rtn, sr = QuantSpec.preset("nvfp4"), QuantSpec.preset("nvfp4", rounding="sr")
    assert linear.forward_x == linear.forward_w == linear.grad_input_w == rtn
    assert linear.grad_input_dy == linear.grad_weight_dy == linear.grad_weight_x == sr
    assert sr.block == 16 and sr.scale == "ue4m3" and sr.tensor_scale and sr.sr_bits == 24
    assert not linear.double_quant and linear.dge is None
    assert all(linear.hadamard(g) is None for g in ("forward", "grad_input", "grad_weight"))


def test_gradient_noise_of_a_known_gradient_and_noise():
    reference = torch.tensor([[3.0, 4.0]])  # ||G|| = 5
    quantized = reference + torch.tensor([[0.6, 0.8]])  # noise norm 1
    grad, noise = gradient_noise(quantized, reference)
    assert float(grad) == pytest.approx(5.0) and float(noise) == pytest.approx(1.0)
    assert noise_ratio(5.0, 1.0) == 5.0
    assert noise_ratio(5.0, 0.0) == math.inf and math.isnan(noise_ratio(0.0, 0.0))


def _layer(in_features: int, grad_weight_x: QuantSpec) -> tuple[nn.Module, QuantLinear]:
    config = LinearConfig(grad_weight_x=grad_weight_x)  # only X of the dW GEMM is quantized
    layer = QuantLinear(in_features, 1, bias=False, config=config, seed=0)
    return nn.Sequential(layer), layer


def _collect(model: nn.Module, *inputs: torch.Tensor) -> dict[str, float]:
    collector = QuantStatsCollector(model, enabled=True)
    collector.begin(True)
    sum(model(x).sum() for x in inputs).backward()  # dY = 1 for every token
    collector.after_step()
    rows = collector.rows()
    return {metric: value for _, operand, metric, value in rows if operand == "grad_weight"}


def test_a_known_rounding_error_gives_the_known_ratio():
    """One token, dY = 1: G = X. Along tokens each value is its own block; MXFP4 scales 1.25 by
    2^-2 to 5, a tie that rounds to even, 4: Q(1.25) = 1.0. 6 is exact."""
    model, _ = _layer(32, QuantSpec())
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 6.0, 1.25
    values = _collect(model, x)
    assert values["grad_norm"] == pytest.approx(math.sqrt(6.0**2 + 1.25**2))
    assert values["noise_norm"] == pytest.approx(0.25)
    assert values["noise_ratio"] == pytest.approx(math.sqrt(37.5625) / 0.25)


def test_stochastic_rounding_noise_of_a_known_level():
    """d = 4096 values of 5, each its own block (one token): SR rounds 5 to 4 or 6, noise +-1
    whatever the draw, so ||noise|| = sqrt(d) sigma = 64 with sigma = 1, and ||G|| = 5 * 64."""
    model, _ = _layer(4096, QuantSpec(rounding="sr"))
    values = _collect(model, torch.full((1, 4096), 5.0))
    assert values["grad_norm"] == pytest.approx(320.0)
    assert values["noise_norm"] == pytest.approx(64.0)
    assert values["noise_ratio"] == pytest.approx(5.0)


def test_calls_of_one_step_add_up_and_other_steps_record_nothing():
    model, layer = _layer(32, QuantSpec())
    x = torch.zeros(1, 32)
    x[0, 0], x[0, 1] = 6.0, 1.25
    values = _collect(model, x, x)  # G = 2 X, G_q = 2 Q(X)
    assert values["grad_norm"] == pytest.approx(2 * math.sqrt(37.5625))
    assert values["noise_norm"] == pytest.approx(0.5)
    collector = QuantStatsCollector(model, enabled=True)
    collector.begin(False)
    model(x).sum().backward()
    collector.after_step()
    assert collector.grad_noise is not None and collector.grad_noise.norms == {}
    assert collector.grad_noise.reference == {}


def test_layers_without_a_quantized_weight_gradient_record_nothing():
    config = LinearConfig(forward_x=QuantSpec(), forward_w=QuantSpec())
    model = nn.Sequential(QuantLinear(32, 4, config=config, seed=0))
    assert _collect(model, torch.randn(3, 32)) == {}


def _rows(step: int, norms: dict[str, tuple[float, float]]) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for layer, (grad, noise) in norms.items():
        for metric, value in (("grad_norm", grad), ("noise_norm", noise)):
            rows.append({"step": step, "layer": layer, "operand": "grad_weight",
                         "metric": metric, "value": value})  # fmt: skip
    return rows


def test_the_model_ratio_and_the_first_step_below_sqrt3():
    """R = sqrt(sum grad^2) / sqrt(sum noise^2): at step 10, sqrt(9 + 16) / sqrt(1 + 0) = 5;
    at 20, sqrt(3) / 1.01 just below sqrt(3); at 30 back above; the crossing is step 20."""
    rows = _rows(10, {"a": (3.0, 1.0), "b": (4.0, 0.0)})
    rows += _rows(20, {"a": (1.0, 1.01 / math.sqrt(2)), "b": (math.sqrt(2), 1.01 / math.sqrt(2))})
    rows += _rows(30, {"a": (2.0, 1.0), "b": (0.0, 0.0)})
    rows.append({"step": 10, "layer": "a", "operand": "weight", "metric": "rate_w", "value": 9.0})
    series = grad_noise_series(rows)
    assert [p.step for p in series] == [10, 20, 30] and series[0].layers == 2
    assert series[0].ratio == pytest.approx(5.0)
    assert series[1].ratio == pytest.approx(math.sqrt(3) / 1.01)
    assert series[2].ratio == pytest.approx(2.0)
    assert crossing_step(series) == 20
    assert crossing_step(series[:1]) is None and crossing_step(series, threshold=6.0) == 10
    assert math.isclose(PAPER_THRESHOLD**2, 3.0)
    assert GradNoisePoint(5, 1.0, 0.0, 1).ratio == math.inf


def _train(store: Path, recipe: str, *extra: str) -> str:
    """`fp4 train` of the debug regression task on the CPU; the new run's id."""
    before = {run["id"] for run in RunStore(store).list_runs()}
    args = ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--recipe",
            recipe, "--steps", "20", "--store", str(store), "--quiet",
            "--set", "checkpoints=false", *extra]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    (run_id,) = {run["id"] for run in RunStore(store).list_runs()} - before
    return run_id


def test_fp4_train_records_the_ratio_and_fp4_report_shows_it(tmp_path):
    """`fp4 train --recipe fp4-all-the-way --stats-every 10` on the CPU: grad_weight rows at
    both statistics steps for both quantized layers; `fp4 report` shows the ratio and "not
    reached" (this run's ratio stays near 7), and "-" for a BF16 run without statistics."""
    path = tmp_path / "fp4.db"
    run_id = _train(path, "fp4-all-the-way", "--stats-every", "10")
    bf16_id = _train(path, "bf16")
    store = RunStore(path)
    rows = store.quant_stats(run_id, operand="grad_weight")
    assert {r["step"] for r in rows} == {10, 20}
    assert {r["layer"] for r in rows} == {"layers.0", "layers.1"}
    assert {r["metric"] for r in rows} == {"grad_norm", "noise_norm", "noise_ratio"}
    series = load_grad_noise(store, run_id)
    assert [p.step for p in series] == [10, 20] and all(p.layers == 2 for p in series)
    assert all(PAPER_THRESHOLD < p.ratio < 100 for p in series)
    assert all(p.noise_norm > 0 for p in series)  # SR on both operands of dW: never exact
    assert load_grad_noise(store, bf16_id) == []

    shown = runner.invoke(app, ["report", "--store", str(path)], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    assert "grad/noise" in shown.output and "< sqrt3 at" in shown.output
    line = next(row for row in shown.output.splitlines() if run_id in row)
    assert line.split()[-3:] == [f"{series[-1].ratio:.2f}", "not", "reached"]
    other = next(row for row in shown.output.splitlines() if bf16_id in row)
    assert other.split()[-2:] == ["-", "-"]

    data = json.loads(runner.invoke(app, ["report", "--store", str(path), "--json"]).output)
    by_recipe = {row["recipe"]: row for row in data["runs"]}
    assert by_recipe["fp4-all-the-way"]["noise_ratio"] == pytest.approx(series[-1].ratio)
    assert by_recipe["fp4-all-the-way"]["noise_below_step"] is None
    assert by_recipe["bf16"]["noise_ratio"] is None
    assert crossing_step(series, threshold=100.0) == 10


def test_fp4_report_shows_the_first_statistics_step_below_sqrt3(tmp_path):
    """A stored run whose model ratio is 5, then 1.5, then 2: the column says 20 (the first
    step below sqrt(3), though it rises again), and the ratio column the last step's 2.00."""
    store = RunStore(tmp_path / "fp4.db")
    config = {"train": {"size": "debug", "steps": 30}, "recipe": load_recipe("mxfp4").to_dict()}
    run_id = store.create_run("regression", "mxfp4", 0, config, "cpu", {})
    for step, (grad, noise) in ((10, (5.0, 1.0)), (20, (1.5, 1.0)), (30, (2.0, 1.0))):
        rows = [("layers.0", "grad_weight", "grad_norm", grad)]
        rows.append(("layers.0", "grad_weight", "noise_norm", noise))
        store.log_quant_stats(run_id, step, rows)
    store.log_metrics(run_id, 30, {"val_loss": 0.5})
    store.finish_run(run_id, "finished", step=30)
    shown = runner.invoke(app, ["report", "--store", str(tmp_path / "fp4.db")])
    assert shown.exit_code == 0, shown.output
    line = next(row for row in shown.output.splitlines() if run_id in row)
    assert line.split()[-2:] == ["2.00", "20"]


def test_fp4_report_without_statistics_has_no_noise_columns(tmp_path):
    path = tmp_path / "fp4.db"
    _train(path, "mxfp4", "--steps", "2")
    shown = runner.invoke(app, ["report", "--store", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "grad/noise" not in shown.output and "sqrt3" not in shown.output


def test_fp4_report_of_a_run_without_noise_shows_inf(tmp_path):
    """A stored run whose quantized gradient was exact: the ratio is inf, never below sqrt(3);
    JSON has no inf, so the ratio is null there (the step too: not reached)."""
    store = RunStore(tmp_path / "fp4.db")
    config = {"train": {"size": "debug", "steps": 10}, "recipe": load_recipe("mxfp4").to_dict()}
    run_id = store.create_run("regression", "mxfp4", 0, config, "cpu", {})
    rows = [("layers.0", "grad_weight", "grad_norm", 3.0)]
    store.log_quant_stats(run_id, 10, rows + [("layers.0", "grad_weight", "noise_norm", 0.0)])
    store.log_metrics(run_id, 10, {"val_loss": 0.5})
    store.finish_run(run_id, "finished", step=10)
    path = str(tmp_path / "fp4.db")
    shown = runner.invoke(app, ["report", "--store", path], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    line = next(row for row in shown.output.splitlines() if run_id in row)
    assert line.split()[-3:] == ["inf", "not", "reached"]
    (row,) = json.loads(runner.invoke(app, ["report", "--store", path, "--json"]).output)["runs"]
    assert row["noise_ratio"] is None and row["noise_below_step"] is None


def test_fp4_recipes_show_prints_a_recipe_that_loads_back(tmp_path):
    result = runner.invoke(app, ["recipes", "show", "fp4-all-the-way"])
    assert result.exit_code == 0, result.output
    copy = tmp_path / "copy.yaml"
    copy.write_text(result.stdout)
    assert load_recipe(copy).linear == load_recipe("fp4-all-the-way").linear
    assert "Chmiel" in result.stdout and "2505.19115" in result.stdout
