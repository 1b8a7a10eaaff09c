"""Oscillation statistics (rate_out, the confidence histogram) and `fp4 oscillation-report`."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

from fp4cli.analysis.errors import AnalysisError
from fp4cli.analysis.oscillation import CONF_HIST, METRICS, load_oscillation, summarize
from fp4cli.cli.main import app
from fp4cli.linear import LinearConfig, QuantLinear
from fp4cli.quant import QuantSpec
from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter
from fp4cli.train.stats import QuantStatsCollector, confidence_histogram, quant_confidence
from tests.run_ids import unique_prefix

runner = CliRunner()
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _grid_layer() -> QuantLinear:
    """A 32 -> 2 layer whose weights sit on the MXFP4 grid with scale 1: Q(W) = W exactly."""
    config = LinearConfig(forward_w=QuantSpec.preset("mxfp4"))
    layer = QuantLinear(32, 2, bias=False, config=config, seed=0)
    with torch.no_grad():
        layer.weight.zero_()
        layer.weight[0, 0] = 6.0
        layer.weight[1, 1] = 6.0
    assert torch.equal(layer.quantized_weight(), layer.weight)
    return layer


def _step(collector: QuantStatsCollector, model: nn.Module, x: torch.Tensor, collect: bool):
    collector.begin(collect)
    model(x)
    collector.after_step()


def _weight_rows(rows) -> dict[str, float]:
    return {metric: value for _, operand, metric, value in rows if operand == "weight"}


def test_rate_out_of_a_known_weight_change_on_a_known_probe() -> None:
    layer = _grid_layer()
    model = nn.Sequential(layer)
    collector = QuantStatsCollector(model, enabled=True)
    probe = torch.eye(32)[:2]  # (2, 32): rows e0 and e1
    _step(collector, model, probe, collect=False)  # the window starts: P = this input
    collector.begin(False)
    model(torch.randn(5, 32))  # not a probe: the window has started
    with torch.no_grad():
        layer.weight[0, 1] = 3.0  # Q changes by 3 at (0, 1): P dQ^T = 3 at (1, 0)
    collector.after_step()
    next_probe = torch.randn(3, 4, 32)
    _step(collector, model, next_probe, collect=True)  # unchanged weight: this step adds 0
    values = _weight_rows(collector.rows())
    first = 3.0 / math.sqrt(6.0**2 + 6.0**2)  # ||P dQ^T|| / ||P Q^T||, P Q^T = diag(6, 6)
    assert values["rate_out"] == pytest.approx((first + 0.0) / 2, rel=1e-6)
    assert values["rate_qw"] == pytest.approx((3.0 / math.sqrt(72.0) + 0.0) / 2, rel=1e-6)
    new_window = collector.windows["0"]
    assert new_window.probe is not None
    assert torch.equal(new_window.probe, next_probe.reshape(-1, 32))  # the stats step's input


def test_rate_out_is_zero_for_an_unchanged_weight_and_probes_stay_small() -> None:
    model = nn.Sequential(_grid_layer())
    collector = QuantStatsCollector(model, enabled=True)
    _step(collector, model, torch.randn(100, 32), collect=False)
    assert collector.windows["0"].probe.shape == (64, 32)  # at most 64 rows are kept
    _step(collector, model, torch.randn(7, 32), collect=False)
    assert collector.probes == {}  # no copy on a step that starts no window
    _step(collector, model, torch.randn(7, 32), collect=True)
    values = _weight_rows(collector.rows())
    assert values["rate_out"] == 0.0 and values["rate_qw"] == 0.0 and values["rate_w"] == 0.0


def test_no_hook_and_no_state_when_stats_are_off() -> None:
    model = nn.Sequential(_grid_layer())
    collector = QuantStatsCollector(model, enabled=False)
    assert not model[0]._forward_pre_hooks
    _step(collector, model, torch.randn(4, 32), collect=False)
    assert collector.windows == {} and collector.probes == {} and collector.rows() == []


def test_confidence_histogram_bins() -> None:
    confidence = torch.tensor([0.0, 0.05, 0.1, 0.55, 0.95, 1.0])
    expected = torch.tensor([2, 1, 0, 0, 0, 1, 0, 0, 0, 2]) / 6
    assert torch.allclose(confidence_histogram(confidence), expected)


def test_conf_hist_sums_to_one_and_matches_a_direct_histogram() -> None:
    torch.manual_seed(0)
    config = LinearConfig(forward_w=QuantSpec.preset("mxfp4-ceil"))
    model = nn.Sequential(QuantLinear(64, 48, config=config, seed=1))
    collector = QuantStatsCollector(model, enabled=True)
    _step(collector, model, torch.randn(8, 64), collect=False)
    with torch.no_grad():
        model[0].weight.add_(0.01 * torch.randn_like(model[0].weight))
    _step(collector, model, torch.randn(8, 64), collect=True)
    values = _weight_rows(collector.rows())
    bins = [values[name] for name in CONF_HIST]
    assert sum(bins) == pytest.approx(1.0, abs=1e-6)
    confidence = quant_confidence(model[0])
    for i, share in enumerate(bins):
        upper = confidence <= 1.0 if i == 9 else confidence < (i + 1) / 10
        direct = ((confidence >= i / 10) & upper).float().mean().item()
        assert share == pytest.approx(direct, abs=1e-7), i
    assert values["conf_low"] == pytest.approx(bins[0], abs=1e-7)


def _train(store: RunStore, steps: int, stats_every: int):
    flags = {"task": "regression", "size": "debug", "device": "cpu", "recipe": "tetrajet"}
    flags |= {"steps": steps, "stats_every": stats_every}
    return run_training(flags, [], store, reporter=SilentReporter())


def test_training_writes_the_new_metrics(tmp_path) -> None:
    store = RunStore(tmp_path / "s.db")
    result, _ = _train(store, steps=10, stats_every=5)
    rows = store.quant_stats(result.run_id, operand="weight")
    layers = {row["layer"] for row in rows}
    assert layers and {row["step"] for row in rows} == {5, 10}
    for layer in layers:
        for step in (5, 10):
            values = {
                r["metric"]: r["value"] for r in rows if (r["layer"], r["step"]) == (layer, step)
            }
            assert set(METRICS + CONF_HIST) <= set(values)
            assert sum(values[name] for name in CONF_HIST) == pytest.approx(1.0, abs=1e-6)
            assert math.isfinite(values["rate_out"]) and values["rate_out"] > 0
    off, trainer = _train(store, steps=3, stats_every=0)
    assert off.status == "finished" and store.quant_stats(off.run_id) == []
    assert all(not layer._forward_pre_hooks for layer in trainer.stats.layers.values())


# The report, from a store filled by hand.

STEP_VALUES = {  # layer -> step -> value of every metric (conf_hist_i = the value / 10)
    "blocks.0.fc1": {5: 0.2, 10: 0.4},
    "blocks.0.fc2": {5: 0.1, 10: 0.3},
}
OPERAND_ROW = ("blocks.0.fc1", "forward_w", "rel_mse", 9.0)  # not an oscillation row


def _fill(store: RunStore, recipe: str, layers: dict[str, dict[int, float]]) -> str:
    run_id = store.create_run("regression", recipe, 0, {}, "cpu", {"torch": "x"})
    for step in (5, 10):
        rows = [OPERAND_ROW]
        for layer, by_step in layers.items():
            rows += [(layer, "weight", m, by_step[step]) for m in METRICS]
            rows += [(layer, "weight", m, by_step[step] / 10) for m in CONF_HIST]
        store.log_quant_stats(run_id, step, rows)
    return run_id


@pytest.fixture
def filled(tmp_path):
    """A store with run A (two layers), run B (fc1 and an extra layer), C (no statistics)."""
    path = tmp_path / "r.db"
    with RunStore(path) as store:
        a = _fill(store, "tetrajet", STEP_VALUES)
        b_layers = {"blocks.0.fc1": {5: 0.5, 10: 0.7}, "blocks.0.extra": {5: 0.6, 10: 0.8}}
        b = _fill(store, "tetrajet-qema", b_layers)
        c = store.create_run("regression", "bf16", 0, {}, "cpu", {})
        store.log_quant_stats(c, 5, [OPERAND_ROW])
    return path, a, b, c


def test_summaries_match_hand_computed_means(filled) -> None:
    path, a, b, c = filled
    with RunStore(path) as store:
        run = load_oscillation(store, unique_prefix(a, (b, c)))  # a unique prefix works
        with pytest.raises(AnalysisError, match="has no oscillation statistics"):
            load_oscillation(store, c)
    assert run.run_id == a and run.steps == [5, 10]
    last, mean = summarize(run, "last"), summarize(run, "mean")
    assert last.step == 10
    for metric in METRICS:
        assert last.layers["blocks.0.fc1"][metric] == pytest.approx(0.4)
        assert mean.layers["blocks.0.fc1"][metric] == pytest.approx(0.3)  # (0.2 + 0.4) / 2
        assert mean.layers["blocks.0.fc2"][metric] == pytest.approx(0.2)  # (0.1 + 0.3) / 2
        assert last.overall[metric] == pytest.approx(0.35)  # (0.4 + 0.3) / 2
        assert mean.overall[metric] == pytest.approx(0.25)  # (0.3 + 0.2) / 2
    assert last.overall["conf_hist_3"] == pytest.approx(0.035)


def _invoke(*args: str):
    return runner.invoke(app, ["oscillation-report", *args])


def test_cli_one_run(filled) -> None:
    path, a, _, _ = filled
    result = _invoke(a, "--store", str(path))
    assert result.exit_code == 0, result.output
    for text in (a, "blocks.0.fc1", "blocks.0.fc2", "mean over layers", "tetrajet"):
        assert text in result.stdout
    summary_line = next(line for line in result.stdout.splitlines() if "mean over layers" in line)
    assert "35.0" in summary_line  # osc % at the last step, mean over layers
    result = _invoke(a, "--store", str(path), "--at", "mean")
    summary_line = next(line for line in result.stdout.splitlines() if "mean over layers" in line)
    assert result.exit_code == 0 and "25.0" in summary_line


def test_cli_two_runs_side_by_side(filled) -> None:
    path, a, b, _ = filled
    result = _invoke(a, b, "--store", str(path))
    assert result.exit_code == 0, result.output
    assert f"A: {a} (tetrajet)" in result.stdout and f"B: {b} (tetrajet-qema)" in result.stdout
    lines = {
        line.split()[0]: line.split()[1:] for line in result.stdout.splitlines() if "blocks" in line
    }
    assert lines["blocks.0.fc1"][:2] == ["40.0", "70.0"]  # osc % A | B
    assert lines["blocks.0.fc2"][0] == "30.0" and len(lines["blocks.0.fc2"]) == len(METRICS)
    assert lines["blocks.0.extra"][0] == "80.0" and len(lines["blocks.0.extra"]) == len(METRICS)


def test_cli_json_has_every_number(filled) -> None:
    path, a, b, _ = filled
    result = _invoke(a, b, "--store", str(path), "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [run["run"] for run in runs] == [a, b] and runs[0]["steps"] == [5, 10]
    fc2 = runs[0]["layers"]["blocks.0.fc2"]
    assert [entry["step"] for entry in fc2] == [5, 10]
    assert fc2[1]["rate_out"] == pytest.approx(0.3) and fc2[0]["conf_hist_9"] == pytest.approx(0.01)
    assert runs[0]["summary"]["mean"]["mean_over_layers"]["osc_share"] == pytest.approx(0.25)
    assert runs[1]["summary"]["last"]["layers"]["blocks.0.extra"]["rate_qw"] == pytest.approx(0.8)


def test_cli_png(filled, tmp_path) -> None:
    path, a, b, _ = filled
    for runs, name in (([a], "one.png"), ([a, b], "two.png")):
        result = _invoke(*runs, "--store", str(path), "--png", str(tmp_path / name))
        assert result.exit_code == 0, result.output
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


@pytest.mark.parametrize(
    "case, fragment",
    [
        ("no-store", "no run store"),
        ("unknown", "unknown run"),
        ("no-stats", "has no oscillation statistics: train with --stats-every N"),
        ("three", "one or two runs, got 3"),
    ],
)
def test_cli_errors_are_one_line(filled, tmp_path, case, fragment) -> None:
    path, a, b, c = filled
    args = {
        "no-store": [a, "--store", str(tmp_path / "missing.db")],
        "unknown": ["r-nope", "--store", str(path)],
        "no-stats": [c, "--store", str(path)],
        "three": [a, b, c, "--store", str(path)],
    }[case]
    result = _invoke(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr
    assert not (tmp_path / "missing.db").exists()
