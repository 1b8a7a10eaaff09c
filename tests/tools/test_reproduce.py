"""`fp4 reproduce`: the statistics against hand-computed values, study files, claims judged on
runs written by hand, and a shipped study trained on the CPU, stopped and resumed."""

import json
import math

import pytest
from typer.testing import CliRunner

from fp4cli.analysis.errors import AnalysisError
from fp4cli.analysis.reproduce import StudyData, evaluate
from fp4cli.analysis.stats import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    beta_regularized,
    mean_std,
    paired_test,
    t_cdf,
    t_quantile,
)
from fp4cli.analysis.study import Overrides, load_study, parse_study, study_names, study_spec
from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.sweep import plan_sweep

# The statistics, by hand.


def test_mean_and_sample_std_by_hand():
    mean, std = mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    assert std == pytest.approx(math.sqrt(((4 / 3) ** 2 + (1 / 3) ** 2 + (5 / 3) ** 2) / 2))
    assert math.isnan(mean_std([3.0])[1])


@pytest.mark.parametrize("t", [-7.0, -1.3, 0.0, 0.4, 2.0, 31.0])
def test_t_cdf_against_the_closed_forms_of_one_and_two_degrees_of_freedom(t):
    assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)  # Cauchy
    assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(t * t + 2)), abs=1e-12)


