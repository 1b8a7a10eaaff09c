"""The quest and quartet recipes: what they resolve to, that they train on the regression task on
the CPU, and that the options they added leave every other shipped recipe as it was."""

import dataclasses
import json

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.linear import LinearConfig
from fp4cli.quant import QuantSpec
from fp4cli.recipes import list_recipes, load_recipe
from fp4cli.store import RunStore
from fp4cli.techniques import HadamardConfig, TrustConfig

NEW = ("quartet", "quest")


def test_quartet_resolves_to_its_code():
    quest = QuantSpec.preset("mxfp4-quest")
    tseng = QuantSpec(rounding="sr", sr_prescale=0.75)
    expected = LinearConfig(
        forward_x=quest, forward_w=quest, grad_input_dy=tseng, grad_input_w=tseng,
        grad_weight_dy=tseng, grad_weight_x=tseng,
        forward_hadamard=HadamardConfig(32, random=False), grad_input_hadamard=HadamardConfig(32),
        grad_weight_hadamard=HadamardConfig(32), double_quant=True, trust=TrustConfig("clip", 0.0),
    )  # fmt: skip
    assert load_recipe("quartet").linear == expected
    assert quest == QuantSpec(scale_rule="std", rms_clip=2.92247856)


def test_quest_resolves_to_its_code():
    row = QuantSpec.preset("fp4-row-rms")
    expected = LinearConfig(
        forward_x=row, forward_w=row, forward_hadamard=HadamardConfig(128, random=False),
        double_quant=True, trust=TrustConfig("error", 1.0),
    )  # fmt: skip
    recipe = load_recipe("quest")
    assert recipe.linear == expected and recipe.skip == ("head", "lm_head", "*embed*")


def test_other_recipes_do_not_change():
    """The new fields stay out of every other recipe's resolved form (and so out of its sweep
    points' ids)."""
    for name in list_recipes():
        if name in NEW:
            continue
        text = json.dumps(load_recipe(name).to_dict())
        assert "rms_clip" not in text and '"trust"' not in text, name


def train_args(db, name: str) -> list[str]:
    return ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--recipe",
            name, "--steps", "3", "--batch-size", "4", "--store", str(db), "--quiet", "--set",
            "checkpoints=false"]  # fmt: skip


@pytest.mark.parametrize("name", NEW)
def test_fp4_train_runs_the_recipe_on_the_cpu(tmp_path, name):
    db = tmp_path / "fp4.db"
    result = CliRunner().invoke(app, [*train_args(db, name), "--set", "log_every=1"])
    assert result.exit_code == 0, result.output
    store = RunStore(db)
    (run,) = store.list_runs()
    assert run["status"] == "finished" and run["config"]["recipe"]["linear"]["trust"]
    losses = [m["value"] for m in store.metrics(run["id"], "train_loss")]
    assert len(losses) == 3 and torch.isfinite(torch.tensor(losses)).all()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("linear.trust.bound=-1", r"linear.trust.bound: must be a number in [0, 64]"),
        ("linear.trust.rule=median", "linear.trust.rule: must be one of clip, error"),
        ("linear.forward.x.rms_clip=0", "linear.forward.x.rms_clip: scale_rule std needs"),
    ],
)
def test_bad_values_are_one_line_errors(tmp_path, override, message):
    result = CliRunner().invoke(app, [*train_args(tmp_path / "fp4.db", "quartet"), "--set",
                                      override])  # fmt: skip
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], result.output


@pytest.mark.parametrize("name", NEW)
def test_show_prints_a_loadable_recipe(tmp_path, name):
    result = CliRunner().invoke(app, ["recipes", "show", name])
    assert result.exit_code == 0, result.output
    path = tmp_path / f"{name}.yaml"
    path.write_text(result.stdout)
    assert load_recipe(path).linear == load_recipe(name).linear
    assert "trust" in yaml.safe_load(result.stdout)["linear"]


def test_the_codes_backward_signs_are_one_option_away():
    """Quartet's v1 code multiplies its signs after the Hadamard, where they cancel: its
    backward transform is the fixed H_32."""
    from fp4cli.recipes import apply_overrides

    v1 = apply_overrides(
        load_recipe("quartet"),
        ["linear.grad_input.hadamard.random=false", "linear.grad_weight.hadamard.random=false"],
    )
    fixed = HadamardConfig(32, random=False)
    assert v1.linear == dataclasses.replace(
        load_recipe("quartet").linear, grad_input_hadamard=fixed, grad_weight_hadamard=fixed
    )
