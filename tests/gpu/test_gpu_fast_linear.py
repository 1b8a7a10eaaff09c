"""On a CUDA GPU: the fused pair quantization on large bf16 tensors, the fast Linear executor
under bf16 autocast, and training steps replayed from a CUDA graph, each against its reference
bit for bit. `make gpu-test` runs them; CI deselects the gpu marker."""

from __future__ import annotations

import pytest
import torch

from fp4cli.quant import QuantSpec, fake_quantize, quantize
from fp4cli.store import RunStore
from fp4cli.train import run_training
from fp4cli.train.progress import SilentReporter
from tests.gpu_gpt import (
    autocast_gradients,
    check_executor_gives_the_reference_bits,
    check_graph_steps_equal_eager_steps,
    train_steps,
)
from tests.kernel_checks import COMPILED_ON_GPU, assert_bits, bf16_gpu_input

pytestmark = COMPILED_ON_GPU

CEIL = QuantSpec.preset("mxfp4-ceil")
CEIL_SR = CEIL.replace(rounding="sr")
PRESCALE_SR = QuantSpec.preset("mxfp4", rounding="sr", sr_prescale=0.75)
FAST_RECIPES = [
    "mxfp4",
    "tetrajet",
    "tetrajet-qema",
    "tseng-rht-sr",
    "tseng-baseline",
    "nvfp4",
    "ue5m3-hadamard-sr",
    "tetrajet-v2",
    "quartet2",
    "quartet2-4over6",
    "nvfp4-4over6-all",  # four-over-six on the gradients, after the 16/17 pre-scale
]


@pytest.mark.parametrize("col_h", [None, 64])
@pytest.mark.parametrize("double", [False, True])
def test_pair_on_large_bf16_matches_the_reference(double, col_h):
    from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair

    x = bf16_gpu_input(8192, 3072, seed=1)
    seed = torch.tensor(1234, device="cuda")
    row = Direction(CEIL, None, values_dtype=torch.bfloat16)
    col = Direction(PRESCALE_SR if col_h else CEIL_SR, (seed, 5), col_h, (seed, 8))
    row_out, col_out = quantize_pair(x, row, col, torch.bfloat16 if double else None)
    row_ref = fake_quantize(x, CEIL, 1, out_dtype=torch.bfloat16, backend="torch")
    zero = row_ref == 0
    assert_bits(torch.where(zero, 0, row_out.values), torch.where(zero, 0, row_ref), "row")
    source = row_ref if double else x
    col_ref = quantize(source, col.spec, 0, seed + 5, hadamard=col_h, hadamard_seed=seed + 8,
                       backend="torch")  # fmt: skip
    assert_bits(col_out.codes, col_ref.codes, "column codes")
    assert_bits(col_out.scales, col_ref.scales, "column scale codes")


@pytest.mark.parametrize("double", [False, True])
def test_outer_block_pair_on_large_bf16_matches_the_reference(double):
    """TetraJet-v2's pairs: an FP32 scale per 128 values in both directions, found in the
    kernel's tiles; the column direction with SR and RHT-16, packed with its outer amaxes."""
    from fp4cli.kernels.quantization.launch_pair import Direction, quantize_pair

    outer = QuantSpec.preset("nvfp4-outer128")
    outer_sr = outer.replace(rounding="sr")
    x = bf16_gpu_input(8192, 3072, seed=2)
    seed = torch.tensor(4321, device="cuda")
    row = Direction(outer, None, values_dtype=torch.bfloat16)
    col = Direction(outer_sr, (seed, 3), 16, (seed, 4))
    # one launch of 128 x 128 tiles (the quantized Linear takes one launch a direction)
    row_out, col_out = quantize_pair(x, row, col, torch.bfloat16 if double else None, (128, 128))
    row_ref = fake_quantize(x, outer, 1, out_dtype=torch.bfloat16, backend="torch")
    zero = row_ref == 0
    assert_bits(torch.where(zero, 0, row_out.values), torch.where(zero, 0, row_ref), "row")
    source = row_ref if double else x
    col_ref = quantize(source, outer_sr, 0, seed + 3, hadamard=16, hadamard_seed=seed + 4,
                       backend="torch")  # fmt: skip
    assert_bits(col_out.codes, col_ref.codes, "column codes")
    assert_bits(col_out.scales, col_ref.scales, "column scale codes")
    assert_bits(col_out.tensor_amax, col_ref.tensor_amax[:, ::8], "column outer amaxes")


@pytest.mark.parametrize("recipe", FAST_RECIPES)
def test_fast_executor_equals_reference_under_autocast(recipe):
    """A GPT's forward and backward under bf16 autocast: every gradient the same bits."""
    check_executor_gives_the_reference_bits(recipe, "triton", "fast")