def test_t_quantiles_and_the_incomplete_beta_by_hand():
    assert t_quantile(0.95, 1) == pytest.approx(math.tan(0.45 * math.pi), rel=1e-9)  # 6.3138
    assert t_quantile(0.95, 2) == pytest.approx(math.sqrt(1.62 / 0.19), rel=1e-9)  # 2.9200
    assert t_quantile(0.05, 2) == pytest.approx(-math.sqrt(1.62 / 0.19), rel=1e-9)
    assert t_quantile(0.95, 10_000) == pytest.approx(1.6449, abs=1e-3)  # the normal's
    assert beta_regularized(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert beta_regularized(2.5, 1.0, 0.4) == pytest.approx(0.4**2.5)  # I_x(a, 1) = x^a


def test_paired_test_by_hand():
    # c = (1, 2, 4): t = (7/3) / (sqrt(7/3) / sqrt(3)) = sqrt(7), df 2, p = 1/2 - sqrt(7)/6
    test = paired_test([1.0, 2.0, 4.0])
    assert (test.n, test.df) == (3, 2) and test.t == pytest.approx(math.sqrt(7))
    assert test.p_holds == pytest.approx(0.5 - math.sqrt(7) / 6)  # 0.059: above 0.05
    half = math.sqrt(1.62 / 0.19) * math.sqrt(7 / 3) / math.sqrt(3)
    assert (test.low, test.high) == pytest.approx((7 / 3 - half, 7 / 3 + half))
    assert test.verdict == INCONCLUSIVE and test.low < 0 < test.high
    # c = (2, 3, 4): t = 3 sqrt(3), p = 1/2 - t / (2 sqrt(29)) = 0.0175
    test = paired_test([2.0, 3.0, 4.0])
    assert test.p_holds == pytest.approx(0.5 - 3 * math.sqrt(3) / (2 * math.sqrt(29)))
    assert test.verdict == REPRODUCED and test.low > 0
    assert paired_test([-2.0, -3.0, -4.0]).verdict == NOT_REPRODUCED


def test_never_a_verdict_on_one_seed():
    assert paired_test([5.0]).verdict == INCONCLUSIVE
    assert paired_test([]).verdict == INCONCLUSIVE
    assert paired_test([0.0, 0.0, 0.0]).verdict == INCONCLUSIVE  # no effect at all
    assert paired_test([0.1, 0.1]).verdict == REPRODUCED  # two seeds that agree exactly
    with pytest.raises(ValueError, match="finite"):
        paired_test([1.0, math.inf])


# Study files.


def _study(**changes):
    raw = {
        "name": "hand",
        "base": "mxfp4",
        "tasks": ["regression"],
        "seeds": [0, 1, 2],
        "train": {"size": "debug", "steps": 10, "batch_size": 8},
        "baselines": ["bf16", "mxfp4", "tetrajet", "tetrajet-qema"],
        "paper": {"metric": "top1", "values": {"bf16": 60.0, "mxfp4": 50.0, "tetrajet": 55.0}},
        "claims": [
            {"statement": "tetrajet closes half", "kind": "closes", "arm": "tetrajet",
             "of": "mxfp4", "share": "1/2"},
            {"statement": "qema is better", "kind": "better", "arm": "tetrajet-qema",
             "than": "tetrajet"},
            {"statement": "qema oscillates less", "kind": "lower", "metric": "osc_share",
             "arm": "tetrajet-qema", "than": "tetrajet"},
        ],
    }  # fmt: skip
    return parse_study(raw | changes, "hand.yaml")


def test_every_shipped_study_loads_with_three_seeds_or_more():
    assert study_names() == ["hu", "sr-bits", "tetrajet", "tseng", "wang"]
    for name in study_names():
        study = load_study(name)
        spec = study_spec(study, Overrides())
        assert len(spec.seeds) >= 3 and "bf16" in spec.baselines and study.claims
        assert study.paper.citation


def test_overrides_name_the_sweep_apart_and_drop_cuda_graphs_on_a_cpu():
    study = load_study("tseng")
    assert study_spec(study, Overrides()).name == "tseng"
    spec = study_spec(study, Overrides(size="debug", steps=5, seeds=(0, 1), cpu=True))
    assert spec.name == "tseng-size_debug-steps_5" and spec.seeds == (0, 1)
    assert study_spec(study, Overrides(seeds=(2, 3))).name == "tseng"  # seeds share the sweep
    train = dict(spec.train)
    assert train["size"] == "debug" and train["steps"] == 5 and "cuda_graph" not in train
    assert dict(study_spec(study, Overrides(cuda_graph=False)).train)["cuda_graph"] is False
    assert dict(study_spec(load_study("wang"), Overrides(cuda_graph=True)).train)["cuda_graph"]
    with pytest.raises(AnalysisError, match="--cuda-graph: needs a CUDA device"):
        study_spec(study, Overrides(cpu=True, cuda_graph=True))
    fields = (("model", {"n_layer": 2}), ("stats_every", 5))
    spec = study_spec(study, Overrides(train=fields))
    assert spec.name.startswith("tseng-set_") and dict(spec.train)["stats_every"] == 5
    assert dict(spec.train)["model"] == {"n_layer": 2}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"seeds": [0, 1]}, "a study needs at least 3 seeds"),
        ({"baselines": ["mxfp4", "tetrajet"]}, "baselines: must list bf16"),
        ({"tasks": ["regression", "gpt"]}, "a study trains one task"),
        ({"claims": []}, "claims: must be a list of claims"),
        ({"claims": [{"statement": "x", "kind": "worse", "arm": "mxfp4"}]}, "kind: must be one"),
        ({"claims": [{"statement": "x", "kind": "better", "arm": "nope", "than": "mxfp4"}]},
         "'nope' is not an arm of the study"),
        ({"claims": [{"statement": "x", "kind": "closes", "arm": "tetrajet", "of": "mxfp4",
                      "share": 1.5}]}, "share: must be a share from 0"),
        ({"claims": [{"statement": "x", "kind": "better", "arm": "tetrajet"}]},
         "than: a better claim needs it"),
        ({"claims": [{"statement": "x", "kind": "pareto", "arm": "mxfp4", "share": 1}]},
         "share: not a key of a pareto claim"),
        ({"paper": {"values": {"mxfp4": 1.0}}}, "paper.metric: name the metric"),
        ({"paper": {"metric": "top1", "values": {"mxfp4": "high"}}}, "must be a number"),
    ],
)  # fmt: skip
def test_bad_study_files_give_one_line_errors(changes, message):
    with pytest.raises(AnalysisError, match="hand.yaml") as error:
        _study(**changes)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_unknown_study_suggests_the_name():
    with pytest.raises(AnalysisError, match="did you mean 'tseng'"):
        load_study("tsneg")


