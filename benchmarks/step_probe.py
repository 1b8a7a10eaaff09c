"""Where a quantized training step's GPU time goes: the quantization kernels of one linear layer
against a device copy (each timed from a CUDA graph of 20 calls, so launches cost nothing), and
the GPU time of one GPT-2-small step by kernel. A diagnosis script; `fp4 bench step` is the
benchmark.

    python benchmarks/step_probe.py [--recipes mxfp4,tetrajet] [--batch 8] [--compile]
        [--no-kernels]

`--compile` profiles the step of the torch.compile'd model (after its compiling steps);
`--no-kernels` skips the per-kernel table.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F

import fp4cli
from fp4cli.kernels.quantization.launch_amax import pair_amax
from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair
from fp4cli.quant import QuantSpec, fake_quantize

CEIL = QuantSpec.preset("mxfp4-ceil")
CEIL_SR = CEIL.replace(rounding="sr")
NVFP4 = QuantSpec.preset("nvfp4")


def graph_us(fn, calls: int = 20) -> float:
    """Microseconds per call of `fn`, replayed from a CUDA graph of `calls` calls."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / (5 * calls)


def kernel_cases(x: torch.Tensor, seed: torch.Tensor) -> dict:
    """The quantizations one tetrajet layer runs on a tensor like x, nvfp4's tensor amax pass,
    and a copy of x."""
    row_v = Direction(CEIL, None, values_dtype=torch.bfloat16)
    row_sr = Direction(CEIL_SR, (seed, 2), values_dtype=torch.bfloat16)
    col_p = Direction(CEIL_SR, (seed, 5))
    col_v = Direction(CEIL_SR, (seed, 4), values_dtype=torch.bfloat16)
    return {
        "copy": lambda: x.clone(),
        "pair X: values + packed, double": lambda: quantize_pair(x, row_v, col_p, x.dtype),
        "pair dY: values + values": lambda: quantize_pair(x, row_sr, col_v),
        "row values only": lambda: quantize_pair(x, row_v, None),
        "col packed only": lambda: quantize_pair(x, None, col_p),
        "col values only": lambda: quantize_pair(x, None, col_v),
        "old: fake rows": lambda: fake_quantize(x, CEIL, 1, out_dtype=torch.bfloat16),
        "old: fake cols sr": lambda: fake_quantize(x, CEIL_SR, 0, seed=seed),
        "nvfp4 amax: plain + RHT-16 cols": lambda: pair_amax(
            x, Direction(NVFP4), Direction(NVFP4, None, 16, (seed, 9)), (64, 64)
        ),
        "nvfp4 amax: plain, both ways": lambda: pair_amax(
            x, Direction(NVFP4), Direction(NVFP4), (64, 64)
        ),
    }


def kernel_table() -> None:
    seed = torch.tensor(7, device="cuda")
    print(f"{'tensor':<14}{'what':<34}{'us':>8}{'x copy':>8}")
    for rows, cols in ((8192, 768), (8192, 3072)):
        x = torch.randn(rows, cols, device="cuda", dtype=torch.bfloat16)
        cases = kernel_cases(x, seed)
        copy = graph_us(cases["copy"])
        for name, fn in cases.items():
            us = graph_us(fn)
            print(f"{rows}x{cols:<9}{name:<34}{us:>8.1f}{us / copy:>8.2f}", flush=True)


def step_profile(recipe: str, batch: int, compiled: bool = False) -> None:
    from torch.profiler import ProfilerActivity, profile

    from fp4cli.tasks.gpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 1024, 12, 768, 12)).cuda()
    if recipe != "bf16":
        fp4cli.quantize_model(model, recipe, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fp4cli.attach_qema(model, optimizer)
    tokens = torch.randint(0, 256, (batch, 1024), device="cuda")
    forward = torch.compile(model) if compiled else model

    def step():
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(forward(tokens).float().view(-1, 256), tokens.view(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:  # fmt: skip
        step()
        torch.cuda.synchronize()
    by_name: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type.name == "CUDA":
            by_name[event.name[:60]].append(event.device_time)
    total = sum(sum(v) for v in by_name.values())
    label = f"{recipe} (compiled)" if compiled else recipe
    count = sum(map(len, by_name.values()))
    print(f"\n{label}: GPU {total / 1e3:.2f} ms in {count} kernels")
    for name, times in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:24]:
        print(f"  {sum(times) / 1e3:7.2f} ms {len(times):5}x  {name}")
    ops = prof.key_averages(group_by_input_shape=True)
    print("  operators by GPU time, with their input shapes:")
    for op in sorted(ops, key=lambda o: -o.self_device_time_total)[:12]:
        shapes = str(op.input_shapes)[:70]
        print(f"  {op.self_device_time_total / 1e3:7.2f} ms {op.count:5}x  {op.key:<28}{shapes}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="bf16,mxfp4,tetrajet")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--no-kernels", action="store_true")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), torch.__version__)
    if not args.no_kernels:
        kernel_table()
    for recipe in args.recipes.split(","):
        step_profile(recipe, args.batch, args.compile)


if __name__ == "__main__":
    main()
