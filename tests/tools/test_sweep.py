"""`fp4 sweep`: the sweep file, its points, running them, killing and resuming, workers."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.linear.operands import OPERANDS
from fp4cli.store import RunStore
from fp4cli.sweep import SweepError, expand_points, load_sweep, parse_sweep, plan_sweep, run_sweep

FP4 = [sys.executable, "-m", "fp4cli.cli"]
TRAIN = {"size": "debug", "steps": 3, "device": "cpu", "checkpoints": False, "log_every": 1}
AXES = {
    "bwd": {"set": "linear.grad_*.*.rounding", "values": ["rne", "sr"]},
    "linear.grad_weight.hadamard": [None, 32],
}


def _spec(**changes):
    raw = {"name": "tiny", "base": "mxfp4", "tasks": ["regression"], "train": TRAIN, "axes": AXES}
    return parse_sweep(raw | changes, "tiny.yaml")


def _write(tmp_path, **changes):
    raw = {"name": "tiny", "base": "mxfp4", "tasks": ["regression"], "train": TRAIN, "axes": AXES}
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(raw | changes))
    return path


def _point_runs(store, name):
    """point id -> list of (run id, status) of the sweep called `name`."""
    runs = store.list_runs(sweep=store.get_sweep(name)["id"])
    by_point = {}
    for run in runs:
        point = next(t[len("point:") :] for t in run["tags"] if t.startswith("point:"))
        by_point.setdefault(point, []).append((run["id"], run["status"]))
    return by_point


# The sweep file and its points.


def test_grid_with_baselines_and_a_point_equal_to_a_baseline_made_once():
    points = expand_points(_spec())
    # 2 x 2 grid + bf16 + mxfp4; the grid point (rne, null) is plain mxfp4: one point.
    assert len(points) == 5
    assert [p.label for p in points[:2]] == ["baseline", "baseline"]
    assert [p.recipe["name"] for p in points[:2]] == ["bf16", "mxfp4"]
    assert len({p.id for p in points}) == 5


def test_wildcard_keys_set_every_quantized_operand_and_leave_null_ones():
    spec = _spec(base="tseng-rht-sr", baselines=[], axes={"linear.*.*.block": [16, 64]})
    for point in expand_points(spec):
        linear = point.recipe["linear"]
        assert linear["forward"]["x"] is None and linear["forward"]["w"] is None
        blocks = {linear[g][o]["block"] for g, o in [("grad_input", "dy"), ("grad_weight", "x")]}
        assert blocks == {int(point.choices["linear.*.*.block"])}


def test_an_axis_over_the_base_recipe_and_the_rounding_resolution():
    """`set: base` starts each point from another recipe, before the other keys apply;
    `linear.*.*.sr_bits` reaches every stochastically rounded operand of each."""
    axes = {
        "method": {"set": "base", "values": ["tetrajet", "nvidia-nvfp4"]},
        "bits": {"set": "linear.*.*.sr_bits", "values": [24, 8]},
    }
    points = expand_points(_spec(baselines=[], axes=axes))
    assert len(points) == 4
    for point in points:
        method, bits = point.choices["method"], int(point.choices["bits"])
        linear = point.recipe["linear"]
        assert point.recipe["name"].startswith(f"{method}[")
        assert (linear.get("gemm") == "exact") == (method == "nvidia-nvfp4")
        dy = linear["grad_weight"]["dy"]
        assert dy["rounding"] == "sr" and dy.get("sr_bits", 24) == bits
        assert "sr_bits" not in linear["forward"]["x"]  # rounds to nearest: left as it is
    with pytest.raises(SweepError, match="no-such-recipe"):
        expand_points(
            _spec(baselines=[], axes={"m": {"set": "base", "values": ["no-such-recipe"]}})
        )


def test_wildcard_keys_reach_the_operands_a_default_valued_field_applies_to():
    """Fields resolved recipes leave out at their default: `four_over_six_metric` reaches the
    four-over-six operands, `scale_bf16` the E2M1 operands with a ceil E8M0 scale per row,
    column or tensor; the rest stay as they are (and valid)."""
    from fp4cli.recipe_loader import apply_overrides
    from fp4cli.recipes import load_recipe

    mae = apply_overrides(load_recipe("nvfp4-4over6"), ["linear.*.*.four_over_six_metric=mae"])
    specs = {name: mae.linear.spec(name) for name in OPERANDS}
    assert (
        {n for n, s in specs.items() if s.four_over_six_metric == "mae"}
        == {n for n, s in specs.items() if s.four_over_six}
        != set()
    )
    bf16 = apply_overrides(load_recipe("wang-fp4"), ["linear.*.*.scale_bf16=true"])
    chosen = {name for name in OPERANDS if bf16.linear.spec(name).scale_bf16}
    assert chosen == {"forward_x", "forward_w"}  # the backward's operands are FP8


def test_exclusion_rules_and_labelled_axes():
    axes = {
        "scale": {"e8m0": {}, "ue5m3": {"linear.*.*.scale": "ue5m3"}},
        "lr": [1e-3, 3e-3],
    }
    spec = _spec(baselines=[], axes=axes, exclude=[{"scale": "ue5m3", "lr": 0.003}])
    points = expand_points(spec)
    assert sorted(p.label for p in points) == [
        "scale=e8m0,lr=0.001",
        "scale=e8m0,lr=0.003",
        "scale=ue5m3,lr=0.001",
    ]
    ue5m3 = next(p for p in points if p.choices["scale"] == "ue5m3")
    assert ue5m3.recipe["linear"]["forward"]["w"]["scale"] == "ue5m3"
    assert ue5m3.train["lr"] == 1e-3  # a training field as an axis


def test_random_sample_is_seeded_and_respects_exclusions():
    axes = {"linear.*.*.block": [16, 32, 64, 128], "linear.grad_weight.hadamard": [None, 16, 32]}
    spec = _spec(baselines=[], axes=axes, sample=5, exclude=[{"linear.*.*.block": 16}])
    first = [p.id for p in expand_points(spec)]
    assert len(first) == 5 and first == [p.id for p in expand_points(spec)]
    assert all(p.choices["linear.*.*.block"] != "16" for p in expand_points(spec))
    other = [p.id for p in expand_points(_spec(baselines=[], axes=axes, sample=5, sample_seed=1))]
    assert other != first


def test_point_ids_depend_on_what_is_trained_not_on_names():
    rht = {"set": "linear.grad_weight.hadamard", "values": [None, 32]}
    renamed = {"backward_rounding": AXES["bwd"], "rht": rht}
    assert {p.id for p in expand_points(_spec())} == {
        p.id for p in expand_points(_spec(axes=renamed))
    }
    other_seed = {p.id for p in expand_points(_spec(seeds=[1]))}
    assert other_seed.isdisjoint(p.id for p in expand_points(_spec()))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"axis": {}}, "axis: unknown key (did you mean 'axes'?)"),
        ({"axes": {"linear.forward.x.rounding": "sr"}}, "must be a list of values"),
        ({"axes": {"rounding": ["sr"]}}, "neither a training field nor a recipe key"),
        ({"axes": {"seed": [1, 2]}}, "is set by the sweep itself"),
        ({"axes": {"lr": []}}, "has no values"),
        ({"exclude": [{"nope": 1}]}, "exclude[0]: no axis 'nope'"),
        ({"exclude": [{"bwd": "away"}]}, "'away' is not a value of the axis (rne, sr)"),
        ({"train": {"stepz": 3}}, "train.stepz: unknown key (did you mean 'steps'?)"),
        ({"train": {"steps": -1}}, "train.steps: must be a positive integer"),
        ({"seeds": ["a"]}, "seeds: must be a list of integers"),
        ({"seeds": [0, -1]}, "seeds: each must be from 0 to 2^63 - 1 (got -1)"),
        ({"seeds": [2**63]}, "seeds: each must be from 0 to 2^63 - 1 (got 9223372036854775808)"),
        ({"sample": 0}, "sample: must be an integer from 1 to"),
        ({"name": "a b"}, "name: must be letters"),
    ],
)
def test_bad_sweep_files_give_one_line_errors(changes, message):
    with pytest.raises(SweepError) as error:
        _spec(**changes)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith("tiny.yaml: ")


def test_a_sweep_whose_every_point_failed_offers_nothing_to_compare():
    from fp4cli.cli.sweep_cmd import _summary
    from fp4cli.sweep.point_run import PointResult

    failed = PointResult("p1", "grid", "regression", 0, "failed", message="boom")
    finished = PointResult("p2", "grid", "regression", 0, "finished")
    all_failed = _summary("tiny", [failed], "s.db")
    assert "compare them with" not in all_failed and "Every point failed" in all_failed
    assert "[red]failed[/] grid (regression): boom" in all_failed
    some_finished = _summary("tiny", [failed, finished], "s.db")
    assert "compare them with: fp4 report --sweep tiny" in some_finished


def test_an_impossible_point_names_itself_and_the_way_out():
    spec = _spec(baselines=[], axes={"linear.forward.x.block": [7]})
    with pytest.raises(SweepError, match=r"block=7.*block: must be an even integer.*exclude"):
        expand_points(spec)


def test_sweep_file_errors(tmp_path):
    with pytest.raises(SweepError, match="no such sweep file"):
        load_sweep(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("axes: [1,\n")
    with pytest.raises(SweepError, match="invalid YAML"):
        load_sweep(bad)
    bad.write_text("- 1\n")
    with pytest.raises(SweepError, match="must be a mapping"):
        load_sweep(bad)


# Running.


def test_sweep_runs_every_point_once_and_a_second_run_has_nothing_to_do(tmp_path):
    store = RunStore(tmp_path / "s.db")
    spec = _spec()
    results = run_sweep(plan_sweep(spec, store), store)
    assert [r.status for r in results] == ["finished"] * 5
    by_point = _point_runs(store, "tiny")
    assert set(by_point) == {p.id for p in expand_points(spec)}
    assert all(len(runs) == 1 for runs in by_point.values())
    run = store.get_run(results[-1].run_id)
    assert run["sweep"] == store.get_sweep("tiny")["id"] and run["recipe"].startswith("mxfp4[")
    assert store.layers(run["id"])  # the GEMM shapes the cost model needs
    assert store.checkpoints(run["id"]) == []  # checkpoints: false
    again = plan_sweep(spec, store)
    assert again.pending == [] and len(again.done) == 5
    listed = CliRunner().invoke(
        app, ["runs", "list", "--sweep", "tiny", "--store", str(store.path), "--json"]
    )
    assert len(json.loads(listed.output)) == 5
    unknown = CliRunner().invoke(
        app, ["runs", "list", "--sweep", "nope", "--store", str(store.path)]
    )
    assert unknown.exit_code == 2 and "unknown sweep 'nope'" in unknown.output


def test_interrupted_and_failed_attempts_are_replaced_not_duplicated(tmp_path):
    store = RunStore(tmp_path / "s.db")
    spec = _spec()
    plan = plan_sweep(spec, store)
    first, second = plan.points[2], plan.points[3]
    for point, status in ((first, "interrupted"), (second, "failed")):
        run_id = store.create_run(
            "regression", "x", 0, {}, "cpu", {}, tags=[f"point:{point.id}"], sweep=plan.sweep_id
        )
        store.finish_run(run_id, status)
    plan = plan_sweep(spec, store)
    assert len(plan.stale) == 2 and len(plan.pending) == 5
    run_sweep(plan, store)
    by_point = _point_runs(store, "tiny")
    assert all(runs == [(runs[0][0], "finished")] for runs in by_point.values())


def test_workers_write_every_row_without_lock_errors(tmp_path):
    store = RunStore(tmp_path / "s.db")
    spec = _spec(seeds=[0, 1])
    results = run_sweep(plan_sweep(spec, store), store, workers=3)
    assert len(results) == 10 and {r.status for r in results} == {"finished"}
    for result in results:  # log_every 1: a train_loss row per step, and the final val_loss
        assert len(store.metrics(result.run_id, "train_loss")) == TRAIN["steps"]
        assert len(store.metrics(result.run_id, "val_loss")) == 1
    assert all(len(runs) == 1 for runs in _point_runs(store, "tiny").values())


@pytest.mark.parametrize("kill", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_sweep_resumes_with_no_duplicate_and_no_missing_run(tmp_path, kill):
    train = TRAIN | {"steps": 20}
    path = _write(tmp_path, train=train, seeds=[0, 1])
    db = tmp_path / "s.db"
    command = [*FP4, "sweep", str(path), "--store", str(db), "--quiet"]
    env = os.environ | {"COLUMNS": "200"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        time.sleep(0.5)
        if db.exists() and len(RunStore(db).list_runs(status="finished")) >= 2:
            break
    assert process.poll() is None, process.stdout.read().decode()
    os.kill(process.pid, kill)
    output = process.communicate(timeout=60)[0].decode()
    if kill == signal.SIGTERM:
        assert process.returncode == 130 and "Run the same command again" in output
    store = RunStore(db)  # a run left `running` by SIGKILL is interrupted now
    finished_before = len(store.list_runs(status="finished"))
    assert 2 <= finished_before < 10
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{finished_before} done, {10 - finished_before} to run" in done.stdout
    by_point = _point_runs(RunStore(db), "tiny")
    assert set(by_point) == {p.id for p in expand_points(load_sweep(path))}
    assert all(len(runs) == 1 and runs[0][1] == "finished" for runs in by_point.values())


# The command.


def test_cli_dry_run_lists_points_and_trains_nothing(tmp_path):
    path = _write(tmp_path)
    result = CliRunner().invoke(
        app, ["sweep", str(path), "--store", str(tmp_path / "s.db"), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    assert "5 points, 0 done, 5 to run" in result.output and "mxfp4[bwd=sr" in result.output
    assert RunStore(tmp_path / "s.db").list_runs() == []
    assert RunStore(tmp_path / "s.db").sweeps() == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("tasks: [nope]\n", "unknown task 'nope'"),
        ("base: nope\n", "unknown recipe 'nope'"),
        ("axes: {linear.forward.x.scale: [e9m9]}\n", "scale: must be one of"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"train": TRAIN}) + content)
    result = CliRunner().invoke(app, ["sweep", str(path), "--store", str(tmp_path / "s.db")])
    assert result.exit_code in (1, 2), result.output
    assert message in result.output


def test_a_stop_outside_the_trainer_stops_the_sweep(tmp_path, monkeypatch):
    """SIGTERM before a point's trainer takes the signal (building its model, say) stops the
    sweep; it is not recorded as a failed point."""
    import fp4cli.train as train
    from fp4cli.sweep.errors import SweepStopped
    from fp4cli.sweep.point_run import run_point

    def stopped(*args, **kwargs):
        raise SweepStopped("stopped by SIGTERM")

    monkeypatch.setattr(train, "run_training", stopped)
    point = expand_points(load_sweep(_write(tmp_path)))[0]
    with pytest.raises(SweepStopped):
        run_point(point, "s-1", (), "cpu", RunStore(tmp_path / "s.db"))