# Claims judged on runs written by hand.

LAYERS = [("layers.0", 256, 64, 64, True), ("head", 256, 64, 4, False)]


def _write_runs(store, spec, values, stats=None, diverged=()):
    """A finished run per point with its arm's val_loss at the seed, `stats` (arm -> osc_share
    per seed) at the last statistics step; (arm, seed) in `diverged` diverge."""
    from fp4cli.analysis.reproduce import arm_name
    from fp4cli.sweep import expand_points

    sweep_id = store.ensure_sweep(spec.name, spec.to_dict())
    for point in expand_points(spec):
        arm = arm_name(point)
        config = {"train": point.train, "recipe": point.recipe}
        run_id = store.create_run("regression", point.recipe["name"], point.seed, config, "cpu",
                                  {}, tags=[f"point:{point.id}"], sweep=sweep_id)  # fmt: skip
        store.log_layers(run_id, LAYERS)
        if (arm, point.seed) in diverged:
            store.finish_run(run_id, "diverged", step=4)
            continue
        store.log_metrics(run_id, 10, {"val_loss": values[arm][point.seed], "train_loss": 1.0})
        if arm in (stats or {}):
            for step, share in ((5, 0.99), (10, stats[arm][point.seed])):
                rows = [(layer, "weight", "osc_share", share) for layer in ("l0", "l1")]
                store.log_quant_stats(run_id, step, rows)
        store.finish_run(run_id, "finished", step=10)


def _judge(store, study):
    spec = study_spec(study, Overrides())
    plan = plan_sweep(spec, store, record=False)
    return evaluate(study, StudyData(store, spec, plan, "h100", measured=False))


VALUES = {
    "bf16": [1.00, 1.02, 1.01],
    "mxfp4": [1.10, 1.14, 1.12],  # gaps 0.10, 0.12, 0.11
    "tetrajet": [1.02, 1.05, 1.03],  # gaps 0.02, 0.03, 0.02
    "tetrajet-qema": [1.03, 1.04, 1.05],  # gaps 0.03, 0.02, 0.04
}
STATS = {"tetrajet": [0.70, 0.71, 0.73], "tetrajet-qema": [0.60, 0.62, 0.61]}


def test_claims_judged_by_hand(tmp_path):
    store = RunStore(tmp_path / "s.db")
    study = _study()
    _write_runs(store, study_spec(study, Overrides()), VALUES, STATS)
    closes, better, lower = _judge(store, study)
    # closes half: c = gap(mxfp4) / 2 - gap(tetrajet) = 0.03, 0.03, 0.035
    test = closes.comparisons[0].test
    assert test.n == 3 and test.mean == pytest.approx((0.03 + 0.03 + 0.035) / 3)
    assert test.std == pytest.approx(mean_std([0.03, 0.03, 0.035])[1])
    assert closes.verdict == REPRODUCED
    assert closes.observed[0] == pytest.approx((0.8 + 0.75 + (1 - 0.02 / 0.11)) / 3)
    assert closes.paper_value == pytest.approx(1 - 5 / 10)  # top1: 60 / 50 / 55
    lines = {line.arm: line for line in closes.lines}
    assert lines["mxfp4"].gap[0] == pytest.approx(0.11) and lines["mxfp4"].paper == 50.0
    # better: c = gap(tetrajet) - gap(tetrajet-qema) = -0.01, 0.01, -0.02: t = -0.756
    test = better.comparisons[0].test
    assert test.mean == pytest.approx(-0.02 / 3)
    assert test.t == pytest.approx(-0.02 / 3 / (mean_std([-0.01, 0.01, -0.02])[1] / math.sqrt(3)))
    assert better.verdict == INCONCLUSIVE and better.paper_value is None  # no qema number
    # lower osc_share at the last statistics step (not the 0.99 of step 5): c = 0.10, 0.09, 0.12
    assert lower.comparisons[0].test.mean == pytest.approx(0.31 / 3)
    assert lower.verdict == REPRODUCED
    assert all(line.paper is None for line in lower.lines)  # the paper's numbers are top1
    assert [line.arm for line in lower.lines] == ["tetrajet-qema", "tetrajet"]  # no bf16 stats


