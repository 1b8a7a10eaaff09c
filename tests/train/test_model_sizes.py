"""Named model sizes (gpt-345m, deit-tiny) and `--set model.FIELD=VALUE` for every task's
architecture fields, with one-line errors for impossible shapes."""

import pytest
import torch
from typer.testing import CliRunner

from fp4cli.analysis.report import build_report, select_runs
from fp4cli.cli.main import app
from fp4cli.store import RunStore
from fp4cli.tasks import base, diffusion, gpt, regression, vit
from fp4cli.tasks.base import TaskError, create_task
from fp4cli.tasks.common import count_params
from fp4cli.tasks.gpt_model import GPT
from fp4cli.train.config import TrainConfig, resolve_config


def test_gpt_345m_is_tseng_et_als_smallest_shape():
    config = gpt.SIZES["gpt-345m"].model
    assert (config.n_layer, config.n_embd, config.n_head, config.block_size) == (24, 1024, 16, 1024)
    # by hand: embeddings 256 x 1024 + 1024 x 1024, 24 blocks of 12 C^2 + 13 C, the final norm
    per_block = 12 * 1024**2 + 13 * 1024
    expected = 256 * 1024 + 1024 * 1024 + 24 * per_block + 2 * 1024
    assert count_params(lambda: GPT(config)) == expected  # 303.6M over bytes
    assert gpt.DEFAULTS["gpt-345m"].batch_size == 8


@pytest.mark.parametrize(
    ("size", "shape"),
    [("wide-2048", (6, 2048, 16, 5632)), ("wide-4096", (4, 4096, 32, 11008))],
)
def test_wide_sizes_have_llama_widths_and_mlp_widths(size, shape):
    """Llama 1B's (TinyLlama's) and Llama 7B's width and MLP width, in a few GPT blocks."""
    config = gpt.SIZES[size].model
    assert (config.n_layer, config.n_embd, config.n_head, config.mlp_width) == shape
    with torch.device("meta"):
        model = GPT(config)
    assert model.blocks[0].mlp.fc1.weight.shape == (shape[3], shape[1])
    assert gpt.DEFAULTS[size].batch_size == 8


def test_the_mlp_width_is_a_model_field():
    task = gpt.GPTTask("debug", None, torch.device("cpu"), model={"n_mlp": 48})
    assert task.build_model().blocks[0].mlp.fc2.weight.shape == (32, 48)
    assert gpt.SIZES["debug"].model.mlp_width == 4 * 32  # 0: GPT-2's four times the width


def test_deit_tiny_is_deit_tinys_shape():
    size = vit.SIZES["deit-tiny"]
    assert (size.image_size, size.patch_size, size.embed_dim, size.depth, size.num_heads) == (
        224, 16, 192, 12, 3)  # fmt: skip
    from timm.models.vision_transformer import VisionTransformer

    with torch.device("meta"):
        model = VisionTransformer(img_size=224, patch_size=16, embed_dim=192, depth=12,
                                  num_heads=3, num_classes=1000)  # fmt: skip
    params = sum(p.numel() for p in model.parameters())
    assert model.patch_embed.num_patches == 196 and round(params / 1e6, 1) == 5.7  # DeiT-Ti


def test_model_fields_override_every_task_and_are_described():
    task = create_task("gpt", "debug", model={"n_layer": 3, "n_embd": 48, "n_head": 4})
    model = task.build_model()
    assert len(model.blocks) == 3 and model.tok_embed.weight.shape == (256, 48)
    assert task.describe()["model"]["n_layer"] == 3
    task = create_task("regression", "debug", model={"width": 40, "teacher_depth": 1})
    assert task.build_model().layers[0].weight.shape == (40, 32)
    assert len(task.teacher.weights) == 2
    for fields in (regression.MODEL_FIELDS, gpt.MODEL_FIELDS, vit.MODEL_FIELDS,
                   diffusion.MODEL_FIELDS):  # fmt: skip
        assert fields and "val_samples" not in fields and "vocab_size" not in fields
    assert vit.MODEL_FIELDS == ("image_size", "patch_size", "embed_dim", "depth", "num_heads",
                                "mlp_ratio")  # fmt: skip


