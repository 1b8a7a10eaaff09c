"""Eager training steps with the layer programs' CUDA-graph modes side by side
(`fp4cli.replay.graphs`): each recipe's model is built once, its graphs captured, then loops of
steps alternate between the modes, so that the shared host's drift falls on every mode alike. A
diagnosis script: `fp4 bench step --modes eager` measures the default mode.

    python benchmarks/graph_modes_probe.py [--size gpt2-small] [--recipes bf16,mxfp4,...]
        [--modes off,always,auto] [--rounds 6] [--steps 5]
"""

from __future__ import annotations

import argparse
import time

import torch

from fp4cli.bench.step import StepCase, build_step
from fp4cli.linear.plans import PROGRAMS
from fp4cli.replay import graphs


def loop_ms(runner, batch, steps: int) -> float:
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(steps):
        runner(batch)
    torch.cuda.synchronize()
    return (time.perf_counter() - began) * 1e3 / steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="gpt2-small")
    parser.add_argument("--recipes", default="bf16,mxfp4,tetrajet,nvfp4,wang-fp4")
    parser.add_argument("--modes", default="off,always,auto")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    modes = args.modes.split(",")
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, gpt {args.size}, batch 8")
    rows = []
    for recipe in args.recipes.split(","):
        PROGRAMS.clear()
        torch.cuda.empty_cache()
        case = StepCase("gpt", args.size, 8, recipe, "triton", "eager")
        runner, batches, _ = build_step(case, torch.device("cuda"))
        with graphs("always"):  # every graph captured before the timed loops
            for index in range(6):
                runner(batches[index % 2])
        best = dict.fromkeys(modes, float("inf"))
        for _ in range(args.rounds):
            for mode in modes:
                with graphs(mode):
                    best[mode] = min(best[mode], loop_ms(runner, batches[0], args.steps))
        rows.append((recipe, best, len(PROGRAMS.graphs()), PROGRAMS.graph_refusals()))
        del runner, batches
    print(f"{'recipe':<14}" + "".join(f"{m:>10}" for m in modes) + "  graphs  refusals")
    for recipe, best, count, refusals in rows:
        times = "".join(f"{best[m]:10.1f}" for m in modes)
        print(f"{recipe:<14}{times}  {count:6d}  {sorted(set(refusals))}")


if __name__ == "__main__":
    main()
