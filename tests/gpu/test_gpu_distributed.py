"""On two CUDA GPUs: fp4 train --nproc-per-node 2 with DDP and FSDP2 (NCCL) runs and matches
one GPU to BF16 accuracy."""

import subprocess
import sys

import pytest
import torch

from fp4cli.store import RunStore

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]

FP4 = [sys.executable, "-m", "fp4cli.cli", "train", "--quiet", "--size=debug"]


@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_two_gpus_train_tetrajet_like_one(tmp_path, parallel):
    common = ["--store", str(tmp_path / "s.db"), "--task=gpt", "--recipe=tetrajet", "--steps=6"]
    common += ["--set=log_every=1"]
    for extra in ([], ["--nproc-per-node=2", f"--parallel={parallel}"]):
        done = subprocess.run([*FP4, *common, *extra], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
    store = RunStore(tmp_path / "s.db")
    two, one = store.list_runs()
    assert (two["world_size"], two["parallel"], one["world_size"]) == (2, parallel, 1)
    losses = [[m["value"] for m in store.metrics(r["id"], "train_loss")] for r in (two, one)]
    assert losses[0][0] == pytest.approx(losses[1][0], rel=2e-2)  # BF16 compute, other SR bits
    assert all(torch.isfinite(torch.tensor(losses[0])))