@pytest.mark.parametrize(
    ("task", "model", "message"),
    [
        ("gpt", {"n_layers": 3}, "no model field 'n_layers' (did you mean 'n_layer'?)"),
        ("gpt", {"n_embd": 50, "n_head": 3}, "model.n_embd 50 is not a multiple of model.n_head 3"),
        ("gpt", {"n_head": 0}, "model.n_head: must be a positive integer (got 0)"),
        ("gpt", {"n_layer": 2.5}, "model.n_layer: must be a positive integer (got 2.5)"),
        ("gpt", {"n_layer": True}, "must be a positive integer (got True)"),
        ("vit", {"patch_size": 5}, "model.image_size 16 is not a multiple of model.patch_size 5"),
        ("vit", {"embed_dim": 49}, "model.embed_dim 49 is not a multiple of model.num_heads 2"),
        ("vit", {"mlp_ratio": -1}, "model.mlp_ratio: must be a positive number"),
        ("diffusion", {"block_out_channels": [16, 20]}, "block_out_channels 20 is not a multiple"),
        ("diffusion", {"block_out_channels": 16}, "must be a list of positive integers"),
        ("diffusion", {"image_size": 18, "block_out_channels": [16, 32, 32]},
         "model.image_size 18 is not a multiple of model.block_out_channels' halvings 4"),
        ("regression", {"val_samples": 8}, "task 'regression' has no model field 'val_samples'"),
    ],
)  # fmt: skip
def test_impossible_shapes_are_one_line_errors(task, model, message):
    with pytest.raises(TaskError) as error:
        create_task(task, "debug", model=model)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_task_without_model_fields_refuses_them(monkeypatch):
    def fixed(size="default", data=None, device=None):  # a task of one shape, never built
        raise AssertionError

    monkeypatch.setitem(base._REGISTRY, "fixed-shape", fixed)  # registered for this test only
    with pytest.raises(TaskError, match="task 'fixed-shape' takes no model fields"):
        create_task("fixed-shape", model={"width": 3})


def test_set_model_fields_reach_the_config_and_survive_a_round_trip():
    config, recipe_overrides = resolve_config(
        {"task": "gpt"}, ["model.n_layer=4", "model.n_head=2", "lr=1e-3", "linear.forward.x=null"]
    )
    assert config.model == (("n_head", 2), ("n_layer", 4)) and config.lr == 1e-3
    assert recipe_overrides == ["linear.forward.x=null"]
    assert config.to_dict()["model"] == {"n_head": 2, "n_layer": 4}
    assert TrainConfig.from_dict(config.to_dict()) == config
    listed = TrainConfig(model={"block_out_channels": [8, 16]})
    assert listed.to_dict()["model"] == {"block_out_channels": [8, 16]}
    assert TrainConfig.from_dict(listed.to_dict()) == listed
    assert hash(listed)  # a frozen config stays hashable


def test_cli_trains_with_a_model_field_and_refuses_an_impossible_one(tmp_path):
    db = tmp_path / "s.db"
    base = ["train", "--task", "regression", "--size", "debug", "--steps", "2", "--device", "cpu",
            "--store", str(db), "--quiet", "--set", "checkpoints=false"]  # fmt: skip
    result = CliRunner().invoke(app, [*base, "--set", "model.width=48"])
    assert result.exit_code == 0, result.output
    (run,) = RunStore(db).list_runs()
    assert run["config"]["train"]["model"] == {"width": 48}
    assert run["config"]["task"]["model"]["width"] == 48
    bad = CliRunner().invoke(app, [*base, "--set", "model.width=0"])
    assert bad.exit_code == 2 and "model.width: must be a positive integer" in bad.output


def test_report_compares_only_runs_of_the_same_model_fields(tmp_path):
    store = RunStore(tmp_path / "s.db")
    train = {"size": "debug", "steps": 10, "batch_size": 8, "data": None}
    for recipe, value, model in (("bf16", 0.5, {}), ("mxfp4", 0.6, {"width": 48})):
        config = {"train": train | {"model": model}, "recipe": {}}
        run_id = store.create_run("regression", recipe, 0, config, "cpu", {})
        store.log_metrics(run_id, 10, {"val_loss": value})
        store.finish_run(run_id, "finished", step=10)
    rows = {row.recipe: row for row in build_report(store, select_runs(store)).rows}
    assert rows["mxfp4"].gap is None  # no bf16 run of its shape
    assert rows["bf16"].gap == 0
