"""The options every `fp4 bench` command takes: the device, the run store, and not storing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

DeviceOption = Annotated[str, typer.Option(help="auto, cuda, cuda:N or cpu.")]
StoreOption = Annotated[
    Path | None,
    typer.Option(help="Run store (default $FP4_STORE or runs/fp4.db).", show_default=False),
]
NoStoreOption = Annotated[bool, typer.Option("--no-store", help="Print only; store nothing.")]
RecipesOption = Annotated[
    str,
    typer.Option(help="Comma-separated recipes (names or YAML paths); bf16 is always measured."),
]
BackendsOption = Annotated[
    str, typer.Option(help="Comma-separated quantizer backends: triton, torch.")
]
LayerGraphsOption = Annotated[
    str,
    typer.Option(
        help="Comma-separated: off, auto, always, resident: each quantized layer's programs "
        "replay from CUDA graphs never, while the GPU waits on the host, or always; resident: "
        "its forward passes from graphs on their own tensors, no copies (fp4cli.replay.graphs)."
    ),
]
GemmsOption = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated GEMM modes to measure each quantized recipe in: dequantized, "
        "exact, fast (the recipe's linear.gemm; default: each recipe's own).",
        show_default=False,
    ),
]
