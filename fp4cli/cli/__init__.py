"""The `fp4` command line (Typer): thin commands over the fp4cli Python API."""