def test_a_claim_that_fails_and_a_diverged_seed_left_out(tmp_path):
    store = RunStore(tmp_path / "s.db")
    study = _study()
    values = VALUES | {"tetrajet": [1.09, 1.13, 1.11]}  # gaps 0.09, 0.11, 0.10: not half
    _write_runs(store, study_spec(study, Overrides()), values, diverged={("tetrajet-qema", 2)})
    closes, better, lower = _judge(store, study)
    assert closes.verdict == NOT_REPRODUCED and closes.comparisons[0].test.high < 0
    assert better.comparisons[0].test.n == 2
    assert "seed 2 left out: tetrajet-qema diverged" in better.notes
    assert lower.verdict == INCONCLUSIVE and "no osc_share recorded" in lower.notes[0]


def test_a_within_claim_holds_where_the_arm_stays_under_the_margin(tmp_path):
    """within: c = margin - (gap(arm) - gap(of)), judged as the other claims; a bad margin is
    one line."""
    store = RunStore(tmp_path / "s.db")
    claim = {"statement": "qema within 0.02", "kind": "within", "arm": "tetrajet-qema",
             "of": "tetrajet", "margin": 0.02}  # fmt: skip
    study = _study(claims=[claim])
    _write_runs(store, study_spec(study, Overrides()), VALUES)
    (within,) = _judge(store, study)
    # gap(qema) - gap(tetrajet) = 0.01, -0.01, 0.02: c = 0.01, 0.03, 0.0
    test = within.comparisons[0].test
    assert test.n == 3 and test.mean == pytest.approx(0.04 / 3)
    assert within.verdict == INCONCLUSIVE  # the seeds' spread is wider than the margin's room
    assert within.observed[0] == pytest.approx(0.02 / 3)
    (loose,) = _judge(store, _study(claims=[claim | {"margin": 0.1}]))
    assert loose.verdict == REPRODUCED
    (tight,) = _judge(
        store,
        _study(
            claims=[
                claim | {"margin": 0.0},
            ]
        ),
    )
    assert tight.comparisons[0].test.mean == pytest.approx(-0.02 / 3)
    for bad in (-0.1, "small", float("inf"), True):
        with pytest.raises(AnalysisError, match="margin: must be a finite number at least 0"):
            _study(claims=[claim | {"margin": bad}])


def test_the_sr_bits_study_compares_each_recipe_at_both_resolutions():
    study = load_study("sr-bits")
    spec = study_spec(study, Overrides())
    arms = {c.arm: c.other for c in study.claims}
    assert arms == {f"method={m},bits=8": f"method={m},bits=24"
                    for m in ("tetrajet", "tseng-rht-sr", "nvidia-nvfp4")}  # fmt: skip
    assert all(c.kind == "within" and c.margin == 0.01 for c in study.claims)
    assert len(spec.seeds) == 5 and spec.baselines == ("bf16",)


def _grid_study(claims):
    axes = {
        "scale": {"e8m0": {}, "ue5m3": {"linear.*.*.scale": "ue5m3",
                                        "linear.*.*.tensor_scale": True}},
        "block": {"set": "linear.*.*.block", "values": [16, 32]},
    }  # fmt: skip
    return _study(baselines=["bf16"], axes=axes, paper={}, claims=claims)


PARETO = {"statement": "ue5m3/16 is on the front", "kind": "pareto",
          "arm": {"scale": "ue5m3", "block": 16}}  # fmt: skip
