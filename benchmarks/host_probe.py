"""Where a quantized layer's host time goes: one Linear forward + backward per recipe, issued
from Python, with the layer programs replayed and with every call running the executors'
Python (`fp4cli.replay.replays(False)`), beside nn.Linear; each replayed recipe checked bit for
bit against the direct calls; and a cProfile of the replayed calls. A diagnosis script;
`fp4 bench layer` (its host us column) is the benchmark.

    python benchmarks/host_probe.py [--recipes mxfp4,tetrajet] [--shape 8192x768x3072]
        [--profile mxfp4]
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import functools
import inspect
import pstats
import time

import torch
import torch.nn as nn

from fp4cli import QuantLinear
from fp4cli.linear.plans import PROGRAMS
from fp4cli.recipes import load_recipe
from fp4cli.replay import replays
from fp4cli.replay.cache import _signature
from fp4cli.replay.program import HostProgram

RECIPES = "mxfp4,tetrajet,tetrajet-qema,tseng-rht-sr,nvfp4,nvidia-nvfp4,wang-fp4,quartet2"


def layer_and_data(recipe: str, tokens: int, n_in: int, n_out: int):
    torch.manual_seed(0)
    linear = nn.Linear(n_in, n_out, device="cuda")
    layer: nn.Module = linear
    if recipe != "bf16":
        layer = QuantLinear.from_linear(linear, load_recipe(recipe).linear, seed=0)
    x = torch.randn(tokens, n_in, device="cuda").to(torch.bfloat16).requires_grad_()
    grad_y = torch.randn(tokens, n_out, device="cuda").to(torch.bfloat16)
    return layer, x, grad_y


def call(layer, x, grad_y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = layer(x)
    return torch.autograd.grad(y, [x, *layer.parameters()], grad_y)


def host_us(fn, iters: int = 20, repeats: int = 7) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        began = time.perf_counter()
        for _ in range(iters):
            fn()
        times.append((time.perf_counter() - began) * 1e6 / iters)
    torch.cuda.synchronize()
    return min(times)  # the host is shared: the least disturbed loop


def same_bits(layer, x, grad_y) -> bool:
    """Five calls replayed against five direct ones from the same call count."""
    start = layer.calls.clone() if hasattr(layer, "calls") else None
    results = []
    for enabled in (True, False):
        if start is not None:
            layer.calls.copy_(start)
        with replays(enabled):
            results.append([call(layer, x, grad_y) for _ in range(5)])
    return all(
        torch.equal(a, b)
        for got, want in zip(*results, strict=True)
        for a, b in zip(got, want, strict=True)
    )


def micro(tokens: int, n_in: int, n_out: int) -> None:
    """Host microseconds of single steps: a Python loop, torch.empty, a view, a raw aten call,
    an eager nn.Linear forward + backward, and each replayed program of mxfp4 alone."""
    x = torch.empty(64, 64, device="cuda")
    loop = lambda: sum(range(100))  # noqa: E731
    print(f"python sum(range(100)): {host_us(loop, 200):.2f} us")
    empty = lambda: torch.empty((256, 64), dtype=torch.bfloat16, device="cuda")  # noqa: E731
    print(f"torch.empty: {host_us(empty, 200):.2f} us")
    print(f"x.t(): {host_us(lambda: x.t(), 200):.2f} us")
    raw = torch.ops.aten.t.default._op
    print(f"aten.t raw: {host_us(lambda: raw(x), 200):.2f} us")
    print(f"x.add_(1): {host_us(lambda: x.add_(1), 200):.2f} us")
    PROGRAMS.clear()
    layer, xs, grad_y = layer_and_data("mxfp4", tokens, n_in, n_out)
    for _ in range(4):
        call(layer, xs, grad_y)
    programs = PROGRAMS.programs()
    for program, inputs in zip(programs, _program_inputs(layer, xs, grad_y), strict=True):
        us = host_us(lambda p=program, i=inputs: p(i), 50)
        print(f"program of {program.steps} steps: {us:.1f} us; by step:")
        before = 0.0
        for count in range(1, program.steps + 1):  # each step's cost: prefixes' differences
            steps = program.recording.steps[:count]
            prefix = HostProgram(dataclasses.replace(program.recording, steps=steps, result=None),
                                 program.device)  # fmt: skip
            total = host_us(lambda p=prefix, i=inputs: p(i), 50)
            step = steps[-1]
            name = getattr(step, "name", None) or getattr(getattr(step, "kernel", None), "fn", step)
            print(f"    {total - before:7.1f} us  {getattr(name, '__name__', name)}")
            before = total
    print(f"autocast(enabled=False): {host_us(_autocast_off, 200):.2f} us")
    print(f"trivial autograd.Function fwd: {host_us(lambda: _Identity.apply(xs), 200):.2f} us")
    inputs = (xs, layer.weight, layer.bias, layer.rng_seed, layer.calls, None, None, None)
    signature = functools.partial(_signature, "k", inputs)
    print(f"signature of 8 inputs: {host_us(signature, 200):.2f} us")
    print(f"torch.cuda.current_device: {host_us(torch.cuda.current_device, 200):.2f} us")
    linear, xl, gl = layer_and_data("bf16", tokens, n_in, n_out)
    print(f"nn.Linear fwd+bwd: {host_us(lambda: call(linear, xl, gl), 50):.1f} us")
    print(f"mxfp4 fwd+bwd: {host_us(lambda: call(layer, xs, grad_y), 50):.1f} us")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        fwd = lambda: layer(xs)  # noqa: E731
        print(f"mxfp4 forward alone: {host_us(fwd, 50):.1f} us")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(200):
            fwd()
        profile.disable()
        torch.cuda.synchronize()
        pstats.Stats(profile).sort_stats("cumtime").print_stats(30)
        lin = lambda: linear(xl)  # noqa: E731
        print(f"nn.Linear forward alone: {host_us(lin, 50):.1f} us")


class _Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g


def _autocast_off():
    with torch.autocast("cuda", enabled=False):
        pass


def _program_inputs(layer, x, grad_y):
    """The inputs the mxfp4 forward and backward programs take (as `fast_function.planned_*`
    pass them): the forward draws the seed from the layer's counter, the backward takes it."""
    forward = (x, layer.weight, layer.bias, layer.rng_seed, layer.calls, None, None, None)
    program = PROGRAMS.programs()[0]
    y, x_saved, w_saved, _, seed = program(forward)
    return [forward, (grad_y, seed, *x_saved, *w_saved)]


