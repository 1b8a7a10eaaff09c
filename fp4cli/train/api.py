"""run_training: resolve a config, build the task and the quantized model, train, store."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from fp4cli.train.config import ConfigError, TrainConfig, resolve_config
from fp4cli.train.loop import RunResult, Trainer, pick_device
from fp4cli.train.progress import Reporter


def run_training(
    flags: dict[str, Any] | None = None,
    overrides: Sequence[str] = (),
    store: Any = None,
    resume: str | None = None,
    reporter: Reporter | None = None,
    recipe: Any = None,
) -> tuple[RunResult, Trainer]:
    """Train a new run (flags > --set overrides > recipe > task defaults), or continue `resume`
    from its newest checkpoint with its stored config (flags may only extend `steps`). A
    `recipe` object given is trained as is (flags' "recipe" then only names it)."""
    from fp4cli.recipes import Recipe, apply_overrides, load_recipe
    from fp4cli.store import RunStore
    from fp4cli.tasks.base import create_task

    flags = flags or {}
    store = store if store is not None else RunStore()
    if resume is not None:
        run = store.get_run(resume)
        resolved = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"])
        config = TrainConfig.from_dict(resolved["train"])
        changeable = ("steps", "backend")  # the backend changes speed, not a single bit
        for key in changeable:
            if flags.get(key) is not None:
                config = dataclasses.replace(config, **{key: flags[key]})
        unexpected = sorted(k for k, v in flags.items() if v is not None and k not in changeable)
        if unexpected or overrides:
            raise ConfigError(
                f"--resume continues a run as it was; only --steps and --backend may change "
                f"(got {', '.join(unexpected + list(overrides))})"
            )
        recipe = Recipe.from_dict(resolved["recipe"], source=f"run {run['id']}")
    else:
        config, recipe_overrides = resolve_config(flags, overrides)
        base = recipe if recipe is not None else load_recipe(config.recipe)
        recipe = apply_overrides(base, recipe_overrides)
    device = pick_device(config.device)
    task = create_task(config.task, config.size, config.data, device)
    config = config.with_task_defaults(task.defaults)
    trainer = Trainer(config, recipe, task, store)
    if resume is not None:
        trainer.resume(run["id"])
    else:
        trainer.start()
    return trainer.run(reporter), trainer
