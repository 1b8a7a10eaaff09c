"""The GEMM shape of each linear layer of a model in one forward pass (the store's `layers`
rows, logged at a run's first step)."""

from __future__ import annotations

from typing import Any

import torch.nn as nn


class LayerShapes:
    """The GEMM shape of each linear layer in one forward pass: forward hooks that record the
    rows of the layer's input (tokens summed over its calls), removed by rows()."""

    def __init__(self, model: nn.Module) -> None:
        from fp4cli.linear import QuantLinear

        self.tokens: dict[str, int] = {}
        self.layers = {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear)}
        self.quantized = {
            name: isinstance(m, QuantLinear) and not m.config.is_high_precision
            for name, m in self.layers.items()
        }
        self.handles = [m.register_forward_hook(self._hook(n)) for n, m in self.layers.items()]

    def _hook(self, name: str) -> Any:
        def record(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> None:
            x = inputs[0]  # (..., in_features)
            self.tokens[name] = self.tokens.get(name, 0) + x.numel() // x.shape[-1]

        return record

    def rows(self) -> list[tuple[str, int, int, int, bool]]:
        for handle in self.handles:
            handle.remove()
        return [
            (name, self.tokens[name], m.in_features, m.out_features, self.quantized[name])
            for name, m in self.layers.items()
            if name in self.tokens
        ]