def step_check(recipes: list[str], steps: int = 5) -> None:
    """Eager GPT-2-small steps (batch 8) per recipe with the layer programs replayed and not,
    the programs recorded and refused, and a profile of one replayed step."""
    from fp4cli.bench.step import StepCase, build_step

    for recipe in recipes:
        PROGRAMS.clear()
        case = StepCase("gpt", "gpt2-small", 8, recipe, "triton", "eager")
        runner, batches, summary = build_step(case, torch.device("cuda"))
        times = {}
        for enabled in (True, False, True):
            with replays(enabled):
                for i in range(3):
                    runner(batches[i % 2])
                torch.cuda.synchronize()
                began = time.perf_counter()
                for i in range(steps):
                    runner(batches[i % 2])
                torch.cuda.synchronize()
                times[enabled] = (time.perf_counter() - began) * 1e3 / steps
        print(f"step {recipe}: replayed {times[True]:.1f} ms, direct {times[False]:.1f} ms; "
              f"{len(PROGRAMS.programs())} programs of {len(PROGRAMS)}, refusals "
              f"{PROGRAMS.refusals()}")  # fmt: skip
        if recipe == recipes[-1]:
            profile = cProfile.Profile()
            profile.enable()
            runner(batches[0])
            torch.cuda.synchronize()
            profile.disable()
            pstats.Stats(profile).sort_stats("tottime").print_stats(25)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default=RECIPES)
    parser.add_argument("--shape", default="8192x768x3072")
    parser.add_argument("--profile", default="mxfp4")
    parser.add_argument("--micro", default="256x768x3072", help="the micro steps' shape")
    parser.add_argument("--steps", default="", help="recipes whose eager GPT-2 step to check")
    args = parser.parse_args()
    if args.steps:
        step_check(args.steps.split(","))
        return
    tokens, n_in, n_out = (int(v) for v in args.shape.split("x"))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, shape {args.shape}")
    micro(*(int(v) for v in args.micro.split("x")))
    from triton.backends.nvidia.driver import CudaLauncher

    print(inspect.getsource(CudaLauncher))
    rows = []
    for recipe in ["bf16", *args.recipes.split(",")]:
        layer, x, grad_y = layer_and_data(recipe, tokens, n_in, n_out)
        fn = functools.partial(call, layer, x, grad_y)
        for _ in range(4):
            fn()
        replayed = host_us(fn)
        with replays(False):
            direct = host_us(fn)
        same = same_bits(layer, x, grad_y) if recipe != "bf16" else True
        rows.append((recipe, replayed, direct, same))
        if recipe == args.profile:
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(50):
                fn()
            profile.disable()
            torch.cuda.synchronize()
            pstats.Stats(profile).sort_stats("tottime").print_stats(18)
            for program in PROGRAMS.programs()[-2:]:
                print(program.source)
    print("refusals:", PROGRAMS.refusals())
    print(f"{'recipe':<14} {'replayed us':>12} {'direct us':>10}  same bits")
    for recipe, replayed, direct, same in rows:
        print(f"{recipe:<14} {replayed:12.1f} {direct:10.1f}  {same}")


if __name__ == "__main__":
    main()
