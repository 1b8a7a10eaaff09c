"""fp4cli: FP4 training research, from one YAML recipe to a trained model and a run store.

The public API is imported lazily (PEP 562), so `import fp4cli` and `fp4 --help` do not pay for
importing torch until a name that needs it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "QuantSpec": "fp4cli.quant",
    "QuantizedTensor": "fp4cli.quant",
    "SpecError": "fp4cli.quant",
    "quantize": "fp4cli.quant",
    "fake_quantize": "fp4cli.quant",
    "mxfp4_matmul": "fp4cli.gemm",
    "nvfp4_matmul": "fp4cli.gemm",
    "LinearConfig": "fp4cli.linear",
    "QuantLinear": "fp4cli.linear",
    "quantize_model": "fp4cli.linear",
    "quantized_layers": "fp4cli.linear",
    "update_qema": "fp4cli.linear",
    "attach_qema": "fp4cli.linear",
    "Recipe": "fp4cli.recipes",
    "RecipeError": "fp4cli.recipes",
    "load_recipe": "fp4cli.recipes",
    "list_recipes": "fp4cli.recipes",
    "TrainStep": "fp4cli.train.graphed",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from fp4cli.gemm import mxfp4_matmul as mxfp4_matmul
    from fp4cli.gemm import nvfp4_matmul as nvfp4_matmul
    from fp4cli.linear import LinearConfig as LinearConfig
    from fp4cli.linear import QuantLinear as QuantLinear
    from fp4cli.linear import attach_qema as attach_qema
    from fp4cli.linear import quantize_model as quantize_model
    from fp4cli.linear import quantized_layers as quantized_layers
    from fp4cli.linear import update_qema as update_qema
    from fp4cli.quant import QuantizedTensor as QuantizedTensor
    from fp4cli.quant import QuantSpec as QuantSpec
    from fp4cli.quant import SpecError as SpecError
    from fp4cli.quant import fake_quantize as fake_quantize
    from fp4cli.quant import quantize as quantize
    from fp4cli.recipes import Recipe as Recipe
    from fp4cli.recipes import RecipeError as RecipeError
    from fp4cli.recipes import list_recipes as list_recipes
    from fp4cli.recipes import load_recipe as load_recipe
    from fp4cli.train.graphed import TrainStep as TrainStep


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fp4cli' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
