"""The `fp4` CLI: in-process with CliRunner, plus a few real subprocess calls of the script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from subprocess import PIPE

import pytest
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from fp4cli.cli.main import app
from fp4cli.recipe_loader import list_recipes, load_recipe
from fp4cli.recipe_schema import Recipe

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def command_paths(command: object, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every command and group of the click tree, as argument paths."""
    yield prefix
    for name, sub in getattr(command, "commands", {}).items():
        yield from command_paths(sub, (*prefix, name))


def test_every_command_has_help() -> None:
    paths = list(command_paths(get_command(app)))
    assert ("recipes", "list") in paths and ("recipes", "show") in paths
    assert ("train",) in paths and ("runs", "list") in paths and ("runs", "show") in paths
    for path in paths:
        result = runner.invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        assert "Usage" in result.output


def test_version_and_bare_groups_show_help() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("fp4cli ")
    for args in ([], ["recipes"]):
        assert "Usage" in runner.invoke(app, args).output


def test_recipes_list() -> None:
    result = runner.invoke(app, ["recipes", "list"], env=WIDE)
    assert result.exit_code == 0, result.output
    for name in list_recipes():
        assert name in result.stdout
    assert "mxfp4-ceil+sr" in result.stdout and "rht64" in result.stdout
    assert "fht16" in result.stdout and "dht32" in result.stdout  # fixed signs; none
    assert "gemm exact" in result.stdout  # nvidia-nvfp4 multiplies as Blackwell does


def test_recipes_show_yaml_is_a_loadable_recipe(tmp_path: Path) -> None:
    result = runner.invoke(app, ["recipes", "show", "tetrajet-qema"])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["linear"]["qema"] == {"beta": 0.998, "warmup": 10}
    path = tmp_path / "copy.yaml"
    path.write_text(result.stdout)
    assert load_recipe(path).linear == load_recipe("tetrajet-qema").linear


def test_recipes_show_json_with_overrides() -> None:
    args = ["recipes", "show", "tetrajet", "--json", "--set", "linear.forward.x.rounding=sr"]
    result = runner.invoke(app, [*args, "-s", "skip=[head]"])
    assert result.exit_code == 0, result.output
    recipe = Recipe.from_dict(json.loads(result.stdout))
    assert recipe.linear.forward_x is not None and recipe.linear.forward_x.rounding == "sr"
    assert recipe.skip == ("head",)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["recipes", "show", "missing.yaml"], "error: missing.yaml: no such recipe file"),
        (["recipes", "show", "tetrajt"], "did you mean 'tetrajet'?"),
        (["recipes", "show", "tetrajet", "--set", "linear.forward.x.rounding=rn"], "(--set): "),
    ],
)
def test_domain_errors_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["bench", "step", "--steps", "0"], "fp4 bench step: Invalid value for '--steps'"),
        (["bench", "layer", "--iters", "x"], "fp4 bench layer: Invalid value for '--iters'"),
        (["train", "--bogus"], "fp4 train: No such option: --bogus"),
        (["--bogus"], "fp4: No such option: --bogus (see fp4 --help)"),
        (["nosuch"], "fp4: No such command 'nosuch'"),
        (["runs", "show"], "fp4 runs show: Missing argument"),
    ],
)
def test_usage_errors_are_one_line_exit_2(args: list[str], fragment: str) -> None:
    """Typer's own checks (option types and bounds, unknown options and commands, missing
    arguments) print one line like the domain errors, not a usage box."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1
    assert fragment in result.stderr


def test_cli_import_does_not_import_torch() -> None:
    code = "import sys, fp4cli.cli.main; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_package_exports_the_gemms_lazily() -> None:
    """`import fp4cli` lists the GEMMs without importing torch; the names are fp4cli.gemm's."""
    code = (
        "import sys, fp4cli; assert {'mxfp4_matmul', 'nvfp4_matmul'} <= set(dir(fp4cli)); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    import fp4cli
    import fp4cli.gemm

    assert fp4cli.nvfp4_matmul is fp4cli.gemm.nvfp4_matmul
    assert fp4cli.mxfp4_matmul is fp4cli.gemm.mxfp4_matmul


def fp4_script() -> str:
    script = Path(sys.executable).with_name("fp4")
    found = str(script) if script.exists() else shutil.which("fp4")
    if found is None:
        pytest.skip("the fp4 console script is not installed (pip install -e .)")
    return found


def test_script_end_to_end(tmp_path: Path) -> None:
    """The installed `fp4` script, four calls run concurrently (each pays for importing torch)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("linear:\n  forward: {x: {rounding: rn}}\n")
    calls = {
        "help": ["--help"],
        "list": ["recipes", "list"],
        "show": ["recipes", "show", "tetrajet"],
        "bad": ["recipes", "show", str(bad)],
    }
    script = fp4_script()
    procs = {
        name: subprocess.Popen([script, *args], stdout=PIPE, stderr=PIPE, text=True)
        for name, args in calls.items()
    }
    out = {name: (*proc.communicate(timeout=120), proc.returncode) for name, proc in procs.items()}

    assert out["help"][2] == 0 and "recipes" in out["help"][0]
    assert out["list"][2] == 0 and "tetrajet-qema" in out["list"][0], out["list"][1]
    assert out["show"][2] == 0, out["show"][1]
    assert yaml.safe_load(out["show"][0])["linear"]["double_quant"] is True
    stdout, stderr, code = out["bad"]
    assert code == 2 and stdout == ""
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert stderr.startswith("error: ") and "linear.forward.x.rounding" in stderr
