"""Which ONNX ops have an integer rule, and which only move integers around."""

from __future__ import annotations

# Ops that only rearrange or select values: the output keeps the input's scale and zero point.
MOVE_OPS = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Split", "Slice", "MaxPool"}
# Unary functions computed by a lookup table from the input's integer value.
LUT_OPS = {"Sigmoid", "HardSigmoid", "HardSwish", "SiLU", "Tanh"}
# Ops whose work is multiply-accumulates on the MAC array (and whose weights are per-channel int8).
MAC_OPS = {"Conv", "ConvTranspose", "MatMul", "Gemm"}
ELEMENTWISE = {"Add", "Sub", "Mul", "Div"}
OTHER_INTEGER = {"Concat", "GlobalAveragePool", "AveragePool", "Resize", "Relu", "Clip"}
INTEGER_OPS = MOVE_OPS | LUT_OPS | MAC_OPS | ELEMENTWISE | OTHER_INTEGER
# Moves that change only the shape, not the bytes: free views of their input on the NPU.
ALIASES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")
