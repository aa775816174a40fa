# Starlark macros the example's BUILD files load (load("//tools:defs.bzl", "image_sets")).

def image_sets(name, calibration, evaluation, preprocess):
    """Two data sets of one model's preprocessing: NAME_calib from the calibration photos and
    NAME_eval from the disjoint evaluation photos."""
    dataset(name = name + "_calib", srcs = calibration, preprocess = preprocess)
    dataset(name = name + "_eval", srcs = evaluation, preprocess = preprocess)