AXIS = {"statement": "ue5m3 beats e8m0", "kind": "axis", "axis": "scale", "arm": "ue5m3",
        "than": "e8m0", "at_equal": ["block"]}  # fmt: skip


def _grid_values(gaps):
    bf16 = [1.0, 1.1, 1.2]
    values = {"bf16": bf16}
    for (scale, block), gap in gaps.items():
        values[f"scale={scale},block={block}"] = [b + gap + 0.001 * s for s, b in enumerate(bf16)]
    return values


def test_pareto_and_axis_claims(tmp_path):
    # cost model (h100): e8m0/32 < e8m0/16 < ue5m3/32 < ue5m3/16, the costliest
    study = _grid_study([PARETO, AXIS])
    gaps = {("e8m0", 16): 0.08, ("e8m0", 32): 0.10, ("ue5m3", 16): 0.02, ("ue5m3", 32): 0.05}
    store = RunStore(tmp_path / "a.db")
    _write_runs(store, study_spec(study, Overrides()), _grid_values(gaps))
    pareto, axis = _judge(store, study)
    assert len(pareto.comparisons) == 3 and pareto.verdict == REPRODUCED
    assert {c.verdict for c in pareto.comparisons} == {"holds"}
    assert pareto.observed[0] == 1.0  # on the front of the means
    assert [c.label.split(":")[0] for c in axis.comparisons] == ["block=16", "block=32"]
    assert all("mean of 1 matched pair" in c.label for c in axis.comparisons)
    assert [line.arm for line in axis.lines] == ["scale=ue5m3 (2 points)", "scale=e8m0 (2 points)"]
    assert axis.comparisons[0].test.mean == pytest.approx(0.06)
    assert axis.comparisons[1].test.mean == pytest.approx(0.05)
    assert axis.verdict == REPRODUCED
    # the costliest point with a larger gap than a cheaper one is off the front
    gaps = gaps | {("ue5m3", 16): 0.12}
    store = RunStore(tmp_path / "b.db")
    _write_runs(store, study_spec(study, Overrides()), _grid_values(gaps))
    pareto, axis = _judge(store, study)
    assert pareto.verdict == NOT_REPRODUCED and pareto.observed[0] == 0.0
    assert {c.verdict for c in pareto.comparisons} == {"fails"}  # every cheaper point is better
    assert axis.verdict == NOT_REPRODUCED  # block 16: ue5m3 is 0.04 worse at every seed


def _text(result):
    return " ".join(result.output.split())


# A shipped study on the CPU: stopped after three runs, resumed without repeating them.


def test_a_study_runs_on_the_cpu_stops_and_resumes(tmp_path, monkeypatch):
    import fp4cli.train as train

    db = tmp_path / "s.db"
    args = ["reproduce", "tseng", "--size", "debug", "--steps", "3", "--seeds", "0,1",
            "--device", "cpu", "--store", str(db), "--quiet"]  # fmt: skip
    real, calls = train.run_training, []

    def stopped_after_three(*a, **kw):
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C while the fourth run starts
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(train, "run_training", stopped_after_three)
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 130 and "Run the same command again" in _text(first)
    finished = {r["id"] for r in RunStore(db).list_runs(status="finished")}
    assert len(finished) == 3
    monkeypatch.setattr(train, "run_training", real)
    second = CliRunner().invoke(app, [*args, "--plots", str(tmp_path / "plots")])
    assert second.exit_code == 0, second.output
    assert "8 runs, 3 done, 5 to run" in _text(second)
    runs = RunStore(db).list_runs()
    assert len(runs) == 8 and {r["status"] for r in runs} == {"finished"}
    assert finished <= {r["id"] for r in runs}  # the first three kept, not trained again
    assert "Claim 1 (closes)" in _text(second) and "Verdicts" in second.output
    assert (tmp_path / "plots" / "curves.png").stat().st_size > 0
    third = CliRunner().invoke(app, [*args, "--json"])
    assert third.exit_code == 0, third.output
    report = json.loads(third.stdout)
    assert report["runs"] == {"total": 8, "done": 8} and len(report["claims"]) == 3
    assert {c["verdict"] for c in report["claims"]} <= {REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE}
    assert len(RunStore(db).list_runs()) == 8
    # other seeds of the same study: the finished seeds count, only the new one trains
    assert args[6:8] == ["--seeds", "0,1"]
    more = CliRunner().invoke(app, [*args[:7], "0,1,2", *args[8:], "--dry-run"])
    assert more.exit_code == 0, more.output
    assert "12 runs, 8 done, 4 to run" in _text(more)
    one = CliRunner().invoke(app, [*args[:7], "1", *args[8:], "--json"])
    assert one.exit_code == 0, one.output
    assert json.loads(one.stdout)["runs"] == {"total": 4, "done": 4}
    assert len(RunStore(db).list_runs()) == 8  # judged on seed 1's runs, none trained


