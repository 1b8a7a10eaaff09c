"""`fp4 report`: baselines, gaps, closed shares, costs, the Pareto front, exports, errors."""

import json
import math

import pytest
from typer.testing import CliRunner

from fp4cli.analysis.errors import AnalysisError
from fp4cli.analysis.report import build_report, pareto_front, select_runs
from fp4cli.cli.main import app
from fp4cli.recipes import load_recipe
from fp4cli.store import RunStore
from fp4cli.sweep import parse_sweep, plan_sweep, run_sweep

TRAIN = {"size": "debug", "steps": 10, "batch_size": 8, "data": None}
LAYERS = [("layers.0", 256, 64, 64, True), ("head", 256, 64, 4, False)]


def _run(store, recipe, value, task="regression", seed=0, metric="val_loss", train=TRAIN, **kw):
    """A finished run of a shipped recipe with a final `metric` and recorded layer shapes."""
    config = {"train": train, "recipe": load_recipe(recipe).to_dict()}
    run_id = store.create_run(task, recipe, seed, config, "cpu", {}, **kw)
    store.log_metrics(run_id, 5, {metric: value + 1.0})
    store.log_metrics(run_id, 10, {metric: value, "train_loss": value})
    store.log_layers(run_id, LAYERS)
    store.finish_run(run_id, "finished", step=10)
    return run_id


@pytest.fixture
def store(tmp_path):
    return RunStore(tmp_path / "s.db")


def _rows(report):
    return {row.recipe: row for row in report.rows}


def test_gap_and_closed_share_by_hand(store):
    _run(store, "bf16", 0.50)
    _run(store, "mxfp4", 0.60)
    _run(store, "tetrajet", 0.52)
    _run(store, "nvfp4", 0.65)
    report = build_report(store, select_runs(store))
    rows = _rows(report)
    assert rows["bf16"].gap == 0 and rows["mxfp4"].gap == pytest.approx(0.10)
    assert rows["tetrajet"].gap == pytest.approx(0.02)
    assert rows["tetrajet"].closed == pytest.approx(1 - 0.02 / 0.10)  # 80% of the gap closed
    assert rows["nvfp4"].closed == pytest.approx(1 - 0.15 / 0.10)  # worse than naive: negative
    assert [row.recipe for row in report.rows] == ["bf16", "tetrajet", "mxfp4", "nvfp4"]


def test_closed_share_against_a_papers_own_baseline(store):
    """Tseng et al. read their method against their own MXFP4 baseline, not naive MXFP4."""
    _run(store, "bf16", 0.50)
    _run(store, "mxfp4", 0.60)
    tseng_base = _run(store, "tseng-baseline", 0.56)
    _run(store, "tseng-rht-sr", 0.51)
    naive = _rows(build_report(store, select_runs(store)))
    assert naive["tseng-rht-sr"].closed == pytest.approx(1 - 0.01 / 0.10)
    report = build_report(store, select_runs(store), baseline="tseng-baseline")
    rows = _rows(report)
    assert report.baseline == "tseng-baseline" and report.to_dict()["baseline"] == "tseng-baseline"
    assert rows["tseng-rht-sr"].baseline_gap == pytest.approx(0.06)
    assert rows["tseng-rht-sr"].closed == pytest.approx(1 - 0.01 / 0.06)
    assert rows["tseng-rht-sr"].baseline_runs["tseng-baseline"] == tseng_base
    assert rows["tseng-baseline"].closed == pytest.approx(0.0)
    with pytest.raises(AnalysisError, match="no finished run of the baseline recipe 'wang-direct'"):
        build_report(store, select_runs(store), baseline="wang-direct")
    # a running sweep's own baseline that has not finished: a note, and no closed shares
    waiting = build_report(
        store, select_runs(store), baseline="wang-direct", require_baseline=False
    )
    assert any("baseline 'wang-direct' yet" in note for note in waiting.notes)
    assert all(row.closed is None for row in waiting.rows)
    result = CliRunner().invoke(app, ["report", "--baseline", "nope", "--store", str(store.path)])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    data = json.loads(
        CliRunner()
        .invoke(
            app, ["report", "--baseline", "tseng-baseline", "--json", "--store", str(store.path)]
        )
        .output
    )
    closed = {row["recipe"]: row["closed"] for row in data["runs"]}
    assert closed["tseng-rht-sr"] == pytest.approx(1 - 0.01 / 0.06)


