"""The pair kernel's launches of some recipes' layers, each timed from a CUDA graph of 20 calls at
several warp counts and tiles: the calls one eager forward and backward of a 768 -> 3072 layer
makes at 8,192 tokens under bf16 autocast, replayed with `pair_warps` and `pair_tile` replaced.
A diagnosis script for the launcher's choices; `fp4 bench quantize` is the benchmark.

    python benchmarks/pair_warps_probe.py [--recipes nvfp4,tetrajet] [--variants 32x64w2,...]
"""

from __future__ import annotations

import argparse
import functools
import inspect

import torch
import torch.nn as nn
from step_probe import graph_us

import fp4cli.kernels.quantization.launch_pair as launch_pair
from fp4cli import QuantLinear
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays


def recorded_calls(recipe: str) -> list[tuple[torch.Tensor, dict]]:
    """(x, the other arguments by name) of each `quantize_pair` call of one layer's forward and
    backward."""
    calls: list[tuple[torch.Tensor, dict]] = []
    original = launch_pair.quantize_pair
    signature = inspect.signature(original)

    def record(x, *args, **kwargs):
        named = signature.bind(x, *args, **kwargs).arguments
        calls.append((x.detach().clone(), {k: v for k, v in named.items() if k != "x"}))
        return original(x, *args, **kwargs)

    torch.manual_seed(0)
    layer = QuantLinear.from_linear(
        nn.Linear(768, 3072, device="cuda"), load_recipe(recipe).linear, seed=0
    )
    x = torch.randn(8192, 768, device="cuda", requires_grad=True)
    launch_pair.quantize_pair = record
    try:
        with replays(False), torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x)
        y.backward(torch.randn_like(y))
    finally:
        launch_pair.quantize_pair = original
    return calls


def timed(x: torch.Tensor, kwargs: dict, variant: str) -> float:
    """Microseconds a call with the variant's tile and warps ("default": the launcher's)."""
    warps_of = launch_pair.pair_warps
    if variant != "default":
        tile, warps = variant.split("w")
        kwargs = {**kwargs, "tile": tuple(int(side) for side in tile.split("x"))}
        launch_pair.pair_warps = lambda *_, warps=int(warps): warps
    try:
        return graph_us(functools.partial(launch_pair.quantize_pair, x, **kwargs))
    finally:
        launch_pair.pair_warps = warps_of


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="nvfp4,tetrajet,tseng-rht-sr,mxfp4")
    parser.add_argument("--variants", default="32x64w2,32x64w4,32x64w8,64x64w4")
    options = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: pair_warps_probe.py times CUDA kernels and needs a GPU")
    print(torch.cuda.get_device_name(), torch.__version__)
    variants = ["default", *options.variants.split(",")]
    print(f"{'recipe':<14}{'call':<28}" + "".join(f"{v:>10}" for v in variants))
    for recipe in options.recipes.split(","):
        for x, kwargs in recorded_calls(recipe):
            row, col = kwargs.get("row"), kwargs.get("col")
            chosen = kwargs.get("tile") or launch_pair.pair_tile(row, col)
            warps = launch_pair.pair_warps(*chosen, row, col) if chosen else 0
            name = f"{tuple(x.shape)} {chosen} w{warps}"
            cells = []
            for variant in variants:
                try:
                    cells.append(f"{timed(x, kwargs, variant):>10.1f}")
                except Exception as error:  # a tile the directions do not fit
                    cells.append(f"{type(error).__name__[:9]:>10}")
            print(f"{recipe:<14}{name:<28}" + "".join(cells), flush=True)


if __name__ == "__main__":
    main()
