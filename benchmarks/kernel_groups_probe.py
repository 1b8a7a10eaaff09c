"""Where an eager training step's GPU time goes, by kernel group: fp4cli's own Triton kernels
each by name, torch's kernels as GEMMs, attention, the optimizer, copies and the rest. One
`torch.profiler` view (CUDA activities) of `--steps` eager steps of `fp4 bench step`'s GPT
model, after five warm-up steps. The kernels are those a CUDA graph of the step replays, so
the GPU time is the graphed step's too. A diagnosis script; `fp4 bench step` is the benchmark.

    python benchmarks/kernel_groups_probe.py [--recipes bf16,mxfp4,...] [--size gpt2-small]
        [--steps 3] [--top 14]
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import re
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

# torch's kernels by the first pattern their name matches; fp4cli's are named by their own
TORCH_GROUPS = (
    ("attention", r"sdpa|flash|fmha|attention"),
    ("gemm", r"gemm|nvjet|cutlass|xmma|matmul"),
    ("optimizer", r"multi_tensor_apply|adam"),
    ("copies", r"copy|memcpy|memset"),
)


@dataclass
class StepKernels:
    """GPU milliseconds and launches a step, by kernel name."""

    ms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    launches: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def total(self) -> float:
        return sum(self.ms.values())


def fp4cli_kernel_names() -> set[str]:
    """The names of the Triton kernels in fp4cli.kernels."""
    import triton

    import fp4cli.kernels as package

    names: set[str] = set()
    for module_info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        module = importlib.import_module(module_info.name)
        for value in vars(module).values():
            if isinstance(value, triton.runtime.JITFunction):
                names.add(value.fn.__name__)
    return names


def group_of(name: str, own: set[str]) -> str:
    if name in own:
        return name
    found = (group for group, pattern in TORCH_GROUPS if re.search(pattern, name, re.I))
    return next(found, "other torch")


def profile_steps(recipe: str, size: str, steps: int) -> StepKernels:
    from fp4cli.bench.step import StepCase, build_step, stepper

    case = StepCase("gpt", size, 8, recipe, "triton", "eager")
    runner, batches, _ = build_step(case, torch.device("cuda"))
    step = stepper(runner, batches)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = StepKernels()
    for average in prof.key_averages():
        if average.self_device_time_total > 0:
            kernels.ms[average.key] += average.self_device_time_total / steps / 1e3
            kernels.launches[average.key] += average.count // steps
    return kernels


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="bf16,mxfp4,tetrajet,nvfp4")
    parser.add_argument("--size", default="gpt2-small")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=14)
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, GPT {args.size}, batch 8")
    own = fp4cli_kernel_names()
    groups_by_recipe: dict[str, dict[str, float]] = {}
    for recipe in args.recipes.split(","):
        kernels = profile_steps(recipe, args.size, args.steps)
        groups: dict[str, float] = defaultdict(float)
        for name, ms in kernels.ms.items():
            groups[group_of(name, own)] += ms
        groups_by_recipe[recipe] = groups
        print(f"\n{recipe}: {kernels.total:.2f} ms of GPU time a step")
        for name, ms in sorted(kernels.ms.items(), key=lambda kv: -kv[1])[: args.top]:
            print(f"  {ms:7.3f} ms {kernels.launches[name]:5}x  {name[:100]}")
        torch.cuda.empty_cache()
    columns = sorted({g for groups in groups_by_recipe.values() for g in groups})
    print("\nms a step | total | " + " | ".join(columns))
    for recipe, groups in groups_by_recipe.items():
        cells = " | ".join(f"{groups.get(c, 0.0):.2f}" for c in columns)
        print(f"{recipe} | {sum(groups.values()):.2f} | {cells}")


if __name__ == "__main__":
    main()
