"""The manual's examples run as shown: the mxfp4_matmul snippet (docs/api.md), the Slurm
command's batch (docs/cluster.md), and the quantize-inspect table as the command prints it
(docs/sweep-report.md)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from typer.testing import CliRunner

from fp4cli.cli.main import app

DOCS = Path(__file__).parents[2] / "docs"


def _block_after(page: str, heading: str) -> str:
    """The first fenced block after `heading` in docs/`page`, without its fences."""
    text = (DOCS / page).read_text()
    start = text.index("```", text.index(heading))
    body = text[text.index("\n", start) + 1 :]
    return body[: body.index("```")]


def _block_holding(page: str, shown: str) -> str:
    """The fenced block of docs/`page` that holds `shown`, without its fences."""
    text = (DOCS / page).read_text()
    at = text.index(shown)
    start = text.rindex("```\n", 0, at) + len("```\n")
    return text[start : text.index("```", at)]


def test_the_mxfp4_matmul_example_runs_as_written():
    snippet = _block_after("api.md", "## Multiply quantized tensors: `mxfp4_matmul`")
    names: dict[str, object] = {}
    exec(compile(snippet, "docs/api.md", "exec"), names)
    assert tuple(names["c"].shape) == (names["x"].shape[0], names["w"].shape[0])


def test_the_slurm_training_examples_split_their_batch_over_their_processes():
    from fp4cli.train.launch import check_launch

    page = (DOCS / "cluster.md").read_text().replace("\\\n", " ")  # continued lines joined
    lines = [x for x in page.splitlines() if re.match(r"\s*fp4 train .*--launcher slurm", x)]
    assert lines
    for line in lines:
        words = shlex.split(line)
        value = {flag: words[words.index(flag) + 1] for flag in words if flag.startswith("--")}
        flags = {"task": value["--task"], "size": value["--size"], "parallel": value["--parallel"],
                 "batch_size": int(value["--batch-size"])}  # fmt: skip
        check_launch(flags, [], int(value["--gpus-per-node"]), int(value["--nodes"]))


def test_the_quantize_inspect_table_is_what_the_command_prints():
    shown = _block_holding("sweep-report.md", "per spec, over tensors (weighted by elements)")
    result = CliRunner().invoke(app, ["quantize-inspect", "--task", "vit", "--size", "debug"])
    assert result.exit_code == 0, result.output
    printed = result.stdout[result.stdout.index("per spec") :]
    table = [line.rstrip() for line in printed.rstrip().splitlines()]
    assert [line.rstrip() for line in shown.strip().splitlines()] == table
