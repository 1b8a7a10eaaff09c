"""The three GEMMs of a Linear and each one's two operands: the one list every other module
takes its names from.

| GEMM        | product      | operands (recipe) | LinearConfig fields           |
|-------------|--------------|-------------------|-------------------------------|
| forward     | Y = X W^T    | x, w              | forward_x, forward_w          |
| grad_input  | dX = dY W    | dy, w             | grad_input_dy, grad_input_w   |
| grad_weight | dW = dY^T X  | dy, x             | grad_weight_dy, grad_weight_x |
"""

from __future__ import annotations

# GEMM -> its two operands, as recipes name them
GEMM_OPERANDS = {"forward": ("x", "w"), "grad_input": ("dy", "w"), "grad_weight": ("dy", "x")}
GEMMS = tuple(GEMM_OPERANDS)
# GEMM -> its two operands as LinearConfig fields: "forward" -> ("forward_x", "forward_w")
GEMM_OPERAND_FIELDS = {
    gemm: (f"{gemm}_{operands[0]}", f"{gemm}_{operands[1]}")
    for gemm, operands in GEMM_OPERANDS.items()
}
OPERANDS = tuple(field for fields in GEMM_OPERAND_FIELDS.values() for field in fields)
