"""A sweep worker process: trains the points it takes from the queue until it gets None."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any


def worker_main(
    store_path: str,
    sweep_id: str,
    tags: Sequence[str],
    log_to: Sequence[str],
    threads: int,
    jobs: Any,
    results: Any,
    device: str,
) -> None:
    """Open the store, then train points from `jobs` on `device`; each result goes to
    `results`. A point stopped by Ctrl-C or SIGTERM ends the worker (the sweep is being
    stopped), and so does a signal between points, quietly, and finding, between points, that
    the sweep's process is gone (killed outright)."""
    import torch

    from fp4cli.store import RunStore
    from fp4cli.sweep.point_run import run_point
    from fp4cli.train.signals import stop_signals

    parent = os.getppid()
    torch.set_num_threads(threads)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    with stop_signals(), RunStore(store_path) as store:
        try:
            while os.getppid() == parent and (point := jobs.get()) is not None:
                result = run_point(point, sweep_id, tags, device, store, log_to)
                results.put(result)
                if result.status == "interrupted":
                    return
        except KeyboardInterrupt:  # before a point's trainer took the signal
            return
