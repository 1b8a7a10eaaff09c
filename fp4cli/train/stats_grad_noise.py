"""The weight gradients' norm against their quantization noise, on statistics steps
(FP4 All the Way's rule for when FP4 training stops gaining; nothing when statistics are off).

For each quantized layer whose weight-gradient GEMM quantizes an operand, on a statistics step:

    G      = sum over the layer's calls in the step of dY^T X, in float32: the weight-gradient
             GEMM without quantization, from the layer's own input X and output gradient dY
    G_q    = the gradient the weight receives in the step's backward pass: the quantized GEMM
             Q(dY)^T Q(X) (times DGE's factor where the recipe has it), before clipping
    grad_norm   = ||G||_F
    noise_norm  = ||G_q - G||_F           one draw of the gradient's quantization noise
    noise_ratio = grad_norm / noise_norm  (inf when the noise is exactly 0)

rows (layer, "grad_weight", metric, value). Over the d entries of a gradient with noise of
standard deviation sigma each, E ||G_q - G||^2 = d sigma^2 (stochastic rounding is unbiased),
so noise_norm estimates sqrt(d) sigma from one draw. FP4 All the Way (Chmiel et al. 2025,
arXiv 2505.19115) finds quantized training stalls once ||grad|| < sqrt(3) sqrt(d) sigma, that is
once the ratio falls below sqrt(3): `fp4cli.analysis.grad_noise` reads the rows for the whole
model, sqrt(sum grad_norm^2) / sqrt(sum noise_norm^2) over the layers, and finds that step.

dY already carries the noise of the layers above (their grad_input GEMMs round it), so G is
this layer's GEMM of its inputs as they are: the ratio measures the noise the update GEMM
adds. Under BF16 autocast G_q's GEMM runs in BF16: its rounding (about 2^-9 relative) is in
the noise too, far below FP4's. A weight shared with another module (tied) would count that
module's gradient in G_q; fp4cli's default skip keeps the tied head and embeddings unquantized.

Cost on statistics steps: one float32 GEMM per layer, and each layer's input X kept from its
forward call until its dY arrives (where autograd keeps only a 4-bit copy or recomputes, that is
extra memory for the step). The hooks are registered once (torch.compile does not trace them);
between statistics steps they return at once and keep nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn

from fp4cli.analysis.grad_noise import OPERAND, noise_ratio
from fp4cli.linear import QuantLinear

METRICS = ("grad_norm", "noise_norm", "noise_ratio")


def gradient_noise(
    quantized: torch.Tensor, reference: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(||reference||_F, ||quantized - reference||_F) as float32 0-d tensors (no host sync)."""
    reference = reference.detach().float()
    return reference.norm(), (quantized.detach().float() - reference).norm()


def records_gradient_noise(layer: QuantLinear) -> bool:
    """Whether the layer's weight-gradient GEMM quantizes an operand (and W learns)."""
    config = layer.config
    quantized = config.grad_weight_dy is not None or config.grad_weight_x is not None
    return quantized and layer.weight.requires_grad


class GradNoiseMeter:
    """Hooks that measure each layer's weight-gradient noise on the steps `begin(True)` opens.

    Per layer: a forward hook that, on a statistics step, hooks the output's gradient; that
    hook adds dY^T X to the layer's reference G and lets go of X. A hook on the weight takes
    the gradient the backward pass gives it and keeps the two norms (0-d tensors)."""

    def __init__(self, layers: dict[str, QuantLinear]) -> None:
        self.layers = {n: m for n, m in layers.items() if records_gradient_noise(m)}
        self.active = False
        self.reference: dict[str, torch.Tensor] = {}  # name -> (out, in) float32 G so far
        self.norms: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, layer in self.layers.items():
            layer.register_forward_hook(self._output_hook(name))
            layer.weight.register_hook(self._weight_hook(name))

    def begin(self, collect: bool) -> None:
        """Before a step's forward pass: measure in this step or not."""
        self.active = collect
        self.reference.clear()
        self.norms.clear()

    def _output_hook(self, name: str) -> Any:
        @torch.compiler.disable
        def hook(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> None:
            if not self.active or not output.requires_grad:
                return
            held = [args[0].detach()]  # X until dY comes

            def add_product(grad: torch.Tensor) -> None:
                x = held.pop()
                dy = grad.detach().reshape(-1, grad.shape[-1]).float()  # (tokens, out)
                product = dy.t() @ x.reshape(-1, x.shape[-1]).float()  # (out, in)
                earlier = self.reference.get(name)
                self.reference[name] = product if earlier is None else earlier + product

            output.register_hook(add_product)

        return hook

    def _weight_hook(self, name: str) -> Any:
        def hook(grad: torch.Tensor) -> None:
            reference = self.reference.pop(name, None) if self.active else None
            if reference is not None:
                self.norms[name] = gradient_noise(grad, reference)

        return hook

    def rows(self) -> list[tuple[str, str, str, float]]:
        """(layer, "grad_weight", metric, value) rows of this step's layers; ends the step."""
        rows: list[tuple[str, str, str, float]] = []
        for name, (grad, noise) in self.norms.items():
            grad_norm, noise_norm = float(grad), float(noise)
            values = (grad_norm, noise_norm, noise_ratio(grad_norm, noise_norm))
            rows += [(name, OPERAND, m, v) for m, v in zip(METRICS, values, strict=True)]
        self.begin(False)
        return rows