def test_a_sweeps_baseline_field_is_trained_and_read(tmp_path):
    from fp4cli.analysis.report_plot import colours, points_of

    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 3, "device": "cpu", "checkpoints": False}
    axes = {"bwd": {"set": "linear.grad_*.*.rounding", "values": ["away", "sr"]}}
    raw = {"name": "tseng", "base": "tseng-baseline", "train": train, "axes": axes,
           "baselines": ["bf16"], "baseline": "tseng-baseline"}  # fmt: skip
    spec = parse_sweep(raw, "tseng.yaml")
    assert spec.baselines == ("bf16", "tseng-baseline") and spec.baseline == "tseng-baseline"
    run_sweep(plan_sweep(spec, store), store)
    args = ["report", "--sweep", "tseng", "--json", "--store", str(store.path)]
    data = json.loads(CliRunner().invoke(app, args).output)
    assert data["baseline"] == "tseng-baseline"
    by_recipe = {row["recipe"]: row for row in data["runs"]}
    assert by_recipe["tseng-baseline"]["closed"] == 0
    assert "tseng-baseline" in by_recipe["tseng-baseline[bwd=sr]"]["baseline_runs"]
    report = build_report(store, select_runs(store, sweep="tseng"), baseline="tseng-baseline")
    points = points_of(report)
    red = [p.recipe for p in points if colours(points)[p.number] == "tab:red"]
    assert red == ["tseng-baseline"]


def test_top1_gap_is_bf16_minus_the_run(store):
    _run(store, "bf16", 0.90, task="vit", metric="top1")
    _run(store, "mxfp4", 0.80, task="vit", metric="top1")
    _run(store, "tetrajet", 0.88, task="vit", metric="top1")
    rows = _rows(build_report(store, select_runs(store)))
    assert rows["tetrajet"].gap == pytest.approx(0.02)
    assert rows["tetrajet"].closed == pytest.approx(0.8)


def test_baselines_match_task_seed_and_training_size_only(store):
    _run(store, "bf16", 0.50, seed=1)  # another seed
    _run(store, "bf16", 0.40, train=TRAIN | {"steps": 20})  # another length
    run_id = _run(store, "tetrajet", 0.52)
    row = build_report(store, select_runs(store, [run_id])).rows[0]
    assert row.gap is None and row.closed is None and row.baseline_runs == {}
    bf16 = _run(store, "bf16", 0.45)
    row = build_report(store, select_runs(store, [run_id])).rows[0]
    assert row.gap == pytest.approx(0.07) and row.baseline_runs == {"bf16": bf16}


def test_a_diverged_run_has_an_infinite_gap(store):
    _run(store, "bf16", 0.50)
    run_id = store.create_run("regression", "mxfp4", 0, {"train": TRAIN, "recipe": {}}, "cpu", {})
    store.finish_run(run_id, "diverged", step=3, diverged_step=3)
    row = build_report(store, select_runs(store, [run_id])).rows[0]
    assert row.status == "diverged" and math.isinf(row.gap) and not row.pareto


def test_costs_come_from_the_cost_model_on_the_recorded_shapes(store):
    from fp4cli.cost import LayerShape, estimate_model, profile_for

    _run(store, "bf16", 0.50)
    run_id = _run(store, "tetrajet", 0.52)
    rows = _rows(build_report(store, select_runs(store), target="b200", measured=False))
    shapes = [LayerShape(*layer[1:]) for layer in LAYERS]
    expected = estimate_model(load_recipe("tetrajet").linear, shapes, profile_for("b200"))
    assert rows["tetrajet"].cost_ratio == pytest.approx(expected.ratio)
    assert rows["bf16"].cost_ratio == pytest.approx(1.0)
    assert rows["tetrajet"].run_id == run_id


