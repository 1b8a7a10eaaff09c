"""On a CUDA GPU: a sweep's workers train on the GPU, and the analysis commands read the runs."""

import json

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.sweep import parse_sweep, plan_sweep, run_sweep

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_a_sweep_trains_in_gpu_workers_and_reports(tmp_path):
    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 20, "stats_every": 10, "log_every": 5}
    axes = {"bwd": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]}}
    raw = {"name": "gpu", "base": "tetrajet", "train": train, "axes": axes}
    spec = parse_sweep(raw | {"tasks": ["regression", "gpt"]}, "gpu.yaml")
    results = run_sweep(plan_sweep(spec, store), store, workers=2)
    assert {r.status for r in results} == {"finished"} and len(results) == 8
    runs = store.list_runs(sweep=store.get_sweep("gpu")["id"])
    assert all(run["device"].startswith("NVIDIA") for run in runs)
    tetrajet = next(r for r in runs if r["recipe"] == "tetrajet[bwd=rne]" and r["task"] == "gpt")
    rate_out = store.quant_stats(tetrajet["id"], metric="rate_out")
    assert rate_out and all(row["value"] > 0 for row in rate_out)
    runner = CliRunner()
    report = runner.invoke(app, ["report", "--sweep", "gpu", "--store", str(store.path), "--json"])
    assert report.exit_code == 0, report.output
    rows = json.loads(report.output)["runs"]
    assert len(rows) == 8 and all(row["cost_ratio"] for row in rows)
    oscillation = runner.invoke(
        app, ["oscillation-report", tetrajet["id"], "--store", str(store.path)]
    )
    assert oscillation.exit_code == 0, oscillation.output