@pytest.mark.parametrize(
    ("recipe", "executor"), [("tetrajet", "fast"), ("nvfp4", "fast"), ("wang-fp4", "vector")]
)
def test_compiled_gpt_is_one_graph_with_the_eager_bits(recipe, executor):
    """torch.compile through the quantized layers' custom ops under bf16 autocast: aot_eager
    (torch's kernels around the ops) gives the eager loss and gradients bit for bit; inductor
    (its own fused kernels around them) the same to bf16's rounding."""
    eager = autocast_gradients(recipe, "triton", executor)
    assert_bits_all(autocast_gradients(recipe, "triton", executor, "aot_eager"), eager, recipe)
    inductor = autocast_gradients(recipe, "triton", executor, "inductor")
    torch.testing.assert_close(inductor["loss"], eager["loss"], rtol=1e-2, atol=0)


@pytest.mark.parametrize("recipe", ["bf16", "tetrajet-qema", "tseng-rht-sr"])
def test_cuda_graph_steps_equal_eager_steps(recipe):
    check_graph_steps_equal_eager_steps(recipe)


@pytest.mark.parametrize("cuda_graph", [False, True])
@pytest.mark.parametrize(
    "recipe", [*FAST_RECIPES, "nvfp4-4over6", "mxfp4-gemm-exact", "wang-fp4", "wang-direct"]
)
def test_recomputed_outputs_give_the_kept_steps_bits(recipe, cuda_graph):
    """cuBLAS, mxfp4_matmul and the FP8 GEMMs multiply the same operands again to the same bits,
    eager and inside a captured step (fp4cli/linear/recompute.py)."""
    from fp4cli.recipes import apply_overrides, load_recipe

    source = recipe
    if recipe == "mxfp4-gemm-exact":
        source = apply_overrides(load_recipe("mxfp4"), ["linear.gemm=exact"])
    kept_losses, kept_params, _ = train_steps(source, cuda_graph)
    losses, params, _ = train_steps(source, cuda_graph, recompute=True)
    assert_bits(losses, kept_losses, "losses")
    for got, want in zip(params, kept_params, strict=True):
        assert_bits(got, want, "parameters")


def test_trainer_with_cuda_graph_logs_what_eager_logs(tmp_path):
    """fp4 train on a GPU replays its steps from a CUDA graph by default: the same metrics as
    --no-cuda-graph, statistics steps included, and a resumed run continues identically."""
    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "gpt", "size": "debug", "recipe": "tetrajet-qema", "steps": 24,
             "log_every": 1, "stats_every": 8, "checkpoint_every": 12}  # fmt: skip

    def series(run_id):
        rows = store.metrics(run_id)
        return [(m["step"], m["name"], m["value"]) for m in rows if m["name"] != "samples_per_s"]

    eager, _ = run_training({**flags, "cuda_graph": False}, [], store, reporter=SilentReporter())
    graphed, trainer = run_training(flags, [], store, reporter=SilentReporter())  # the default
    assert trainer.step_runner.graph is not None
    assert series(graphed.run_id) == series(eager.run_id)
    assert store.quant_stats(graphed.run_id) == store.quant_stats(eager.run_id)

    class StopAt(SilentReporter):
        def update(self, step, loss, samples_per_s):
            if step == 15:
                raise KeyboardInterrupt

    cut, _ = run_training(flags, [], store, reporter=StopAt())
    assert cut.status == "interrupted"
    resumed, _ = run_training({}, [], store, resume=cut.run_id, reporter=SilentReporter())
    assert resumed.status == "finished" and series(resumed.run_id) == series(eager.run_id)


def test_a_failed_capture_leaves_the_default_run_eager(tmp_path, monkeypatch):
    """Where the capture fails (here made to), a run that did not ask for CUDA graphs goes on
    eagerly, says so once, and logs what an eager run logs; one that asked fails."""
    from fp4cli.train.step import StepRunner

    def fail(self, batch):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(StepRunner, "_capture", fail)

    class Messages(SilentReporter):
        lines: list = []

        def message(self, text):
            self.lines.append(text)

    store = RunStore(tmp_path / "fp4.db")
    flags = {"task": "gpt", "size": "debug", "recipe": "mxfp4", "steps": 8, "log_every": 1}
    reporter = Messages()
    fell_back, _ = run_training(flags, [], store, reporter=reporter)
    assert fell_back.status == "finished"
    failed = "(the CUDA graph capture failed: RuntimeError: operation not permitted"
    assert sum(line.startswith("steps: eager from step ") and failed in line
               for line in reporter.lines) == 1  # fmt: skip
    eager, _ = run_training({**flags, "cuda_graph": False}, [], store, reporter=SilentReporter())
    assert [m["value"] for m in store.metrics(fell_back.run_id) if m["name"] == "train_loss"] == [
        m["value"] for m in store.metrics(eager.run_id) if m["name"] == "train_loss"
    ]
    with pytest.raises(RuntimeError, match="capturing"):
        run_training({**flags, "cuda_graph": True}, [], store, reporter=SilentReporter())


