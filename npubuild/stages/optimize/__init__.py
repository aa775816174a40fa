"""The optimize stage: hardware-agnostic graph passes run to a fixpoint, then a numeric check.

PASS_NAMES is kept here, free of onnx imports, so BUILD validation can check `optimize.disable`
without loading the passes.
"""

PASS_NAMES = (
    "dequantize_qoperator",  # first: QLinear ops become Q/DQ pairs that absorb_qdq reads
    "absorb_qdq",  # first: a Q/DQ pair on a constant must not be folded into it before it is read
    "constants_to_initializers",
    "fold_shapes",
    "fold_constants",
    "remove_noops",
    "sum_to_add",
    "decompose_lrn",
    "fuse_layernorm",
    "fuse_gelu",
    "fold_batchnorm",
    "batchnorm_to_affine",
    "merge_untouched_axes",
    "squeeze_unit_axes",
    "conv1d_as_2d",
    "unit_transposes_as_reshapes",
    "transposes_through_elementwise",
    "clamps_before_moves",
    "pools_before_widening_convs",
    "softmax_to_last_axis",
    "linear_resize_as_matmuls",
    "fold_scale_into_conv",
    "matmul_bias_as_gemm",
    "cancel_transpose_reshape",
    "fuse_silu",
    "fuse_hardswish",
    "merge_affines",  # after the fusions: HardSwish's division by 6 must be there to be seen
    "eliminate_common_subexpressions",
    "eliminate_dead_code",
)
