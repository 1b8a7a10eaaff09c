"""What a compiled layer's op costs the host around its work: one quantized Linear forward
(`fp4cli.linear.ops._forward`, its program replayed) called directly, through the op as
fp4cli defines it (`fp4cli::quant_linear`), and through the same function registered as a
`torch.library.custom_op`, with gradients off (as a compiled step calls it). Host
microseconds a call, the least of 5 loops of 300 calls in each of two rounds. A diagnosis
script; `fp4 bench step --modes compile` is the benchmark.

    python benchmarks/op_dispatch_probe.py [--recipe mxfp4] [--shape 8192x768x3072] [--calls 300]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn as nn

from fp4cli import QuantLinear
from fp4cli.bench.timing import synchronize
from fp4cli.linear import ops
from fp4cli.recipes import load_recipe


def host_us(call: Callable[[], object], device: torch.device, calls: int, loops: int = 5) -> float:
    best = float("inf")
    for _ in range(loops):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    synchronize(device)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="mxfp4")
    parser.add_argument("--shape", default="8192x768x3072", help="tokens x in x out")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    tokens, n_in, n_out = (int(n) for n in args.shape.split("x"))
    torch.manual_seed(0)
    linear = nn.Linear(n_in, n_out, device=device)
    layer = QuantLinear.from_linear(linear, load_recipe(args.recipe).linear, seed=0)
    x = torch.randn(tokens, n_in, device=device, dtype=torch.bfloat16)
    arguments = (x, layer.weight, layer.bias, layer._next_call_seed(), None, "fast",
                 layer._op_key, 0, True, True, torch.bfloat16)  # fmt: skip
    custom = torch.library.custom_op("fp4probe::quant_linear", ops._forward, mutates_args=())
    cases = {
        "direct": lambda: ops._forward(*arguments),
        "fp4cli::quant_linear": lambda: ops.quant_linear(*arguments),
        "as a custom_op": lambda: custom(*arguments),
    }
    with torch.no_grad():
        for call in cases.values():  # the recording and the first replay
            call(), call()
        times = {name: [host_us(call, device, args.calls)] for name, call in cases.items()}
        for name, call in cases.items():  # a second round, in the same order
            times[name].append(host_us(call, device, args.calls))
    direct = min(times["direct"])
    print(f"{args.recipe} {args.shape}: host us a call (least of two rounds), and over direct")
    for name, measured in times.items():
        print(f"  {name:22s} {min(measured):8.1f}  {min(measured) - direct:+7.1f}")


if __name__ == "__main__":
    main()