@pytest.mark.parametrize("mode", ["exact", "fast"])
@pytest.mark.parametrize("recipe", ["mxfp4", "tetrajet"])
def test_gemm_modes_multiply_the_reference_operands_under_autocast(recipe, mode):
    """GPT-2 small's MLP-up layer on 2048 tokens under bf16 autocast with `gemm: exact | fast`:
    mxfp4_matmul gets the reference executor's operands bit for bit, and each output and
    gradient is the reference's (cuBLAS on the values) to the bf16 result's rounding."""
    import dataclasses

    from fp4cli.recipes import load_recipe
    from tests.kernels.test_linear_gemm import gemm_operands
    from tests.linear_runs import linear_inputs, seeded_layer, training_passes

    config = dataclasses.replace(load_recipe(recipe).linear, gemm=mode)
    fast, reference = (seeded_layer(config, backend, 768, 3072) for backend in ("triton", "torch"))
    x, grad_y = linear_inputs((2048, 768), 3072, seed=3)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got, want = gemm_operands(fast, x, grad_y), gemm_operands(reference, x, grad_y)
        passes = [training_passes(layer, x, grad_y, calls=1)[0] for layer in (fast, reference)]
    assert [how for how, _, _ in got] == [mode] * 3
    for (_, a, b), (_, a_ref, b_ref) in zip(got, want, strict=True):
        zero_a, zero_b = a_ref == 0, b_ref == 0
        assert_bits(torch.where(zero_a, 0, a), torch.where(zero_a, 0, a_ref), f"{mode} A")
        assert_bits(torch.where(zero_b, 0, b), torch.where(zero_b, 0, b_ref), f"{mode} B")
    for index, (tensor, expected) in enumerate(zip(*passes, strict=True)):
        largest = float(expected.float().abs().max())
        message = f"{recipe} {mode} {index}"
        torch.testing.assert_close(
            tensor.float(), expected.float(), rtol=2**-7, atol=2**-12 * largest, msg=message
        )


def test_gemm_fast_gpt_compiles_and_replays_with_the_eager_bits(tmp_path):
    """A GPT whose GEMMs run on mxfp4_matmul (tetrajet, gemm fast): compiled in one graph it
    gives the eager gradients bit for bit, and its steps replayed from a CUDA graph the eager
    steps' losses and parameters."""
    path = tmp_path / "tetrajet-fast.yaml"
    path.write_text("base: tetrajet\nlinear: {gemm: fast}\n")
    eager = autocast_gradients(str(path), "triton", "fast")
    assert_bits_all(autocast_gradients(str(path), "triton", "fast", "aot_eager"), eager, "fast")
    check_graph_steps_equal_eager_steps(str(path))


@pytest.mark.parametrize("base", ["nvfp4", "ue5m3-hadamard-sr"])
def test_block_scaled_gpt_gives_the_reference_bits_under_autocast(tmp_path, base):
    """Two-level recipes with `gemm: exact` (block-scaled products, as Blackwell computes
    NVFP4's): the fast executor's loss and gradients are the reference executor's bit for bit
    under bf16 autocast; compiled in one graph, the eager ones."""
    path = tmp_path / f"{base}-exact.yaml"
    path.write_text(f"base: {base}\nlinear: {{gemm: exact}}\n")
    check_executor_gives_the_reference_bits(str(path), "triton", "fast")
    eager = autocast_gradients(str(path), "triton", "fast")
    assert_bits_all(autocast_gradients(str(path), "triton", "fast", "aot_eager"), eager, base)


def test_captured_runs_leave_no_memory_behind():
    """Run after captured run in one process (a sweep, a benchmark) holds no more memory: the
    warm-up steps share one side stream, so cuBLAS makes no new workspace for each run."""
    import gc

    from fp4cli.bench.step import StepCase, measure_case

    cuda = torch.device("cuda")
    allocated = []
    for _ in range(3):
        row = measure_case(StepCase("gpt", "debug", 4, "mxfp4", "triton", "graph"), cuda, 2)
        assert row.note is None, row.note
        gc.collect()
        torch.cuda.synchronize()
        allocated.append(torch.cuda.memory_allocated(cuda))
    assert allocated[2] == allocated[1], allocated


def assert_bits_all(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], label: str):
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        assert_bits(tensor, want[name], f"{label}: {name}")