def test_cli_list_dry_run_and_errors(tmp_path):
    runner = CliRunner()
    listed = runner.invoke(app, ["reproduce", "--list"])
    assert listed.exit_code == 0 and all(name in listed.output for name in study_names())
    db = tmp_path / "s.db"
    dry = runner.invoke(app, ["reproduce", "hu", "--dry-run", "--store", str(db)])
    assert dry.exit_code == 0, dry.output
    assert "85 runs, 0 done, 85 to run" in _text(dry) and "claim 2 (axis)" in dry.output
    assert RunStore(db).list_runs() == [] and RunStore(db).sweeps() == []
    for args, message in (
        (["reproduce", "nope"], "unknown study 'nope'"),
        (["reproduce", "wang", "--seeds", "0,x"], "--seeds: must be integers"),
        (["reproduce", "wang", "--data", str(tmp_path / "missing")], "does not exist"),
        (["reproduce"], "name a study"),
        (["reproduce", "wang", "--set", "linear.dge=null"], "a study trains the paper's recipes"),
        (["reproduce", "wang", "--set", "seed=3"], "--set seed: set by the study itself"),
        (["reproduce", "wang", "--size", "gpt-345m"], "task 'regression' has no size 'gpt-345m'"),
        (["reproduce", "wang", "--set", "model.n_layer=2"], "has no model field 'n_layer'"),
    ):
        result = runner.invoke(app, [*args, "--store", str(db)])
        assert result.exit_code == 2 and message in _text(result), result.output
    impossible = ["reproduce", "tseng", "--size", "debug", "--set", "model.n_head=5", "--dry-run"]
    result = runner.invoke(app, [*impossible, "--store", str(db)])
    assert result.exit_code == 2 and "not a multiple of model.n_head 5" in _text(result)


def test_the_wang_study_runs_on_the_llama_task(tmp_path):
    """The paper's kind of model: every arm of `fp4 reproduce wang` trains the Llama decoder."""
    db = tmp_path / "s.db"
    args = ["reproduce", "wang", "--task", "llama", "--size", "debug", "--steps", "2",
            "--seeds", "0", "--device", "cpu", "--store", str(db), "--quiet", "--json"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    runs = RunStore(db).list_runs()
    assert {r["task"] for r in runs} == {"llama"} and {r["status"] for r in runs} == {"finished"}
    assert len(runs) == 5  # bf16, wang-direct, wang-fp4 and the two single techniques


def test_the_named_corpus_is_data_for_every_run(tmp_path, monkeypatch):
    """`--data python-sources` names the corpus, as `fp4 train --data` takes it, not a path."""
    monkeypatch.chdir(tmp_path)  # no file of that name here
    args = ["reproduce", "wang", "--task", "llama", "--size", "debug", "--data", "python-sources",
            "--dry-run", "--store", str(tmp_path / "s.db")]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "to run" in result.output
    missing = CliRunner().invoke(app, [*args[:7], "no-such-folder", *args[8:]])
    assert missing.exit_code != 0 and "no-such-folder does not exist" in _text(missing)
