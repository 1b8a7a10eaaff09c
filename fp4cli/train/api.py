"""run_training: resolve a config, build the task and the quantized model, train, store."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

from fp4cli.train import distributed
from fp4cli.train.config import ConfigError, TrainConfig, for_recipe, resolve_config
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
    from its newest checkpoint with its stored config (flags may only extend `steps`; without
    them it trains to the steps it was last given; RunFinished when nothing is left). A
    `recipe` object given is trained as is (flags' "recipe" then only names it). `store`: a
    store, or a function opening one, called for a new run only once its config, recipe, task
    and step options are known to be good (a refused run then leaves no store file behind)."""
    from fp4cli.recipes import apply_overrides, load_recipe
    from fp4cli.tasks.base import create_task
    from fp4cli.track.store import tracked

    flags = flags or {}
    opener = _store_opener(store)
    run = opened = None
    if resume is not None:
        opened = opener()
        run = opened.get_run(resume)
        check_resume_steps(run, flags.get("steps"))
        config, recipe = _resumed(run, flags, overrides)
    else:
        config, recipe_overrides = resolve_config(flags, overrides)
        base = recipe if recipe is not None else load_recipe(config.recipe)
        recipe = apply_overrides(base, recipe_overrides)
        config = for_recipe(config, recipe)
    if run is not None and run["world_size"] != distributed.world_size():
        raise ConfigError(
            f"run {run['id']} trained on {run['world_size']} process(es); resume it on as many "
            f"(--nproc-per-node; this is {distributed.world_size()})"
        )
    dist = distributed.from_environment(config.parallel)
    config = dataclasses.replace(config, parallel=dist.parallel)
    device = pick_device(distributed.rank_device(dist, config.device))
    distributed.join(dist, device)
    try:
        task = create_task(config.task, config.size, config.data, device, dict(config.model))
        config = config.with_task_defaults(task.defaults)
        # The trainer refuses what this run cannot do (step options, a batch too large)
        # before a new run's store is opened: a refused run leaves no store file behind.
        trainer = Trainer(config, recipe, task, None, dist, device)
        store = opened if opened is not None else opener()
        if not dist.is_main:  # only rank 0 writes to the store
            store = distributed.RankStore(str(store.path))
        else:  # and streams to the trackers (a missing one is refused before training)
            store = tracked(store, config.log_to)
        trainer.store = store
        if run is not None:
            trainer.resume(run["id"], flags.get("steps"))
        else:
            trainer.start()
        return trainer.run(reporter), trainer
    finally:
        distributed.leave(dist)


class RunFinished(ConfigError):
    """A finished run resumed without more steps: nothing to train, nothing written."""


def check_resume_steps(run: dict[str, Any], steps: int | None) -> None:
    """RunFinished when `run` has finished and `steps` asks for no more; ConfigError when
    `steps` would move it back. Nothing is read but the run's row."""
    if run["status"] != "finished":
        return  # its checkpoint's step is checked when it is read
    done = int(run["step"] or 0)
    if steps is not None and steps < done:
        raise ConfigError(
            f"--steps {steps}: run {run['id']} finished at step {done}; a resume never moves a "
            f"run back (give --steps above {done} to train further)"
        )
    if steps is None or steps == done:
        raise RunFinished(
            f"run {run['id']} finished at step {done} of {done}; give --steps above {done} "
            "to train further"
        )


def _store_opener(store: Any) -> Callable[[], Any]:
    """A function giving `store`: the store itself, its opener, or the default store."""
    from fp4cli.store import RunStore

    if callable(store):
        return store
    return lambda: store if store is not None else RunStore()


def _resumed(
    run: dict[str, Any], flags: dict[str, Any], overrides: Sequence[str]
) -> tuple[TrainConfig, Any]:
    """The stored config and recipe of `run`; flags may change only steps and backend."""
    from fp4cli.recipes import Recipe

    resolved = run["config"] if isinstance(run["config"], dict) else json.loads(run["config"])
    config = TrainConfig.from_dict(resolved["train"])
    # the backend, compilation, CUDA graphs and recomputation change speed, not a single bit
    changeable = ("steps", "backend", "compile", "cuda_graph", "recompute", "log_to")
    for key in changeable:
        if flags.get(key) is not None:
            config = dataclasses.replace(config, **{key: flags[key]})
    same = {"parallel": config.parallel}  # may be repeated, not changed
    unexpected = sorted(
        k
        for k, v in flags.items()
        if v is not None and k not in changeable and (k not in same or v != same[k])
    )
    if unexpected or overrides:
        raise ConfigError(
            "--resume continues a run as it was; only --steps, --backend, --log-to, --compile, "
            f"--cuda-graph and --recompute may change "
            f"(got {', '.join(unexpected + list(overrides))})"
        )
    return config, Recipe.from_dict(resolved["recipe"], source=f"run {run['id']}")
