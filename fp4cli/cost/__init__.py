"""The cost model: what each technique adds to a linear layer's three GEMMs, and the layer's
estimated time as a ratio to BF16, on a device profile (docs/cost-model.md).

    from fp4cli.cost import LayerShape, estimate_model, profile_for
    cost = estimate_model(load_recipe("tetrajet").linear, [LayerShape(8192, 4096, 4096)],
                          profile_for("h100"))
    cost.ratio
"""

from fp4cli.cost.devices import PROFILES, DeviceProfile, local_profile, profile_for
from fp4cli.cost.errors import CostError
from fp4cli.cost.items import CostItem
from fp4cli.cost.measured import MeasuredRate, MeasuredRates, measured_rates, spec_key
from fp4cli.cost.model import LayerCost, ModelCost, estimate_layer, estimate_model
from fp4cli.cost.shapes import LayerShape, parse_shape

__all__ = [
    "PROFILES",
    "CostError",
    "CostItem",
    "DeviceProfile",
    "LayerCost",
    "LayerShape",
    "MeasuredRate",
    "MeasuredRates",
    "ModelCost",
    "estimate_layer",
    "estimate_model",
    "local_profile",
    "measured_rates",
    "parse_shape",
    "profile_for",
    "spec_key",
]
