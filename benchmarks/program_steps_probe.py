"""What each step of a replayed layer program costs the host: GPT-2 small's four layer shapes
at a few tokens (the device idle), forward and backward under bf16 autocast, each program's
generated function run with a clock read after every line; the median of each line over the
calls. Also one 768 x 768 layer's whole call (`y.backward()` included), for the program's
share. A diagnosis script: `benchmarks/layer_chain_probe.py` times layers inside a chain.

    python benchmarks/program_steps_probe.py [--recipes mxfp4,nvfp4] [--tokens 256]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
import torch.nn as nn

from fp4cli import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipes import load_recipe
from fp4cli.replay.program import HostProgram

SHAPES = [(768, 2304), (768, 768), (768, 3072), (3072, 768)]


def layer(recipe: str, n_in: int, n_out: int) -> nn.Module:
    torch.manual_seed(0)
    linear = nn.Linear(n_in, n_out, device="cuda")
    if recipe == "bf16":
        return linear
    return QuantLinear.from_linear(linear, load_recipe(recipe).linear, seed=0)


def call(model: nn.Module, x: torch.Tensor, grad_y: torch.Tensor) -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = model(x)
    y.backward(grad_y)


def clocked(program: HostProgram) -> tuple[object, list[float], list[str]]:
    """The program's generated function with a clock read after each line, its clock list and
    each line's label (the step's comment)."""
    lines = program.source.splitlines()
    body = [lines[0], "    _T = _TIMES; _T.append(_clock())"]
    labels = []
    for line in lines[1:]:
        body.append(line)
        text = line.strip()
        if text.startswith(("return", "raise")):
            continue
        body.append("    _T.append(_clock())")
        labels.append(text.split("#")[-1].strip() if "#" in text else text[:30])
    namespace = dict(program._replay.__globals__)
    namespace["_TIMES"] = times = []
    namespace["_clock"] = time.perf_counter
    exec(compile("\n".join(body), "<clocked program>", "exec"), namespace)
    return namespace["replay"], times, labels


def probe(recipe: str, tokens: int) -> None:
    PROGRAMS.clear()
    layers = [layer(recipe, n_in, n_out) for n_in, n_out in SHAPES]
    xs = [torch.randn(tokens, n_in, device="cuda").requires_grad_() for n_in, _ in SHAPES]
    grads = [torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) for _, n in SHAPES]
    for _ in range(4):  # recorded on the second call, replayed from the third
        for model, x, grad_y in zip(layers, xs, grads, strict=True):
            call(model, x, grad_y)
    torch.cuda.synchronize()

    def loop_us(calls: int = 100) -> float:
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(calls):
            call(layers[1], xs[1], grads[1])
        torch.cuda.synchronize()
        return (time.perf_counter() - began) / calls * 1e6

    print(f"== {recipe}: one 768 x 768 layer's call {min(loop_us() for _ in range(5)):.0f} us")
    if recipe == "bf16":
        return
    programs = PROGRAMS.programs()
    runs = {id(p): (*clocked(p), []) for p in programs}
    direct = HostProgram.__call__

    def timed(self: HostProgram, inputs):
        replay, times, _, lines = runs[id(self)]
        times.clear()
        result = replay(*inputs)
        lines.append([b - a for a, b in itertools.pairwise(times)])
        return result

    HostProgram.__call__ = timed  # type: ignore[method-assign]
    try:
        for _ in range(60):
            for model, x, grad_y in zip(layers, xs, grads, strict=True):
                call(model, x, grad_y)
        torch.cuda.synchronize()
    finally:
        HostProgram.__call__ = direct  # type: ignore[method-assign]
    total = 0.0
    for index, program in enumerate(programs):
        _, _, labels, lines = runs[id(program)]
        medians = [statistics.median(line) * 1e6 for line in zip(*lines[5:], strict=True)]
        total += sum(medians)
        if index < 2:  # a forward program and a backward one; the other shapes' are alike
            cells = zip(labels, medians, strict=True)
            steps = ", ".join(f"{label} {us:.0f}" for label, us in cells)
            print(f"-- program, {len(labels)} steps, {sum(medians):.0f} us: {steps}")
    print(f"   {len(programs)} programs {total:.0f} us, {total / len(SHAPES):.0f} us a layer")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="bf16,mxfp4,nvfp4")
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {args.tokens} tokens")
    for recipe in args.recipes.split(","):
        probe(recipe, args.tokens)


if __name__ == "__main__":
    main()
