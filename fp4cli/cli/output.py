"""Output shared by the commands: strict JSON (NaN and inf become null)."""

from __future__ import annotations

import json
import math
from typing import Any

import typer


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float (at any depth of dicts and lists) replaced by None:
    strict JSON has no NaN or inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def echo_json(data: Any) -> None:
    typer.echo(json.dumps(strict_json(data), indent=2, allow_nan=False))
