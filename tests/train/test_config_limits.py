"""TrainConfig's integer fields: a float with no fraction is that integer, steps have a limit."""

from __future__ import annotations

import pytest

from fp4cli.train.config import STEPS_MAX, ConfigError, TrainConfig, resolve_config


def test_a_whole_float_is_taken_as_its_integer():
    config, _ = resolve_config({}, ["steps=1e3", "batch_size=64.0"])
    assert config.steps == 1000 and type(config.steps) is int
    assert config.batch_size == 64 and type(config.batch_size) is int


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"steps": 2.5}, "steps: must be a positive integer (got 2.5)"),
        ({"steps": float("inf")}, "steps: must be a positive integer (got inf)"),
        ({"steps": STEPS_MAX + 1}, "steps: must be at most 10^9 (got 1000000001)"),
        ({"steps": 1e12}, "steps: must be at most 10^9 (got 1000000000000)"),
    ],
)
def test_steps_that_are_not_a_count_of_steps_are_refused(values, message):
    with pytest.raises(ConfigError) as error:
        TrainConfig(**values)
    assert str(error.value) == message


def test_the_largest_step_count_is_accepted():
    assert TrainConfig(steps=STEPS_MAX).steps == STEPS_MAX
