"""What a researcher reads after a command: an interrupted run says how to resume it."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import fp4cli.train.progress as progress
from fp4cli.cli.main import app

TRAIN = ["train", "--task", "regression", "--size", "debug", "--device", "cpu", "--steps", "8",
         "--set", "log_every=1"]  # fmt: skip


class _CtrlCAt(progress.SilentReporter):
    def update(self, step, loss, samples_per_s):
        if step == 4:
            raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("checkpoint_every", "says"),
    [("2", "Resume it with: fp4 train --resume r-"), ("0", "kept no checkpoint to resume from")],
)
def test_an_interrupted_run_says_how_to_resume(tmp_path, monkeypatch, checkpoint_every, says):
    monkeypatch.setattr(progress, "RichReporter", _CtrlCAt)
    args = [*TRAIN, "--set", f"checkpoint_every={checkpoint_every}"]
    result = CliRunner().invoke(app, args, env={"FP4_STORE": str(tmp_path / "s.db")})
    assert result.exit_code == 130  # an interrupt's code, as every command exits on one
    assert "interrupted at step" in result.output and says in " ".join(result.output.split())


def test_recipe_commands_start_without_torch():
    """`fp4 recipes list` and `show` read recipe files only: they import no torch."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from fp4cli.cli.main import app\n"
        "for args in (['recipes', 'list'], ['recipes', 'show', 'tetrajet']):\n"
        "    try:\n"
        "        app(args)\n"
        "    except SystemExit as done:\n"
        "        assert done.code in (0, None), done.code\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "False"


COMMANDS = [["train"], ["sweep"], ["report"], ["runs", "list"], ["runs", "show"],
            ["bench", "quantize"], ["bench", "gemm"], ["bench", "step"], ["quantize-inspect"],
            ["oscillation-report"], ["cost"], ["recipes", "show"]]  # fmt: skip


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_text_reads_as_written(command):
    """No help sentence lost its words to markup: '[default: ...]' in a help string would
    vanish and leave 'Worker processes .'."""
    import re

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert not re.search(r"\w \.(\s|$)", result.output), result.output
    assert "<bool>" not in result.output  # a flag takes no value: no type shown


def test_report_starts_without_torch(tmp_path):
    """`fp4 report` without figures reads the store and runs the cost model: no torch."""
    import subprocess
    import sys

    from fp4cli.recipes import load_recipe
    from fp4cli.store import RunStore

    store = RunStore(tmp_path / "s.db")
    for recipe in ("bf16", "mxfp4"):
        config = {"train": {"size": "debug"}, "recipe": load_recipe(recipe).to_dict()}
        run_id = store.create_run("regression", recipe, 0, config, "cpu", {})
        store.log_metrics(run_id, 10, {"val_loss": 1.0 if recipe == "bf16" else 1.2})
        store.log_layers(run_id, [("fc", 64, 32, 32, recipe != "bf16")])
        store.finish_run(run_id, "finished", step=10)
    store.close()
    code = (
        "import sys\n"
        "from fp4cli.cli.main import app\n"
        f"try:\n    app(['report', '--store', {str(tmp_path / 's.db')!r}])\n"
        "except SystemExit as done:\n    assert done.code in (0, None), done.code\n"
        "print('torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "2 runs" in done.stdout and done.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.parametrize(
    "args",
    [
        ["bench", "gemm", "--shapes", "64x64x64", "--impls", "cublas-bf16"],
        ["bench", "quantize", "--shapes", "64x64", "--configs", "mxfp4", "--backends", "torch"],
    ],
    ids=["gemm", "quantize"],
)
def test_bench_tables_are_never_cut_at_80_columns(args):
    import re

    env = {"COLUMNS": "80", "FORCE_COLOR": "1"}
    result = CliRunner().invoke(app, [*args, "--device", "cpu", "--no-store"], env=env)
    assert result.exit_code == 0, result.output
    plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", result.output)
    assert "…" not in plain and max(map(len, plain.splitlines())) <= 80
