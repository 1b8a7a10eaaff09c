"""Train the gpt task at its default size with several recipes, side by side on one device.

    python benchmarks/train_gpt.py [--recipes bf16,mxfp4] [--steps N] [--backend auto|torch]
                                   [--cuda-graph] [--store PATH]

Prints, per recipe: wall time, tokens/s, the ratio to the first recipe's throughput and the final
validation loss. Each run is an ordinary run in the store (tagged `bench-train-gpt`).
"""

from __future__ import annotations

import argparse
import time

from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipes", default="bf16,mxfp4")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--store", default=None)
    parser.add_argument("--backend", default="auto", help="quantizer: auto, torch or triton")
    parser.add_argument("--cuda-graph", action="store_true", help="replay steps from a CUDA graph")
    args = parser.parse_args()
    store = RunStore(args.store)
    rows = []
    for recipe in args.recipes.split(","):
        flags = {
            "task": "gpt",
            "recipe": recipe,
            "steps": args.steps,
            "backend": args.backend,
            "cuda_graph": args.cuda_graph or None,
            "tags": ("bench-train-gpt",),
        }
        began = time.time()
        result, trainer = run_training(flags, [], store, reporter=SilentReporter())
        seconds = time.time() - began
        config = trainer.config
        tokens = config.steps * config.batch_size * trainer.task.block_size
        rows.append(
            (
                recipe,
                result.status,
                config.steps,
                seconds,
                tokens / result.seconds,
                result.metrics.get("val_loss", float("nan")),
                result.run_id,
            )
        )
    device = trainer.device
    print(f"\ngpt default size on {device} ({store.path})")
    print(
        f"{'recipe':<16}{'status':<10}{'steps':>7}{'seconds':>9}{'tokens/s':>12}"
        f"{'vs first':>9}{'val_loss':>10}  run"
    )
    for recipe, status, steps, seconds, rate, val, run_id in rows:
        print(
            f"{recipe:<16}{status:<10}{steps:>7}{seconds:>9.1f}{rate:>12,.0f}"
            f"{rate / rows[0][4]:>9.2f}{val:>10.4f}  {run_id}"
        )


if __name__ == "__main__":
    main()
