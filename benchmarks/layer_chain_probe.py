"""A quantized layer's host time inside a step, with its programs launched step by step and
replayed from CUDA graphs: a chain of 12 layers against one, forward and backward under bf16
autocast, the difference over 11. Each recipe's chains are built once and the modes' loops
interleaved, so the shared host's drift falls on every mode alike; each figure is the least of
the rounds. A diagnosis script: `fp4 bench layer --layer-graphs` times one layer alone.

    python benchmarks/layer_chain_probe.py [--recipes bf16,mxfp4,...] [--tokens 256,8192]
        [--width 768] [--modes off,always] [--rounds 8]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

from fp4cli import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipes import load_recipe
from fp4cli.replay import graphs


def chain(recipe: str, layers: int, width: int) -> nn.Sequential:
    torch.manual_seed(0)
    built: list[nn.Module] = []
    for _ in range(layers):
        linear = nn.Linear(width, width, device="cuda")
        if recipe != "bf16":
            linear = QuantLinear.from_linear(linear, load_recipe(recipe).linear, seed=0)
        built.append(linear)
    return nn.Sequential(*built)


def step(model: nn.Module, x: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    y.float().sum().backward()


def loop_us(model: nn.Module, x: torch.Tensor, iters: int = 10) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(iters):
        step(model, x)
    torch.cuda.synchronize()
    return (time.perf_counter() - began) / iters * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="bf16,mxfp4,tetrajet,nvfp4,wang-fp4")
    parser.add_argument("--tokens", default="256,8192")
    parser.add_argument("--width", type=int, default=768)
    parser.add_argument("--modes", default="off,always")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    modes = args.modes.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, width {args.width}")
    for tokens in (int(t) for t in args.tokens.split(",")):
        x = torch.randn(tokens, args.width, device="cuda").requires_grad_()
        chains = {}
        for recipe in args.recipes.split(","):
            chains[recipe] = (chain(recipe, 12, args.width), chain(recipe, 1, args.width))
            with graphs("always"):  # every graph captured before the timed loops
                for _ in range(6):
                    for model in chains[recipe]:
                        step(model, x)
        best: dict[tuple[str, str], float] = {}
        for _ in range(args.rounds):
            for recipe, (twelve, one) in chains.items():
                for mode in ["off"] if recipe == "bf16" else modes:
                    with graphs(mode):
                        us = (loop_us(twelve, x) - loop_us(one, x)) / 11
                    best[recipe, mode] = min(best.get((recipe, mode), float("inf")), us)
        cells = "  ".join(f"{recipe} {mode} {us:.0f}" for (recipe, mode), us in best.items())
        print(f"{tokens} tokens, host us a layer: {cells}")
    print(f"graphs {len(PROGRAMS.graphs())}, refusals {sorted(set(PROGRAMS.graph_refusals()))}")


if __name__ == "__main__":
    main()
