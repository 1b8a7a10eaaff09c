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


@pytest.mark.parametrize("recipe", ["mxfp4", "tetrajet", "nvfp4", "nvidia-nvfp4"])
def test_two_gpus_gather_fp4_weights_with_the_bf16_gathers_bits(tmp_path, recipe):
    """FSDP2 on NCCL: the packed all-gather and the BF16 one give the same losses (the layers
    compute with the same operands), the packed one in fewer bytes."""
    common = ["--store", str(tmp_path / "s.db"), "--task=gpt", f"--recipe={recipe}", "--steps=6",
              "--set=log_every=1", "--nproc-per-node=2", "--parallel=fsdp"]  # fmt: skip
    for extra in ([], ["--set=parallel.fp4_gather=false"]):
        done = subprocess.run([*FP4, *common, *extra], capture_output=True, text=True,
                              timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    store = RunStore(tmp_path / "s.db")
    plain, packed = store.list_runs()
    losses = [[m["value"] for m in store.metrics(r["id"], "train_loss")] for r in (packed, plain)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    kept = store.final_metrics(packed["id"], ["gather_bytes", "gather_bf16_bytes"])
    assert kept["gather_bytes"] < kept["gather_bf16_bytes"]
