"""The manual checked against the code: the README's recipe table is `fp4 recipes list
--markdown`, its CPU quick start runs and prints what it shows, every relative link in the
README and docs/ resolves, and no sentence of the manual runs over 60 words."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    following = text.find("\n## ", start + len(heading))
    return text[start : following if following >= 0 else len(text)]


def _blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.DOTALL)


def test_the_readme_recipe_table_is_the_commands_output():
    from fp4cli.cli.recipes_cmd import markdown_table
    from fp4cli.recipes import list_recipes

    text = README.read_text()
    start = text.index("<!-- recipes table: fp4 recipes list --markdown -->\n")
    end = text.index("<!-- end of recipes table -->")
    shown = text[start:end].split("\n", 1)[1]
    assert shown == markdown_table(list_recipes())
    from typer.testing import CliRunner

    from fp4cli.cli.main import app

    printed = CliRunner().invoke(app, ["recipes", "list", "--markdown"])
    assert printed.exit_code == 0 and printed.stdout == shown


def _markdown_files() -> list[Path]:
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def _anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, as GitHub makes them."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    """Each link to a file names one that exists, and each #anchor a heading of its page."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code is not links
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue
        name, _, anchor = target.partition("#")
        path = (page.parent / name).resolve() if name else page
        if not path.exists() or anchor and path.suffix == ".md" and anchor not in _anchors(path):
            missing.append(target)
    assert not missing, f"{page.name} links to missing {missing}"


def _run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """A README command line, `fp4` as this interpreter's module."""
    line = command.split("#")[0].strip()
    assert line.startswith("fp4 "), line
    argv = [sys.executable, "-m", "fp4cli.cli", *line.split()[1:]]
    env = os.environ | {"OMP_NUM_THREADS": "1", "COLUMNS": "100"}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _report_rows(text: str) -> dict[str, float]:
    """recipe -> val_loss of `fp4 report`'s rows."""
    rows = re.findall(r"r-\d{8}-\d{6}-\w{4}\s+(\S+)\s+([\d.]+)\s+[+-]", text)
    return {recipe: float(value) for recipe, value in rows}


def test_the_cpu_quick_start_runs_and_prints_what_the_readme_shows(tmp_path):
    section = _section(README.read_text(), "## Quick start on a CPU")
    commands, printed = _blocks(section, "bash")[0], section.split("```\n")[-2]
    output = ""
    for command in commands.strip().splitlines():
        done = _run(command, tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        output = done.stdout
    shown, measured = _report_rows(printed), _report_rows(output)
    assert set(shown) == set(measured) == {"bf16", "mxfp4", "tetrajet"}
    for recipe, value in shown.items():
        assert abs(measured[recipe] - value) < 2e-3, (recipe, measured[recipe], value)


@pytest.mark.gpu
def test_the_gpu_example_runs(tmp_path):
    """The README's GPU commands, shortened to a few steps."""
    commands = _blocks(_section(README.read_text(), "## On a GPU"), "bash")[0]
    for command in commands.strip().splitlines():
        short = " --steps 5" if " train " in f" {command} " else " --steps 1 --no-store"
        done = _run(command.split("#")[0].strip() + short, tmp_path)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        if " train " in f" {command} ":
            assert "steps: replayed from a CUDA graph" in done.stdout + done.stderr


FENCED_CODE = re.compile(r"^\s*```.*?^\s*```[^\n]*$", flags=re.DOTALL | re.MULTILINE)
HTML_COMMENT = re.compile(r"<!--.*?-->", flags=re.DOTALL)
TABLE_ROW_OR_HEADING = ("|", "#")
LIST_ITEM = re.compile(r"\s*(?:[-*+]|\d+\.)\s")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`(])")


def _prose(page: Path) -> list[str]:
    """A page's paragraphs and list items, each joined into one line: no code blocks, table
    rows, headings or HTML comments."""
    text = HTML_COMMENT.sub("", FENCED_CODE.sub("", page.read_text()))
    pieces: list[str] = []
    lines: list[str] = []  # of the paragraph or list item being read
    for line in [*text.splitlines(), ""]:
        kept = line.strip() and not line.strip().startswith(TABLE_ROW_OR_HEADING)
        if lines and (not kept or LIST_ITEM.match(line)):
            pieces.append(" ".join(lines))
            lines = []
        if kept:
            lines.append(line.strip())
    return pieces


def _sentences(page: Path) -> list[str]:
    """A sentence ends at `.`, `!` or `?` before a capital, a backtick or a parenthesis, so
    "e.g." and "i.e." (a lower-case word follows them) do not end one."""
    return [sentence for piece in _prose(page) for sentence in SENTENCE_END.split(piece)]


def _manual_pages() -> list[Path]:
    """README.md and docs/*.md: the dated notes under docs/notes/ are records, not the manual."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_manual_has_no_sentence_over_60_words():
    """Each offending sentence is named by its page and its first words."""
    long = [
        f"{page.relative_to(ROOT)}: {' '.join(sentence.split()[:8])} ..."
        for page in _manual_pages()
        for sentence in _sentences(page)
        if len(sentence.split()) > 60
    ]
    assert not long, "sentences over 60 words:\n" + "\n".join(long)
