"""README examples run as shown: the mxfp4_matmul snippet, the Slurm command's batch, and the
quantize-inspect table as the command prints it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from fp4cli.cli.main import app

README = (Path(__file__).parents[2] / "README.md").read_text()


def _block_after(heading: str) -> str:
    """The first fenced block after `heading`, without its fences."""
    start = README.index("```", README.index(heading))
    body = README[README.index("\n", start) + 1 :]
    return body[: body.index("```")]


def _block_holding(text: str) -> str:
    """The fenced block that holds `text`, without its fences."""
    at = README.index(text)
    start = README.rindex("```\n", 0, at) + len("```\n")
    return README[start : README.index("```", at)]


def test_the_mxfp4_matmul_example_runs_as_written():
    snippet = _block_after("### Multiply quantized tensors: `mxfp4_matmul`")
    names: dict[str, object] = {}
    exec(compile(snippet, "README.md", "exec"), names)
    assert tuple(names["c"].shape) == (names["x"].shape[0], names["w"].shape[0])


def test_the_slurm_training_example_splits_its_batch_over_its_processes():
    from fp4cli.train.launch import check_launch

    (line,) = [x for x in README.splitlines() if re.match(r"fp4 train .*--launcher slurm", x)]
    words = shlex.split(line)
    value = {flag: words[words.index(flag) + 1] for flag in words if flag.startswith("--")}
    flags = {"task": value["--task"], "size": value["--size"], "parallel": value["--parallel"],
             "batch_size": int(value["--batch-size"])}  # fmt: skip
    check_launch(flags, [], int(value["--gpus-per-node"]), int(value["--nodes"]))


def test_the_quantize_inspect_table_is_what_the_command_prints():
    shown = _block_holding("per spec, over tensors (weighted by elements)")
    result = CliRunner().invoke(app, ["quantize-inspect", "--task", "vit", "--size", "debug"])
    assert result.exit_code == 0, result.output
    printed = result.stdout[result.stdout.index("per spec") :]
    table = [line.rstrip() for line in printed.rstrip().splitlines()]
    assert [line.rstrip() for line in shown.strip().splitlines()] == table
