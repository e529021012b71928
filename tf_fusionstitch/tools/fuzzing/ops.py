"""The vocabulary of a case: its dtypes, the ops the generator draws from
(with the dtypes TensorFlow's CPU kernels accept for each), the case format's
version, and the error raised for a case that is not a valid graph.
"""

from __future__ import annotations


FLOATS = ("float32", "float64", "float16", "bfloat16")
INTS = ("int32", "int64")
DTYPES = FLOATS + INTS + ("bool",)
F, FI, FIB, B = FLOATS, FLOATS + INTS, FLOATS + INTS + ("bool",), ("bool",)

CASE_VERSION = 1


# The ops the generator draws from: the op table's TF ops, with the dtypes
# TensorFlow's CPU kernels accept for them (those fused and a few left to TF,
# e.g. integer division, so that fused and unfused ops mix).
UNARY_OPS = {
    "Neg": FI, "Abs": FI, "Square": FI, "Sign": FI, "Relu": FI, "Relu6": F,
    "Exp": F, "Log": F, "Log1p": F, "Expm1": F, "Sqrt": F, "Rsqrt": F, "Reciprocal": F,
    "Tanh": F, "Sigmoid": F, "Elu": F, "Selu": F, "Softplus": F, "Erf": F, "Erfc": F,
    "Sin": F, "Cos": F, "Floor": F, "Ceil": F, "Round": F, "IsFinite": F, "IsNan": F,
    "LogicalNot": B,
}
FEATURES_ARG = {"Relu", "Relu6", "Elu", "Selu", "Softplus"}
BINARY_OPS = {
    "AddV2": FI, "Add": FI, "Sub": FI, "Mul": FI, "RealDiv": F, "Div": FI, "DivNoNan": F,
    "Maximum": FI, "Minimum": FI, "Pow": F, "SquaredDifference": FI, "FloorDiv": FI,
    "FloorMod": FI, "Less": FI, "Greater": FI, "LessEqual": FI, "GreaterEqual": FI,
    "Equal": FIB, "NotEqual": FIB, "LogicalAnd": B, "LogicalOr": B,
}
COMPARISONS = ("Less", "Greater", "LessEqual", "GreaterEqual", "Equal", "NotEqual")
REDUCE_OPS = {"Sum": FI, "Mean": FI, "Max": FI, "Min": FI, "Prod": FI, "Any": B, "All": B}


SELU_SCALE = 1.0507009873554804934193349852946
SELU_ALPHA = 1.6732632423543772848170429916717


class CaseError(ValueError):
    """The case does not describe a valid graph (shapes, dtypes, attributes)."""
