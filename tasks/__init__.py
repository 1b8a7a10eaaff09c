"""Training tasks of fp4cli, installed as `fp4cli.tasks`: one module per task, by name."""
