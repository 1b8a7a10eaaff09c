"""Sweeps: many recipes x tasks x seeds from one YAML file, run by parallel workers, resumable.

from fp4cli.sweep import load_sweep, plan_sweep, run_sweep
"""

from fp4cli.sweep.errors import SweepError
from fp4cli.sweep.points import Point, expand_points
from fp4cli.sweep.runner import SweepPlan, plan_sweep, run_sweep
from fp4cli.sweep.spec import Axis, SweepSpec, load_sweep, parse_sweep

__all__ = [
    "Axis",
    "Point",
    "SweepError",
    "SweepPlan",
    "SweepSpec",
    "expand_points",
    "load_sweep",
    "parse_sweep",
    "plan_sweep",
    "run_sweep",
]
