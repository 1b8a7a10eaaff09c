"""`last:N` skip patterns: the layers of a model's last N blocks stay in high precision."""

import dataclasses

import pytest
import torch.nn as nn

import fp4cli
from fp4cli.linear.skip import expand_skip, numbered_blocks
from fp4cli.recipes import load_recipe
from fp4cli.tasks.base import create_task


def test_the_blocks_are_the_largest_numbered_container():
    names = ["embed", "blocks.0.qkv", "blocks.0.fc1", "blocks.1.qkv", "blocks.10.fc2",
             "blocks.2.fc1", "head", "stem.0.proj", "stem.1.proj"]  # fmt: skip
    assert numbered_blocks(names) == ["blocks.0", "blocks.1", "blocks.2", "blocks.10"]
    assert expand_skip(["head", "last:2"], names) == ("head", "blocks.2.*", "blocks.10.*")
    assert expand_skip(["last:1"], ["a.b", "c"]) == ()  # no blocks: nothing skipped
    assert numbered_blocks(["0.weight_holder", "1.weight_holder"]) == ["0", "1"]


@pytest.mark.parametrize("task_name", ["gpt", "vit"])
def test_the_last_block_stays_in_high_precision(task_name):
    task = create_task(task_name, "debug")  # two blocks
    skip = ["head", "lm_head", "*embed*", "last:1"]
    model = fp4cli.quantize_model(task.build_model(), "nvidia-nvfp4", seed=0, skip=skip)
    blocks = numbered_blocks([n for n, m in model.named_modules() if isinstance(m, nn.Linear)])
    assert blocks == ["blocks.0", "blocks.1"]
    kept = {n for n, m in model.named_modules() if type(m) is nn.Linear}
    quantized = set(fp4cli.quantized_layers(model))
    assert any(n.startswith("blocks.1.") for n in kept)
    assert all(n.startswith("blocks.1.") or "head" in n or "embed" in n for n in kept)
    assert quantized and all(n.startswith("blocks.0.") for n in quantized)


def test_nvidia_nvfp4_is_nvfp4_with_its_last_blocks_in_bf16():
    """... and its GEMMs as Blackwell computes them (block-scaled products)."""
    recipe, nvfp4 = load_recipe("nvidia-nvfp4"), load_recipe("nvfp4")
    assert recipe.linear == dataclasses.replace(nvfp4.linear, gemm="exact")
    assert "last:2" in recipe.skip


def test_a_bad_block_count_is_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("base: nvfp4\nskip: [last:0]\n")
    with pytest.raises(Exception, match="last:N, N > 0"):
        load_recipe(str(path))