def test_pareto_front_by_hand():
    points = [(0.10, 1.0), (0.05, 2.0), (0.07, 2.5), (0.02, 3.0), (0.05, 2.0), (0.2, 0.9)]
    # (0.07, 2.5) is beaten by (0.05, 2.0); the second (0.05, 2.0) repeats the first.
    assert pareto_front(points) == [0, 1, 3, 5]


def test_bf16_is_the_reference_not_on_the_front(store):
    _run(store, "bf16", 0.50)
    _run(store, "mxfp4", 0.60)
    _run(store, "tetrajet", 0.52)
    rows = _rows(build_report(store, select_runs(store)))
    assert not rows["bf16"].pareto and rows["mxfp4"].pareto  # the cheapest FP4 recipe


def test_errors_are_one_line(store, tmp_path):
    with pytest.raises(AnalysisError, match="has no runs yet"):
        select_runs(store)
    _run(store, "bf16", 0.5, tags=["a"])
    with pytest.raises(AnalysisError, match="no runs with tag 'b'"):
        select_runs(store, tag="b")
    runner = CliRunner()
    for args in (
        ["report", "--store", str(tmp_path / "missing.db")],
        ["report", "nope", "--store", str(store.path)],
        ["report", "--sweep", "nope", "--store", str(store.path)],
        ["report", "--metric", "top5", "--store", str(store.path)],
        ["report", "--target", "tpu", "--store", str(store.path)],
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.startswith("error: ") and result.output.count("\n") == 1


def test_cli_on_a_sweep_table_plots_and_exports(tmp_path):
    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 4, "device": "cpu", "checkpoints": False}
    axes = {"bwd": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]}}
    spec = parse_sweep({"name": "mini", "train": train, "axes": axes}, "mini.yaml")
    run_sweep(plan_sweep(spec, store), store)
    args = ["report", "--sweep", "mini", "--store", str(store.path)]
    result = CliRunner().invoke(
        app, [*args, "--plots", str(tmp_path / "p"), "--csv", str(tmp_path / "r.csv")]
    )
    assert result.exit_code == 0, result.output
    assert (
        "3 runs: task regression, seed 0, val_loss" in result.output and "bwd=sr" in result.output
    )
    for name in ("pareto.png", "curves.png"):
        assert (tmp_path / "p" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len((tmp_path / "r.csv").read_text().splitlines()) == 4
    data = json.loads(CliRunner().invoke(app, [*args, "--json"]).output)
    by_recipe = {row["recipe"]: row for row in data["runs"]}
    assert by_recipe["bf16"]["gap"] == 0 and by_recipe["mxfp4"]["closed"] == 0
    assert by_recipe["mxfp4[bwd=sr]"]["cost_ratio"] > 0


def _row(label, recipe, seed, value, gap, cost, point, pareto=False):
    from fp4cli.analysis.report import ReportRow

    return ReportRow(f"r-{label}-{seed}", label, "regression", recipe, seed, "finished",
                     "val_loss", value, gap=gap, cost_ratio=cost, point=point,
                     pareto=pareto)  # fmt: skip


def test_figure_points_are_recipes_over_their_seeds():
    """One point per recipe or sweep point: its seeds' mean and range, one colour everywhere
    (bf16 black, mxfp4 red), named by its number in the table."""
    from fp4cli.analysis.report import Report
    from fp4cli.analysis.report_plot import colours, points_of

    rows = [
        _row("bf16", "bf16", 0, 1.0, 0.0, 1.0, 1), _row("bf16", "bf16", 1, 1.2, 0.0, 1.0, 1),
        _row("a=x", "mxfp4[a=x]", 0, 1.1, 0.1, 0.8, 2),
        _row("a=x", "mxfp4[a=x]", 1, 1.5, 0.3, 0.8, 2),
        _row("mxfp4", "mxfp4", 0, 1.4, 0.4, 0.7, 3),
    ]  # fmt: skip
    points = points_of(Report(rows, "h100"))
    assert [(p.number, p.name, len(p.rows)) for p in points] == [
        (1, "bf16", 2), (2, "#2 x", 2), (3, "mxfp4", 1)
    ]  # fmt: skip
    assert points[1].mean("gap") == pytest.approx(0.2) and points[1].spread("gap") == (0.1, 0.3)
    assert points[2].spread("gap") is None  # one seed: no range
    assert colours(points) == {1: "black", 2: "tab:blue", 3: "tab:red"}


def _seed_mean_rows():
    """Means (gap, cost): a (0.3, 0.8), b (0.35, 0.7), c (0.2, 0.9), d (0.5, 0.85). On the
    means' plane a, b and c are the front and d is beaten by a; of the single runs, a's seed 0
    beats both of c's, and d's seed 0 (gap 0.05) is beaten by none."""
    rows = [_row("bf16", "bf16", 0, 1.0, 0.0, 1.0, 1)]
    for point, (label, gaps, cost) in enumerate(
        [("a", (0.1, 0.5), 0.8), ("b", (0.35,), 0.7), ("c", (0.2, 0.2), 0.9),
         ("d", (0.05, 0.95), 0.85)], start=2,
    ):  # fmt: skip
        rows += [_row(label, f"mxfp4[{label}]", seed, 1.0, gap, cost, point)
                 for seed, gap in enumerate(gaps)]  # fmt: skip
    return rows


def test_the_plotted_front_is_that_of_the_seed_means(tmp_path, monkeypatch):
    from fp4cli.analysis import report_plot
    from fp4cli.analysis.report import Report, mark_pareto

    rows = _seed_mean_rows()
    mark_pareto(rows)  # the table's marks: single runs
    assert {r.label for r in rows if r.pareto} == {"a", "b", "d"}
    drawn = {}
    monkeypatch.setattr(report_plot, "save_png", lambda figure, path: drawn.setdefault("f", figure))
    report_plot.pareto_png(Report(rows, "h100"), tmp_path / "pareto.png")
    (ring,) = [line for line in drawn["f"].axes[0].lines if line.get_label() == "Pareto front"]
    assert list(ring.get_xdata()) == pytest.approx([0.7, 0.8, 0.9])  # b, a, c: not d
    assert list(ring.get_ydata()) == pytest.approx([0.35, 0.3, 0.2])


@pytest.mark.parametrize("eval_every", [0, 2])
def test_figures_of_a_sweep_with_seeds(tmp_path, eval_every):
    """Curves as means with bands when a metric is evaluated along the run; the final values
    as one row per point when it is evaluated once."""
    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 6, "device": "cpu", "checkpoints": False,
             "eval_every": eval_every}  # fmt: skip
    axes = {"bwd": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]}}
    spec = parse_sweep({"name": "seeds", "train": train, "axes": axes, "seeds": [0, 1]}, "s.yaml")
    run_sweep(plan_sweep(spec, store), store)
    args = ["report", "--sweep", "seeds", "--store", str(store.path), "--plots", str(tmp_path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[1].split()[0] == "#"  # the table numbers the points
    for name in ("pareto.png", "curves.png"):
        assert (tmp_path / name).stat().st_size > 10_000


def test_the_table_fits_80_columns_with_whole_ids(tmp_path):
    import re

    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 4, "device": "cpu", "checkpoints": False}
    axes = {"bwd_rounding": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]},
            "rule": {"set": "linear.*.*.scale_rule", "values": ["floor", "ceil"]}}  # fmt: skip
    spec = parse_sweep({"name": "w", "train": train, "axes": axes, "seeds": [0, 1]}, "w.yaml")
    run_sweep(plan_sweep(spec, store), store)
    args = ["report", "--sweep", "w", "--store", str(store.path)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80", "FORCE_COLOR": "1"})
    plain = re.sub(r"\x1b\[[0-9;]*m", "", result.output)
    assert max(map(len, plain.splitlines())) <= 80
    for run in store.list_runs():
        assert run["id"] in plain
    assert "*" in plain and "cost" in plain  # the front and the last column are there
