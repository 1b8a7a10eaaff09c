"""`python -m fp4cli.cli` runs the `fp4` command."""

from fp4cli.cli.main import app

app(prog_name="fp4")
