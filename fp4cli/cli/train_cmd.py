"""`fp4 train`: train a task with a recipe and keep every number in the run store."""

from __future__ import annotations

from typing import Annotated, Any

import typer

Opt = typer.Option


def train(
    task: Annotated[str | None, Opt(help="regression, vit, diffusion or gpt.")] = None,
    recipe: Annotated[str | None, Opt(help="A shipped recipe name or a YAML path.")] = None,
    size: Annotated[str | None, Opt(help="Model/data size: default or debug.")] = None,
    steps: Annotated[int | None, Opt(help="Training steps (task default if unset).")] = None,
    batch_size: Annotated[int | None, Opt(help="Global batch size.")] = None,
    lr: Annotated[float | None, Opt(help="Peak learning rate.")] = None,
    seed: Annotated[int | None, Opt(help="Seed of data order, init and rounding.")] = None,
    data: Annotated[str | None, Opt(help="Data path (image folder / CIFAR / text).")] = None,
    device: Annotated[str | None, Opt(help="auto, cpu, cuda or cuda:N.")] = None,
    backend: Annotated[
        str | None, Opt(help="Quantizer: auto (Triton kernels on CUDA), torch or triton.")
    ] = None,
    eval_every: Annotated[int | None, Opt(help="Evaluate every N steps (0: at the end).")] = None,
    stats_every: Annotated[int | None, Opt(help="Quantization statistics every N steps.")] = None,
    checkpoint_every: Annotated[int | None, Opt(help="Checkpoint every N steps.")] = None,
    resume: Annotated[str | None, Opt(help="Continue this run from its last checkpoint.")] = None,
    set_: Annotated[
        list[str] | None, Opt("--set", help="key=value for any training or recipe field.")
    ] = None,
    tag: Annotated[list[str] | None, Opt(help="Tag the run (repeatable).")] = None,
    store: Annotated[str | None, Opt(help="Run store (default $FP4_STORE or runs/fp4.db).")] = None,
    quiet: Annotated[bool, Opt(help="No progress bar.")] = False,
) -> None:
    """Train a model with an FP4 recipe; log metrics, statistics and checkpoints to the store."""
    from rich.console import Console

    from fp4cli.store import RunStore
    from fp4cli.train import run_training
    from fp4cli.train.progress import RichReporter, SilentReporter

    flags = {
        "task": task,
        "recipe": recipe,
        "size": size,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "data": data,
        "device": device,
        "backend": backend,
        "eval_every": eval_every,
        "stats_every": stats_every,
        "checkpoint_every": checkpoint_every,
        "tags": tuple(tag) if tag else None,
    }
    run_store = RunStore(store)
    reporter = SilentReporter() if quiet else RichReporter()
    result, trainer = run_training(flags, set_ or [], run_store, resume, reporter)
    Console().print(_summary(result, trainer, run_store.path), highlight=False)
    if result.status not in ("finished",):
        raise typer.Exit(1)


def _summary(result: Any, trainer: Any, store_path: Any) -> str:
    config = trainer.config
    params = sum(p.numel() for p in trainer.model.parameters())
    metrics = ", ".join(
        f"{k} {v:.4g}"
        for k, v in sorted(result.metrics.items())
        if k in ("train_loss", "val_loss", "eval_loss", "top1")
    )
    return (
        f"Run {result.run_id} {result.status} at step {result.step}/{config.steps}: "
        f"{config.task} ({config.size}, {params / 1e6:.2f}M parameters) with recipe "
        f"{trainer.recipe.name} on {trainer.device}, seed {config.seed}, "
        f"in {result.seconds:.1f} s. Final {metrics or 'metrics: none'}. "
        f"Stored in {store_path}"
        + (f"; checkpoint {result.checkpoint}" if result.checkpoint else "")
        + f". Details: fp4 runs show {result.run_id}"
    )
