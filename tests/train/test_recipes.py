"""Recipes: the shipped files, inheritance, overrides, and one-line errors naming file and key."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from fp4cli import recipes as public_api
from fp4cli.linear.config import LinearConfig
from fp4cli.quant.spec import QuantSpec
from fp4cli.recipe_loader import apply_overrides, list_recipes, load_recipe
from fp4cli.recipe_schema import DEFAULT_SKIP, QRampConfig, Recipe, RecipeError
from fp4cli.techniques import DGEConfig, HadamardConfig, OutlierConfig, QEMAConfig
from fp4cli.techniques.hadamard import TE_SIGNS_16

SHIPPED = [
    "bf16",
    "fp4-all-the-way",
    "mxfp4",
    "mxfp4-dht",
    "nvfp4",
    "nvfp4-4over6",
    "nvfp4-4over6-all",
    "nvidia-nvfp4",
    "quartet",
    "quartet2",
    "quartet2-4over6",
    "quest",
    "tetrajet",
    "tetrajet-baseline",
    "tetrajet-qema",
    "tetrajet-qramp",
    "tetrajet-v2",
    "tetrajet-v2-full",
    "tetrajet-v2-osci",
    "tetrajet-v2-outcontrol",
    "tseng-baseline",
    "tseng-rht-sr",
    "ue5m3-hadamard-sr",
    "ufp4",
    "wang-direct",
    "wang-fp4",
]
BACKWARD = ("grad_input_dy", "grad_input_w", "grad_weight_dy", "grad_weight_x")
SR = QuantSpec.preset("mxfp4-ceil", rounding="sr")


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def test_list_recipes_is_sorted_and_complete() -> None:
    assert list_recipes() == SHIPPED


def test_public_api_is_fp4cli_recipes() -> None:
    assert public_api.load_recipe is load_recipe and public_api.Recipe is Recipe
    assert set(public_api.__all__) >= {"apply_overrides", "RecipeError", "QRampConfig"}


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_round_trips(name: str, tmp_path: Path) -> None:
    recipe = load_recipe(name)
    assert recipe.name == name and recipe.description and recipe.citation
    as_json = json.loads(json.dumps(recipe.to_dict()))
    assert "base" not in as_json
    assert Recipe.from_dict(as_json, source="test") == recipe
    # the YAML that `fp4 recipes show` prints is itself a loadable recipe file
    reloaded = load_recipe(write(tmp_path, f"{name}.yaml", recipe.to_yaml()))
    assert dataclasses.replace(reloaded, source=recipe.source) == recipe


def test_shipped_recipe_settings() -> None:
    mx = load_recipe("mxfp4").linear
    assert all(mx.spec(op) == QuantSpec() for op in (*BACKWARD, "forward_x", "forward_w"))
    assert not mx.double_quant and mx.dge is None and mx.hadamard("forward") is None

    tj = load_recipe("tetrajet").linear
    assert tj.forward_x == tj.forward_w == QuantSpec.preset("mxfp4-ceil")
    assert all(tj.spec(op) == SR for op in BACKWARD) and tj.double_quant

    tseng = load_recipe("tseng-rht-sr").linear
    assert tseng.forward_x is None and tseng.forward_w is None
    assert all(tseng.spec(op) == QuantSpec(rounding="sr", sr_prescale=0.75) for op in BACKWARD)
    assert tseng.grad_input_hadamard == tseng.grad_weight_hadamard == HadamardConfig(64)
    assert tseng.forward_hadamard is None

    nv = load_recipe("nvfp4").linear
    assert nv.forward_w == nv.grad_input_w == QuantSpec.preset("nvfp4-2d")
    # Blackwell's stochastic rounding: 8 random bits a value
    assert (
        nv.grad_input_dy == nv.grad_weight_dy == QuantSpec.preset("nvfp4", rounding="sr", sr_bits=8)
    )
    assert load_recipe("nvidia-nvfp4").linear.grad_weight_dy.sr_bits == 8
    four = load_recipe("nvfp4-4over6").linear  # Four Over Six's code: float32 uniforms
    assert four.grad_input_dy.sr_bits == four.grad_weight_dy.sr_bits == 24
    # Four Over Six's training config: the gradients' scale rule is the same MSE rule, SR with
    # the 16/17 pre-scale ("stochastic_unbiased"); everything else as nvfp4-4over6
    every = load_recipe("nvfp4-4over6-all").linear
    gradient = QuantSpec.preset("nvfp4-4over6", rounding="sr", sr_prescale=16 / 17)
    assert every.grad_input_dy == every.grad_weight_dy == gradient
    assert dataclasses.replace(every, grad_input_dy=four.grad_input_dy,
                               grad_weight_dy=four.grad_weight_dy) == four  # fmt: skip
    assert four.forward_w.four_over_six_metric == "mse"
    # Quartet II as its paper's runs: four-over-six off in the forward; on in the variant
    quartet = load_recipe("quartet2").linear
    assert quartet.forward_x == quartet.forward_w == QuantSpec.preset("nvfp4")
    variant = load_recipe("quartet2-4over6").linear
    assert variant.forward_x == variant.forward_w == QuantSpec.preset("nvfp4-4over6")
    assert dataclasses.replace(variant, forward_x=quartet.forward_x,
                               forward_w=quartet.forward_w) == quartet  # fmt: skip
    assert nv.forward_x == nv.grad_weight_x == QuantSpec.preset("nvfp4")
    te_rotation = HadamardConfig(16, random=False, signs=TE_SIGNS_16)  # TransformerEngine's
    assert nv.grad_weight_hadamard == te_rotation and nv.grad_input_hadamard is None

    # Wang et al. as its code runs: weight scale per input channel, one E5M2 tensor for dY,
    # nearest-rank clamping without compensation
    wang = load_recipe("wang-fp4").linear
    # ties toward +inf, as the code's E2M1 thresholds round
    assert wang.forward_x == QuantSpec.preset("fp4-row", rounding="ties_up")
    assert wang.forward_w == QuantSpec(block="column", scale_rule="ceil", rounding="ties_up")
    assert wang.grad_input_dy == wang.grad_weight_dy == QuantSpec.preset("fp8-e5m2-tensor")
    assert wang.grad_input_dy.block == "tensor" and wang.grad_input_dy.element == "e5m2"
    assert wang.grad_input_w == wang.grad_weight_x == QuantSpec.preset("fp8-e4m3-tensor")
    assert wang.dge == DGEConfig(k=5, cap=3) and wang.double_quant
    assert wang.outliers == OutlierConfig(0.99, compensate=False, method="nearest")
    direct = load_recipe("wang-direct").linear
    assert direct == dataclasses.replace(wang, dge=None, outliers=None)

    # the per-paper baselines
    tj_base = load_recipe("tetrajet-baseline").linear
    assert tj_base == dataclasses.replace(
        tj,
        **{
            op: tj.spec(op).replace(scale_rule="floor")
            for op in (*BACKWARD, "forward_x", "forward_w")
        },
    )
    tseng_base = load_recipe("tseng-baseline").linear
    assert tseng_base.forward_x is None and tseng_base.forward_w is None
    assert all(tseng_base.spec(op) == QuantSpec(rounding="away") for op in BACKWARD)
    assert all(tseng_base.hadamard(g) is None for g in ("forward", "grad_input", "grad_weight"))

    # the newer methods: a uniform grid (UFP4), a deterministic Hadamard (MXFP4 on MI355X)
    ufp4 = load_recipe("ufp4").linear
    assert all(ufp4.spec(op).element == "e1m2" for op in (*BACKWARD, "forward_x", "forward_w"))
    assert [op for op in BACKWARD if ufp4.spec(op).rounding == "sr"] == [
        "grad_input_dy",
        "grad_weight_dy",
    ]
    assert all(
        ufp4.hadamard(g) == HadamardConfig(16) for g in ("forward", "grad_input", "grad_weight")
    )
    dht = load_recipe("mxfp4-dht").linear
    assert dht.grad_weight_hadamard == HadamardConfig(32, random=False)
    assert dataclasses.replace(dht, grad_weight_hadamard=None) == mx

    # Hu et al.: SR operands with the UE5M3 scale rounded up (nothing clips), RNE forward
    hu = load_recipe("ue5m3-hadamard-sr").linear
    assert hu.forward_x == QuantSpec.preset("mxfp4-ue5m3")
    sr_up = QuantSpec.preset("mxfp4-ue5m3", rounding="sr", scale_rule="ceil")
    assert all(hu.spec(op) == sr_up for op in BACKWARD)
    assert all(
        hu.hadamard(g) == HadamardConfig(32) for g in ("forward", "grad_input", "grad_weight")
    )

    bf16 = load_recipe("bf16")
    assert bf16.linear.is_high_precision and bf16.skip == DEFAULT_SKIP


def test_inheritance_changes_only_the_child_keys() -> None:
    base, qema, qramp = (load_recipe(n) for n in ("tetrajet", "tetrajet-qema", "tetrajet-qramp"))
    assert qema.linear == dataclasses.replace(base.linear, qema=QEMAConfig(beta=0.998))
    assert qema.skip == base.skip and qema.qramp is None
    assert qramp.linear == base.linear
    assert qramp.qramp == QRampConfig(alpha=16, beta=5, calibration_steps=30, max_period=None)


def test_inheritance_merge_rules(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(
        tmp_path,
        "parent.yaml",
        "base: tetrajet\nskip: [head]\nlinear:\n  forward: {x: mxfp4, w: nvfp4-2d}\n",
    )
    child = write(
        tmp_path / "sub",
        "child.yaml",
        "base: ../parent.yaml\n"
        "linear:\n"
        "  forward: {x: {rounding: sr}, w: null}\n"  # a mapping refines, null replaces
        "  grad_input: {dy: mxfp4}\n"  # a name replaces the base's mapping
        "  grad_weight: {hadamard: 32}\n",
    )
    recipe = load_recipe(child)
    assert recipe.name == "child" and recipe.skip == ("head",)
    assert recipe.description == load_recipe("tetrajet").description
    assert recipe.linear.forward_x == QuantSpec(rounding="sr")
    assert recipe.linear.forward_w is None
    assert recipe.linear.grad_input_dy == QuantSpec()
    assert recipe.linear.grad_input_w == SR and recipe.linear.double_quant
    assert recipe.linear.grad_weight_hadamard == HadamardConfig(32)


@pytest.mark.parametrize(
    ("module", "skipped"),
    [
        ("head", True),
        ("lm_head", True),
        ("model.head", True),
        ("patch_embed.proj", True),
        ("time_embedding.linear_1", True),
        ("blocks.0.attn.qkv", False),
        ("down_blocks.0.resnets.0.time_emb_proj", False),
    ],
)
def test_default_skip_patterns(module: str, skipped: bool) -> None:
    assert load_recipe("tetrajet").skips(module) is skipped


# (recipe text, the dotted key the message names, a fragment of the message)
ERRORS = [
    ("linaer: {}\n", "linaer", "unknown key (did you mean 'linear'?)"),
    (
        "linear:\n  forward: {x: {preset: mxfp4, rouding: sr}}\n",
        "linear.forward.x.rouding",
        "did you mean 'rounding'",
    ),
    ("linear:\n  grad_input: {x: mxfp4}\n", "linear.grad_input.x", "allowed: dy, w, hadamard"),
    ("optimizer: {adam: {}}\n", "optimizer.adam", "unknown key"),
    (
        "linear:\n  forward: {x: {preset: mxfp4, rounding: rn}}\n",
        "linear.forward.x.rounding",
        "must be one of rne, sr, away, ties_up, eden (got 'rn')",
    ),
    ("linear:\n  forward: {x: {block: 33}}\n", "linear.forward.x.block", "even integer"),
    (
        "linear:\n  forward: {x: {preset: mxfp4, tensor_scale: 1}}\n",
        "linear.forward.x.tensor_scale",
        "must be true or false",
    ),
    (
        "linear:\n  forward: {x: 3}\n",
        "linear.forward.x",
        "must be null, a preset name or a mapping",
    ),
    (
        "linear:\n  forward: {x: mxfp5}\n",
        "linear.forward.x",
        "unknown preset 'mxfp5' (did you mean 'mxfp4'?)",
    ),
    (
        "linear:\n  forward: {x: {preset: nvfp}}\n",
        "linear.forward.x.preset",
        "unknown preset 'nvfp'",
    ),
    ("linear:\n  forward: {x: nvfp4-2d}\n", "linear.forward.x.tile2d", "weights only"),
    (
        "linear:\n  forward: {x: mxfp4, hadamard: 48}\n",
        "linear.forward.hadamard.size",
        "must be one of 16, 32",
    ),
    (
        "linear:\n  grad_input: {hadamard: true}\n",
        "linear.grad_input.hadamard",
        "must be null, a size or {size: N, random: true | false, signs: [1 or -1, ...]} (got True)",
    ),
    ("linear:\n  double_quant: 3\n", "linear.double_quant", "must be true or false"),
    (
        "linear:\n  gemm: quick\n",
        "linear.gemm",
        "must be one of dequantized, exact, fast (got 'quick')",
    ),
    (
        "linear:\n  forward: {w: mxfp4}\n  dge: {k: five}\n",
        "linear.dge.k",
        "must be a number (got 'five')",
    ),
    ("linear:\n  forward: {w: mxfp4}\n  dge: {k: 0.5}\n", "linear.dge.k", "must be a number > 1"),
    ("linear:\n  dge: {}\n", "linear.dge", "needs a quantized forward weight"),
    (
        "linear:\n  forward: {w: mxfp4}\n  qema: {warmup: 1.5}\n",
        "linear.qema.warmup",
        "must be an integer",
    ),
    ("optimizer: {qramp: {beta: 0}}\n", "optimizer.qramp.beta", "must be a positive integer"),
    ("optimizer: {qramp: {alpha: '16'}}\n", "optimizer.qramp.alpha", "must be a number"),
    ("skip: head\n", "skip", "must be a list of module-name patterns"),
    ("description: [a]\n", "description", "must be a string"),
    ("base: tetrajat\n", "base", "unknown recipe 'tetrajat' (did you mean 'tetrajet'?)"),
    ("base: missing.yaml\n", "base", "no such recipe file 'missing.yaml'"),
    ("base: 3\n", "base", "must be a recipe name or path"),
]


def test_gemm_mode_is_read_kept_and_left_out_by_default(tmp_path: Path) -> None:
    path = write(tmp_path, "fast.yaml", "base: tetrajet\nlinear:\n  gemm: fast\n")
    recipe = load_recipe(path)
    assert recipe.linear.gemm == "fast"
    assert recipe.linear == dataclasses.replace(load_recipe("tetrajet").linear, gemm="fast")
    assert recipe.to_dict()["linear"]["gemm"] == "fast"
    assert Recipe.from_dict(recipe.to_dict()).linear.gemm == "fast"
    assert "gemm=fast" in recipe.linear.summary()
    # resolved recipes stored before the field keep their form
    assert "gemm" not in load_recipe("tetrajet").to_dict()["linear"]
    assert LinearConfig(gemm="exact").is_high_precision  # a GEMM mode quantizes nothing


@pytest.mark.parametrize(("text", "key", "fragment"), ERRORS)
def test_error_names_file_and_key(tmp_path: Path, text: str, key: str, fragment: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(RecipeError) as caught:
        load_recipe(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path.resolve()}: {key}: "), message
    assert fragment in message
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("linear:\n  forward: {x: [mxfp4\n", "line 3: invalid YAML"),
        (
            "linear:\n  forward: {}\n  forward: {}\n",
            "line 3: invalid YAML: duplicate key 'forward'",
        ),
        ("", "empty recipe file"),
        ("# only a comment\n", "empty recipe file"),
        ("- a list\n", "must be a mapping of base, description"),
    ],
)
def test_file_level_errors(tmp_path: Path, text: str, fragment: str) -> None:
    path = write(tmp_path, "bad.yaml", text)
    with pytest.raises(RecipeError, match=f"^{path.resolve()}: .*") as caught:
        load_recipe(path)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_missing_file_and_unknown_name() -> None:
    with pytest.raises(RecipeError, match=r"^nope\.yaml: no such recipe file 'nope\.yaml'$"):
        load_recipe("nope.yaml")
    with pytest.raises(RecipeError, match=r"^tetrajt: unknown recipe 'tetrajt' \(did you mean"):
        load_recipe("tetrajt")


def test_base_cycles(tmp_path: Path) -> None:
    a = write(tmp_path, "a.yaml", "base: b.yaml\n")
    write(tmp_path, "b.yaml", "base: a.yaml\n")
    with pytest.raises(
        RecipeError, match=r"b\.yaml: base: inheritance cycle: .*a\.yaml -> .*b\.yaml -> .*a\.yaml$"
    ):
        load_recipe(a)
    me = write(tmp_path, "me.yaml", "base: ./me.yaml\n")
    with pytest.raises(RecipeError, match="me.yaml: base: inheritance cycle"):
        load_recipe(me)


def test_error_in_a_base_names_the_base_file(tmp_path: Path) -> None:
    write(tmp_path, "parent.yaml", "linear:\n  forward: {x: {rounding: up}}\n")
    child = write(tmp_path, "child.yaml", "base: parent.yaml\n")
    with pytest.raises(RecipeError, match=r"parent\.yaml: linear\.forward\.x\.rounding: "):
        load_recipe(child)


def test_error_made_by_the_child_names_the_child(tmp_path: Path) -> None:
    child = write(
        tmp_path, "child.yaml", "base: tetrajet\nlinear:\n  forward: {w: null}\n  dge: {}\n"
    )
    with pytest.raises(RecipeError, match=r"child\.yaml: linear\.dge: needs a quantized forward"):
        load_recipe(child)


def test_apply_overrides() -> None:
    base = load_recipe("tetrajet")
    recipe = apply_overrides(
        base,
        [
            "linear.forward.x.rounding=sr",
            "skip=[head]",
            "linear.grad_weight.hadamard=32",
            "linear.grad_input.dy=nvfp4",
            "linear.grad_input.w.preset=mxfp4",
            "linear.qema={beta: 0.99}",
            "optimizer.qramp={}",
        ],
    )
    assert recipe.linear.forward_x == QuantSpec.preset("mxfp4-ceil", rounding="sr")
    assert recipe.skip == ("head",)
    assert recipe.linear.grad_weight_hadamard == HadamardConfig(32)
    assert recipe.linear.grad_input_dy == QuantSpec.preset("nvfp4")
    assert recipe.linear.grad_input_w == QuantSpec()
    assert recipe.linear.qema == QEMAConfig(beta=0.99) and recipe.qramp == QRampConfig()
    assert (recipe.name, recipe.source) == (base.name, base.source)
    assert base == load_recipe("tetrajet")  # the input is untouched
    assert apply_overrides(base, []) is base


@pytest.mark.parametrize(
    ("override", "key", "fragment"),
    [
        ("linear.forwrd.x=mxfp4", "linear.forwrd", "unknown key (did you mean 'forward'?)"),
        (
            "linear.forward.x.rounding=rn",
            "linear.forward.x.rounding",
            "must be one of rne, sr, away",
        ),
        ("linear.grad_weight.hadamard=33", "linear.grad_weight.hadamard.size", "must be one of"),
        ("linear.dge.k=4", "linear.dge", "is null; set it whole"),
        ("linear.double_quant.x=1", "linear.double_quant", "not a mapping"),
        ("skip=head", "skip", "must be a list"),
        ("base=mxfp4", "base", "unknown key"),
        ("linear.forward.x", "linear.forward.x", "expected key=value"),
        ("skip=[head", "skip", "value is not valid YAML"),
    ],
)
def test_apply_overrides_rejects(override: str, key: str, fragment: str) -> None:
    with pytest.raises(RecipeError) as caught:
        apply_overrides(load_recipe("tetrajet"), [override])
    message = str(caught.value)
    assert message.startswith(f"recipes/tetrajet.yaml (--set): {key}: ") or (
        f"tetrajet.yaml (--set): {key}: " in message
    ), message
    assert fragment in message and "\n" not in message


def test_from_dict_errors_name_the_source() -> None:
    with pytest.raises(RecipeError, match=r"^run 7: linear: must be a mapping \(got 3\)$"):
        Recipe.from_dict({"linear": 3}, source="run 7")
    recipe = Recipe.from_dict({"description": "x"}, source="notebook")
    assert recipe.source == "notebook" and recipe.linear.is_high_precision
    assert recipe.skip == DEFAULT_SKIP
