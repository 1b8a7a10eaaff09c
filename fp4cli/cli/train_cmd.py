"""`fp4 train`: train a task with a recipe and keep every number in the run store."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Annotated, Any

import typer

Opt = typer.Option
INTERRUPTED_EXIT = 130  # SIGINT or SIGTERM, as the shell reports a Ctrl-C


def train(
    task: Annotated[str | None, Opt(help="regression, vit, diffusion, gpt or llama.")] = None,
    recipe: Annotated[str | None, Opt(help="A shipped recipe name or a YAML path.")] = None,
    size: Annotated[
        str | None,
        Opt(
            help="Model size: debug, default, gpt2-small, gpt-345m, wide-2048 or wide-4096 "
            "(gpt), deit-tiny or deit-small (vit); --set model.FIELD=VALUE changes one "
            "architecture field."
        ),
    ] = None,
    steps: Annotated[int | None, Opt(help="Training steps (task default if unset).")] = None,
    batch_size: Annotated[int | None, Opt(help="Global batch size.")] = None,
    lr: Annotated[float | None, Opt(help="Peak learning rate.")] = None,
    seed: Annotated[int | None, Opt(help="Seed of data order, init and rounding.")] = None,
    data: Annotated[
        str | None,
        Opt(help="Data: an image folder / CIFAR; text, a token folder or python-sources."),
    ] = None,
    device: Annotated[str | None, Opt(help="auto, cpu, cuda or cuda:N.")] = None,
    backend: Annotated[
        str | None, Opt(help="Quantizer: auto (Triton kernels on CUDA), torch or triton.")
    ] = None,
    compile: Annotated[
        bool | None,
        Opt(
            "--compile/--no-compile",
            help="torch.compile the model, quantized layers included (fastest with --cuda-graph).",
        ),
    ] = None,
    cuda_graph: Annotated[
        bool | None,
        Opt(
            "--cuda-graph/--no-cuda-graph",
            help="Replay each step from a CUDA graph (the same numbers, faster) (default: on "
            "one CUDA GPU wherever the run allows it; the run says which).",
        ),
    ] = None,
    recompute: Annotated[
        bool | None,
        Opt(
            "--recompute/--no-recompute",
            help="Keep the quantized layers' 4-bit operands instead of the outputs that GELU "
            "and attention save, and recompute those in the backward pass (less memory).",
        ),
    ] = None,
    eval_every: Annotated[int | None, Opt(help="Evaluate every N steps (0: at the end).")] = None,
    stats_every: Annotated[int | None, Opt(help="Quantization statistics every N steps.")] = None,
    checkpoint_every: Annotated[int | None, Opt(help="Checkpoint every N steps.")] = None,
    resume: Annotated[str | None, Opt(help="Continue this run from its last checkpoint.")] = None,
    set_: Annotated[
        list[str] | None,
        Opt("--set", help="key=value for any training or recipe field, or model.FIELD=VALUE."),
    ] = None,
    tag: Annotated[list[str] | None, Opt(help="Tag the run (repeatable).")] = None,
    store: Annotated[str | None, Opt(help="Run store (default $FP4_STORE or runs/fp4.db).")] = None,
    quiet: Annotated[bool, Opt(help="No progress bar.")] = False,
    nproc_per_node: Annotated[
        int | None, Opt(help="Train on N processes (GPUs) of this node, under torchrun.")
    ] = None,
    parallel: Annotated[
        str | None,
        Opt(
            help="With several processes: ddp (default) or fsdp (FSDP2; quantized weights "
            "all-gathered in FP4 where the recipe allows, --set parallel.fp4_gather=false: BF16)."
        ),
    ] = None,
    nnodes: Annotated[int, Opt(help="Nodes (with --nproc-per-node; torchrun's).")] = 1,
    node_rank: Annotated[int, Opt(help="This node's rank (torchrun's).")] = 0,
    rdzv_endpoint: Annotated[
        str | None, Opt(help="HOST:PORT of the rendezvous, for several nodes (torchrun's).")
    ] = None,
    log_to: Annotated[
        str | None,
        Opt(help="Stream metrics and statistics to trackers too: tensorboard, wandb or both."),
    ] = None,
    launcher: Annotated[
        str,
        Opt(
            help="local (here), slurm (one submitit job over --nodes) or submitit-local (the "
            "same job as processes of this machine)."
        ),
    ] = "local",
    nodes: Annotated[int | None, Opt(help="Nodes of the Slurm job (with --launcher).")] = None,
    gpus_per_node: Annotated[
        int | None, Opt(help="Processes (GPUs) per node of the Slurm job (default 1).")
    ] = None,
    partition: Annotated[str | None, Opt(help="Slurm partition.")] = None,
    account: Annotated[str | None, Opt(help="Slurm account to charge.")] = None,
    time_min: Annotated[int | None, Opt(help="Time limit of the job in minutes (default 60).")] = (
        None
    ),
    sbatch: Annotated[
        list[str] | None, Opt(help="Any other sbatch option as KEY=VALUE (repeatable).")
    ] = None,
    wait: Annotated[
        bool, Opt("--wait", help="With --launcher: wait for the job and merge its run.")
    ] = False,
) -> None:
    """Train a model with an FP4 recipe; log metrics, statistics and checkpoints to the store.
    With --nproc-per-node N the run trains on N processes under torchrun (DDP, or FSDP2 with
    --parallel fsdp); started by an outside torchrun it joins it. The batch size and learning
    rate are the global ones: each process trains on its share of every batch. With --launcher
    slurm the same runs as one job on --nodes nodes of --gpus-per-node processes; its run goes
    to a store file in the job's folder (fp4 runs merge FOLDER, or --wait)."""
    from rich.console import Console

    from fp4cli.store import RunStore, store_path
    from fp4cli.train import run_training
    from fp4cli.train.api import RunFinished
    from fp4cli.train.config import ConfigError
    from fp4cli.train.distributed import RankStore, under_torchrun
    from fp4cli.train.progress import RichReporter, SilentReporter
    from fp4cli.train.signals import stop_signals

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
        "compile": compile,
        "cuda_graph": cuda_graph,
        "recompute": recompute,
        "eval_every": eval_every,
        "stats_every": stats_every,
        "checkpoint_every": checkpoint_every,
        "tags": tuple(tag) if tag else None,
        "parallel": parallel,
        "log_to": log_to,
    }
    if launcher != "local":
        cluster = {"partition": partition, "account": account, "time_min": time_min}
        _submit(flags, set_, resume, store, launcher, nodes, gpus_per_node, cluster, sbatch, wait)
    elif nodes is not None or gpus_per_node is not None:
        raise ConfigError(
            "--nodes and --gpus-per-node: only with --launcher slurm (torchrun's own nodes: "
            "--nproc-per-node, --nnodes)"
        )
    if resume is not None and not under_torchrun():  # before any process starts
        _stop_if_finished(store, resume, steps)
    if nproc_per_node is not None:
        _launch(flags, set_, resume, store, quiet, nproc_per_node, nnodes, node_rank, rdzv_endpoint)
    main_rank = not under_torchrun() or os.environ.get("RANK") == "0"

    # only rank 0 writes the store: the others open it only to read the run they resume (on
    # several nodes the file may be on a filesystem that SQLite's locks do not cover)
    def open_store() -> Any:
        if main_rank or resume:
            return RunStore(store, create=resume is None)
        return RankStore(str(store_path(store)))

    reporter = RichReporter() if main_rank and not quiet else SilentReporter()
    with stop_signals():  # a second signal while the first is handled is ignored
        try:
            result, trainer = run_training(flags, set_ or [], open_store, resume, reporter)
        except RunFinished as finished:
            if main_rank:
                typer.echo(str(finished))
            raise typer.Exit(0) from None
        except KeyboardInterrupt:  # before the first step (the trainer takes it after)
            if main_rank:
                typer.echo("stopped before training began", err=True)
            raise typer.Exit(INTERRUPTED_EXIT) from None
        if not main_rank:
            return
        Console().print(_summary(result, trainer, store_path(store)), highlight=False)
    if result.status == "interrupted":
        raise typer.Exit(INTERRUPTED_EXIT)
    if result.status != "finished":
        raise typer.Exit(1)


