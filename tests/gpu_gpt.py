"""A tiny GPT on the GPU for the executor tests of tests/gpu/: the model, its loss, fixed
batches, one forward and backward under bf16 autocast, training steps (eager or from a CUDA
graph), and the two checks every executor takes on them."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import fp4cli
from tests.kernel_checks import assert_bits, assert_within

BATCHES = 2  # autocast_gradients' backward passes, each adding a bias gradient


def tiny_gpt(recipe: str, backend: str):
    from fp4cli.tasks.gpt_model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(256, 128, 2, 256, 4)).cuda()
    fp4cli.quantize_model(model, recipe, seed=0, backend=backend)
    return model


def gpt_loss(model, batch):
    inputs, targets = batch
    return F.cross_entropy(model(inputs).float().reshape(-1, 256), targets.reshape(-1))


def gpt_batches(count: int, batch: int = 8, length: int = 128):
    generator = torch.Generator(device="cuda").manual_seed(7)
    return [
        tuple(torch.randint(0, 256, (batch, length), generator=generator, device="cuda")
              for _ in range(2))
        for _ in range(count)
    ]  # fmt: skip


def autocast_gradients(
    recipe: str,
    backend: str,
    executor: str,
    compiler: str | None = None,
    output_grads: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """{"loss": the last loss, each parameter's name: its gradient} after BATCHES batches under
    bf16 autocast, with every quantized layer checked to run on `executor`; with `compiler`,
    the model compiled in one graph by that torch.compile backend. output_grads: filled with
    each quantized layer's `bias_sum_bound` of its dY, summed over the batches (float32, per
    output feature)."""
    model = tiny_gpt(recipe, backend)
    layers = fp4cli.quantized_layers(model)
    assert all(layer.executor()[0] == executor for layer in layers.values())
    if output_grads is not None:
        _sum_output_grads(layers, output_grads)
    if compiler is not None:
        torch._dynamo.reset()
    run = model if compiler is None else torch.compile(model, backend=compiler, fullgraph=True)
    for batch in gpt_batches(BATCHES):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = gpt_loss(run, batch)
        loss.backward()
    return {"loss": loss.detach(), **{n: p.grad for n, p in model.named_parameters()}}


def train_steps(recipe: str, cuda_graph: bool, steps: int = 8, recompute: bool = False):
    """(losses, parameters after, runner) of `steps` training steps of the tiny GPT, eager or
    replayed from a CUDA graph with one eager step between replays (Q-EMA updated after each);
    `recompute`: the StepRunner's."""
    from fp4cli.train.step import StepRunner, device_learning_rates

    model = tiny_gpt(recipe, "auto")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True, capturable=True)
    device_learning_rates(optimizer, torch.device("cuda"))
    fp4cli.attach_qema(model, optimizer)
    runner = StepRunner(
        model, optimizer, gpt_loss, 1.0, torch.device("cuda"), cuda_graph=cuda_graph,
        recompute=recompute,
    )  # fmt: skip
    losses = [runner(batch, eager=index == 5)[0] for index, batch in enumerate(gpt_batches(steps))]
    return torch.stack(losses), [p.detach().clone() for p in model.parameters()], runner


def _sum_output_grads(layers: dict, sums: dict[str, torch.Tensor]) -> None:
    """Hooks adding, per layer and output feature, the bound of `bias_sum_bound` over each
    batch's dY into sums[name] as the backward runs."""

    def watch(name: str, output: torch.Tensor) -> None:  # returns None: the output stays
        def add(grad: torch.Tensor) -> None:
            sums[name] = sums.get(name, 0) + bias_sum_bound(grad.reshape(-1, grad.shape[-1]))

        output.register_hook(add)

    for name, layer in layers.items():
        layer.register_forward_hook(lambda _m, _i, out, name=name: watch(name, out))


def bias_sum_bound(grad_y: torch.Tensor) -> torch.Tensor:
    """How far two executors' bias gradients of one batch's dY (tokens, out) may lie apart,
    per output feature: each sums its terms in float32 in some order, within (n - 1) u
    sum |term| of the exact sum (u = 2^-24, first order), and rounds once to dY's dtype, where
    two sums on either side of a bfloat16 rounding point land one unit apart (at most 2^-7 of
    the sum). Counted generously: n as every token of all batches (room for the quantized
    dY's magnitudes, which `bias_gradient: quantized` sums), and the unit at 2^-7 |sum|."""
    terms = grad_y.float()
    spread = 2 * BATCHES * terms.shape[0] * 2.0**-24 * terms.abs().sum(0)
    return spread + 2.0**-7 * (terms.sum(0).abs() + spread)


def check_executor_gives_the_reference_bits(recipe: str, backend: str, executor: str) -> None:
    """The loss and every gradient of `executor` (under `backend`) under bf16 autocast are the
    reference executor's, bit for bit; the fast and vector-wise executors' bias gradients are
    the same sums added in another order (in the kernel's read of dY that quantizes it or
    reduces its amax)."""
    bounds: dict[str, torch.Tensor] = {}
    want = autocast_gradients(recipe, "torch", "reference", output_grads=bounds)
    got = autocast_gradients(recipe, backend, executor)
    assert got.keys() == want.keys()
    for name, tensor in got.items():
        layer = name.removesuffix(".bias")
        if executor in ("fast", "vector") and name.endswith(".bias") and layer in bounds:
            assert_within(tensor, want[name], bounds[layer], f"{recipe}: {name}")
        else:
            assert_bits(tensor, want[name], f"{recipe}: {name}")


def check_graph_steps_equal_eager_steps(recipe: str) -> None:
    """Steps replayed from a CUDA graph give the eager steps' losses and parameters."""
    eager_losses, eager_params, _ = train_steps(recipe, cuda_graph=False)
    graph_losses, graph_params, runner = train_steps(recipe, cuda_graph=True)
    assert runner.graph is not None
    assert_bits(graph_losses, eager_losses, "losses")
    for got, want in zip(graph_params, eager_params, strict=True):
        assert_bits(got, want, "parameters")
