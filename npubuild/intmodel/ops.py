"""Which ONNX ops have an integer rule, and which only move integers around."""

from __future__ import annotations

# Ops that only rearrange or select values: the output keeps the input's scale and zero point.
MOVE_OPS = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Split", "Slice", "MaxPool"}
# Unary functions computed by a lookup table from the input's integer value.
LUT_OPS = {"Sigmoid", "HardSigmoid", "HardSwish", "SiLU", "Tanh"}
# More element-wise functions of one tensor (any other inputs constant), tabulated by evaluating
# the node itself on every input code: GELU (npubuild's fused form and ONNX's Gelu), Pow by a
# constant, the reciprocal of a tensor (Div of a constant by it), and the rest of ONNX's unary math.
TABULATED_OPS = {
    "GELU", "Gelu", "Erf", "Exp", "Log", "Sqrt", "Reciprocal", "Pow", "Softplus", "Softsign",
    "Elu", "Selu", "Celu", "LeakyRelu", "ThresholdedRelu", "Mish", "Abs", "Neg", "Sin", "Cos",
    "Atan",
}  # fmt: skip
# Ops that reduce along the last axis, computed row by row (rowwise.py); LayerNorm is the fused form.
ROW_OPS = {"Softmax", "LayerNormalization", "LayerNorm"}
# Ops whose work is multiply-accumulates on the MAC array (and whose weights are per-channel int8).
MAC_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}
OTHER_INTEGER = {"Concat", "GlobalAveragePool", "AveragePool", "Resize", "Relu", "Clip"}
INTEGER_OPS = MOVE_OPS | LUT_OPS | TABULATED_OPS | ROW_OPS | MAC_OPS | ELEMENTWISE | OTHER_INTEGER
# Moves that change only the shape, not the bytes: free views of their input on the NPU.
ALIASES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
