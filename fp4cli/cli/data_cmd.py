"""`fp4 data`: make token folders (prepare) and check them (info)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

Opt = typer.Option
Arg = typer.Argument

app = typer.Typer(help="Make and check token folders for the gpt and llama tasks.",
                  no_args_is_help=True)  # fmt: skip


@app.command("prepare")
def prepare(
    source: Annotated[
        str,
        Arg(
            help="A text file, a folder of text, a .jsonl (a text field a line), a .parquet "
            "(a text column), or python-sources."
        ),
    ],  # fmt: skip
    out: Annotated[Path, Arg(help="The token folder to write (train.bin, val.bin, meta.json).")],
    tokenizer: Annotated[
        str, Opt(help="bytes, bpe:VOCAB (trained on SOURCE) or PATH to a tokenizer.json.")
    ] = "bytes",
    val_fraction: Annotated[
        float, Opt(help="Share of the tokens, at the end, held out for validation.")
    ] = 0.05,
    force: Annotated[bool, Opt("--force", help="Replace a token folder already in OUT.")] = False,
    quiet: Annotated[bool, Opt("--quiet", help="No progress bar.")] = False,
) -> None:
    """Tokenize SOURCE into OUT, a token folder that --data takes.

    python-sources is the running Python's standard library and site-packages .py files, sorted,
    up to 200 MiB, recorded with the Python version, folders, file count, bytes and a hash of the
    file list. Token ids are uint16 (a vocabulary up to 65,536) or uint32. The last
    --val-fraction of the tokens is the validation split. Files are written under temporary
    names and meta.json last: an interrupted run leaves nothing that loads.
    """
    from fp4cli.tasks.prepare import prepare_tokens

    with _RichProgress(quiet) as progress:
        meta = prepare_tokens(source, out, tokenizer, val_fraction, force, progress)
    tokens = meta["train_tokens"] + meta["val_tokens"]
    typer.echo(
        f"wrote {out}: {tokens:,} tokens ({meta['train_tokens']:,} train, "
        f"{meta['val_tokens']:,} val), vocabulary {meta['vocab_size']:,}, {meta['dtype']}",
        err=True,
    )


@app.command("info")
def info(
    folder: Annotated[Path, Arg(help="A token folder (train.bin, val.bin, meta.json).")],
    quiet: Annotated[bool, Opt("--quiet", help="No progress bar.")] = False,
) -> None:
    """Check a token folder (metadata, file sizes, every token id) and print its metadata as
    JSON."""
    from fp4cli.cli.output import echo_json
    from fp4cli.tasks.tokens import SPLIT_FILES, check_ids, open_split, read_meta

    meta = read_meta(folder)
    splits = {split: open_split(folder, meta, split) for split in SPLIT_FILES}
    with _RichProgress(quiet) as progress:
        progress.phase("check ids", sum(tokens.nbytes for tokens in splits.values()))
        for split, tokens in splits.items():
            check_ids(tokens, meta.vocab_size, str(folder / SPLIT_FILES[split]))
            progress.advance(tokens.nbytes)
    counts = {f"{split}_tokens": len(tokens) for split, tokens in splits.items()}
    echo_json({**meta.fields, **counts})


class _RichProgress:
    """prepare_tokens' Progress on a rich bar of source bytes, one bar per phase."""

    def __init__(self, quiet: bool) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        self.bar = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True, disable=quiet,
        )  # fmt: skip
        self.task: Any = None

    def phase(self, description: str, total: int) -> None:
        if self.task is not None:
            self.bar.update(self.task, visible=False)
        self.task = self.bar.add_task(description, total=total)

    def advance(self, amount: int) -> None:
        self.bar.advance(self.task, amount)

    def __enter__(self) -> _RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()