def _stop_if_finished(store: str | None, resume: str, steps: int | None) -> None:
    """Exit 0 with one line when the run to resume has finished and --steps asks for no more:
    nothing is trained and nothing written."""
    from fp4cli.store import RunStore
    from fp4cli.train.api import RunFinished, check_resume_steps

    with RunStore(store, read_only=True) as run_store:
        run = run_store.get_run(resume)
    try:
        check_resume_steps(run, steps)
    except RunFinished as finished:
        typer.echo(str(finished))
        raise typer.Exit(0) from None


def _launch(
    flags: dict[str, Any],
    overrides: list[str] | None,
    resume: str | None,
    store: str | None,
    quiet: bool,
    nproc_per_node: int,
    nnodes: int,
    node_rank: int,
    rdzv_endpoint: str | None,
) -> None:
    """Run this training under torchrun and exit with its code."""
    from fp4cli.train.launch import check_launch, run_torchrun, torchrun_command

    check_launch({**flags, "resume": resume}, overrides or [], nproc_per_node, nnodes)
    args = _train_args(flags, overrides, resume, store, quiet)
    command = torchrun_command(args, nproc_per_node, nnodes, node_rank, rdzv_endpoint)
    with _cpu_share(flags.get("device"), nproc_per_node):
        code = run_torchrun(command)
    raise typer.Exit(code)


