"""The work the techniques around the quantizers add (M tokens, K in_features, N out_features).

Outlier clamping (Wang et al.), quantile q: each token's row of X gets its (1 - q) and q
quantiles by a selection on chip (no sort), the residual X - clamp(X) is written sparse, and
the forward_x quantizer clamps with the two bounds (2 ops per element, fused into it):
    quantile pass: bytes = 2 M K + d M K x 6, ops = 20 per element
    d = 2 (1 - q), the residual's density: values beyond either tail (about 2% at q = 0.99);
    a sparse entry is a BF16 value and an int32 column index (6 bytes).
With compensation, the residual is added back to the dequantized X before the forward GEMM (as
Wang et al.'s code does, so it reaches the forward and the weight-gradient GEMMs alike): a
scatter of the sparse residual into X,
    bytes = the sparse residual + d M K x 4 (the BF16 values it lands on, read and written),
    ops = d M K.
DGE (Wang et al.): one pass over the N x K weight gradient: read W and dW, write dW,
    bytes = 6 N K, ops = 10 (the forward weight quantizer's scale and grid position) + 12
    (interval, t, the power as log2 and exp2, the cap, the product) per element.
Q-EMA (TetraJet): the forward_w quantizer also reads the FP32 EMA as its rounding guide
    (4 N K bytes, 2 ops per element, fused), and after each optimizer step the EMA is updated:
    bytes = (2 + 4 + 4) N K (W read, EMA read and written), ops = 3 per element.
    LayerShape.tokens are one optimizer step's tokens: the update runs once per estimate.
Q-Ramping (TetraJet, optional): per step, each weight's FP32 accumulator and count are read and
    written and its period read (20 N K bytes, 6 ops per element) beyond what AdamW does; and
    calibration_steps + 1 of every `interval` steps are extra steps of the layer:
    calibration = (calibration_steps + 1) / interval x the layer's other items (the bookkeeping
    of the calibration steps themselves, O(N K) per step, is not counted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fp4cli.cost.devices import DeviceProfile
from fp4cli.cost.items import CostItem, Work, pass_item
from fp4cli.cost.operands import HP_BYTES, QUANTIZE_OPS
from fp4cli.cost.shapes import LayerShape

if TYPE_CHECKING:
    from fp4cli.recipe_schema import QRampConfig
    from fp4cli.techniques import OutlierConfig

QUANTILE_OPS = 20  # per element: two radix-select passes on chip, the residual, its compaction
CLAMP_OPS = 2  # min, max
SPARSE_ENTRY_BYTES = 6  # a BF16 value and an int32 column index
DGE_OPS = QUANTIZE_OPS + 12
EMA_BYTES = 4  # the FP32 EMA buffer
EMA_GUIDE_OPS = 2  # pick the grid point nearer the EMA
EMA_UPDATE_OPS = 3
QRAMP_STATE_BYTES = 20  # accumulator and count read and written (16), period read (4)
QRAMP_OPS = 6


def residual_density(outliers: OutlierConfig) -> float:
    """The share of X outside a token's [1 - q, q] quantiles."""
    return 2 * (1 - outliers.quantile)


def _residual_bytes(outliers: OutlierConfig, shape: LayerShape) -> float:
    """The sparse residual, written only when it is compensated."""
    x_elements = shape.tokens * shape.in_features
    density = residual_density(outliers)
    return density * x_elements * SPARSE_ENTRY_BYTES if outliers.compensate else 0.0


def quantile_item(outliers: OutlierConfig, shape: LayerShape, profile: DeviceProfile) -> CostItem:
    """Each token's two quantiles, and the sparse residual written."""
    x_elements = shape.tokens * shape.in_features
    moved = HP_BYTES * x_elements + _residual_bytes(outliers, shape)
    work = Work("outliers", QUANTILE_OPS * x_elements, moved)
    return pass_item("outliers", "forward_x (quantiles)", work, profile)


def compensation_item(
    outliers: OutlierConfig, shape: LayerShape, profile: DeviceProfile
) -> CostItem:
    """The sparse residual added to the dequantized X before the forward GEMM."""
    touched = residual_density(outliers) * shape.tokens * shape.in_features
    moved = _residual_bytes(outliers, shape) + 2 * HP_BYTES * touched
    work = Work("outliers", touched, moved)
    return pass_item("outliers", "forward_x (residual)", work, profile)


def clamp_work(shape: LayerShape) -> Work:
    """The clamp, fused into the forward_x quantizer."""
    return Work("outliers", CLAMP_OPS * shape.tokens * shape.in_features)


def dge_item(shape: LayerShape, profile: DeviceProfile) -> CostItem:
    weights = shape.out_features * shape.in_features
    work = Work("dge", DGE_OPS * weights, 3 * HP_BYTES * weights)
    return pass_item("dge", "dW", work, profile)


def qema_guide_work(shape: LayerShape) -> Work:
    """The EMA read as the forward weight quantizer's rounding guide (fused into it)."""
    weights = shape.out_features * shape.in_features
    return Work("qema", EMA_GUIDE_OPS * weights, EMA_BYTES * weights)


def qema_update_item(shape: LayerShape, profile: DeviceProfile) -> CostItem:
    weights = shape.out_features * shape.in_features
    work = Work("qema", EMA_UPDATE_OPS * weights, (HP_BYTES + 2 * EMA_BYTES) * weights)
    return pass_item("qema", "weight (EMA)", work, profile)


def qramp_items(
    qramp: QRampConfig, layer_items: list[CostItem], shape: LayerShape, profile: DeviceProfile
) -> list[CostItem]:
    """The per-step accumulation, and the calibration steps amortized over `interval`."""
    weights = shape.out_features * shape.in_features
    work = Work("qramp", QRAMP_OPS * weights, QRAMP_STATE_BYTES * weights)
    share = (qramp.calibration_steps + 1) / qramp.interval
    calibration = CostItem(
        "qramp",
        "calibration",
        share * sum(item.flops for item in layer_items),
        share * sum(item.bytes for item in layer_items),
        share * sum(item.seconds for item in layer_items),
    )
    return [pass_item("qramp", "weight (accum)", work, profile), calibration]
