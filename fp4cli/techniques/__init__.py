"""FP4 training techniques, one module each: a small frozen config plus pure functions."""

from fp4cli.techniques.dge import DGEConfig
from fp4cli.techniques.hadamard import HadamardConfig
from fp4cli.techniques.out_control import OutControlConfig
from fp4cli.techniques.outliers import OutlierConfig
from fp4cli.techniques.qema import QEMAConfig
from fp4cli.techniques.trust import TrustConfig

__all__ = [
    "DGEConfig",
    "HadamardConfig",
    "OutControlConfig",
    "OutlierConfig",
    "QEMAConfig",
    "TrustConfig",
]