@contextlib.contextmanager
def _cpu_share(device: str | None, nproc: int) -> Iterator[None]:
    """While torchrun runs: processes that train on the CPU get their share of its cores
    (OMP_NUM_THREADS, unless it is set), and a warning says so once."""
    import torch

    from fp4cli.train.distributed import cpu_cores

    on_cpu = (device or "").startswith("cpu") or not torch.cuda.is_available()
    given = os.environ.get("OMP_NUM_THREADS")
    if not on_cpu:
        yield
        return
    cores = cpu_cores()
    threads = given or str(max(1, cores // nproc))
    typer.echo(
        f"warning: no GPU for these processes: {nproc} of them share {cores} CPU core(s), "
        f"{threads} thread(s) each (OMP_NUM_THREADS). Expect slow steps.",
        err=True,
    )
    os.environ["OMP_NUM_THREADS"] = threads
    try:
        yield
    finally:
        if given is None:
            del os.environ["OMP_NUM_THREADS"]


def _train_args(
    flags: dict[str, Any],
    overrides: list[str] | None,
    resume: str | None,
    store: str | None,
    quiet: bool,
) -> list[str]:
    """fp4 train's options that make the same run in another process."""
    args: list[str] = []
    for name, value in flags.items():
        option = name.replace("_", "-")
        if name == "tags":
            args += [f"--tag={item}" for item in value or ()]
        elif isinstance(value, bool):  # a flag takes no value: --compile / --no-compile
            args.append(f"--{option}" if value else f"--no-{option}")
        elif value is not None:
            args.append(f"--{option}={value}")
    args += [f"--set={item}" for item in overrides or ()]
    args += [f"--{name}={value}" for name, value in (("resume", resume), ("store", store)) if value]
    return args + (["--quiet"] if quiet else [])


def _submit(
    flags: dict[str, Any],
    overrides: list[str] | None,
    resume: str | None,
    store: str | None,
    launcher: str,
    nodes: int | None,
    gpus_per_node: int | None,
    cluster: dict[str, Any],
    sbatch: list[str] | None,
    wait: bool,
) -> None:
    """Submit this training as one job over the nodes; with `wait`, follow it and merge."""
    from fp4cli.store import RunStore, store_path
    from fp4cli.sweep.errors import SweepError
    from fp4cli.sweep.launchers import SUBMITIT_LAUNCHERS, ClusterOptions, parse_sbatch_flags
    from fp4cli.train.config import ConfigError
    from fp4cli.train.launch import check_launch
    from fp4cli.train.slurm import submit_training, wait_and_merge

    if launcher not in SUBMITIT_LAUNCHERS:
        raise typer.BadParameter("must be local, slurm or submitit-local", param_hint="--launcher")
    if resume is not None:
        raise ConfigError(
            "--resume: not with --launcher (the job writes a store file of its own); resume "
            "under torchrun on the nodes instead"
        )
    nodes, procs = nodes or 1, gpus_per_node or 1
    check_launch(flags, overrides or [], procs, nodes)
    try:
        options = ClusterOptions(**cluster, sbatch=parse_sbatch_flags(sbatch or ()))
    except SweepError as error:
        raise ConfigError(str(error)) from None
    args = _train_args(flags, overrides, None, None, quiet=True)
    job, folder = submit_training(launcher, args, store_path(store), options, nodes, procs)
    typer.echo(
        f"submitted job {job.job_id} ({nodes} node(s) x {procs} process(es)); its run and logs "
        f"go to {folder}. Fold the run into the store with: fp4 runs merge {folder}"
    )
    if not wait:
        raise typer.Exit(0)
    with RunStore(store) as run_store:
        merged = wait_and_merge(job, folder, run_store)
        if not merged:
            typer.echo(f"job {job.job_id} ended without a run; its logs: {folder / 'logs'}")
            raise typer.Exit(1)
        run = run_store.get_run(merged[0])
        finals = run_store.final_metrics(run["id"])
    shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(finals.items()) if k.endswith("loss"))
    typer.echo(f"Run {run['id']} {run['status']} at step {run['step']}: {shown}. "
               f"Merged into {run_store.path}.")  # fmt: skip
    raise typer.Exit(0 if run["status"] == "finished" else 1)


def _summary(result: Any, trainer: Any, store_path: Any) -> str:
    config = trainer.config
    params = sum(p.numel() for p in trainer.model.parameters())
    metrics = ", ".join(
        f"{k} {v:.2f}%" if k == "top1" else f"{k} {v:.4f}"
        for k, v in sorted(result.metrics.items())
        if k in ("train_loss", "val_loss", "eval_loss", "top1")
    )
    if result.status == "interrupted":
        again = (
            f" Resume it with: fp4 train --resume {result.run_id}"
            if _has_checkpoint(trainer, result.run_id)
            else " It kept no checkpoint to resume from (--checkpoint-every N keeps one)."
        )
    else:
        again = ""
    return (
        f"Run {result.run_id} {result.status} at step {result.step}/{config.steps}: "
        f"{config.task} ({config.size}, {params / 1e6:.2f}M parameters) with recipe "
        f"{trainer.recipe.name} on {trainer.device}, seed {config.seed}, "
        f"in {result.seconds:.1f} s. Final {metrics or 'metrics: none'}. "
        f"Stored in {store_path}"
        + (f"; checkpoint {result.checkpoint}" if result.checkpoint else "")
        + f". Details: fp4 runs show {result.run_id}."
        + again
    )


def _has_checkpoint(trainer: Any, run_id: str) -> bool:
    return trainer.store.latest_checkpoint(run_id) is not None
