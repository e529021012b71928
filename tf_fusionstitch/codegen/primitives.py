"""Facts about primitives and dtypes that every printer and cost model uses,
written once: the C++ and CUDA printers (printer.py, gpu_printer.py),
scatter.py, the shape functions' cost (shape_fn.py), the GPU mapping
(gpu/mapping.py) and the GPU cost model (gpu/cost.py) import them.

Values compute in a *compute dtype*: 16-bit floats in float32 (stored in
their own type, rounded where TensorFlow would round); every other dtype in
itself. A reduction accumulates in its *accumulator dtype*. No TensorFlow
import here.
"""

from __future__ import annotations

from tf_fusionstitch.fusion_ir import CONSTANT, DTYPE_BYTES, DTYPES, FLOAT_DTYPES, MOVE, SHAPE_ONLY

# Floats stored in 16 bits and computed in float32.
HALF_DTYPES = ("float16", "bfloat16")

COMPUTE_DTYPE = {d: "float32" if d in HALF_DTYPES else d for d in DTYPES}
# Bytes, and 32-bit registers, of a value in its compute dtype.
COMPUTE_BYTES = {d: DTYPE_BYTES[COMPUTE_DTYPE[d]] for d in DTYPES}
COMPUTE_WORDS = {d: max(1, COMPUTE_BYTES[d] // 4) for d in DTYPES}

# Primitives that do no arithmetic in a kernel: a constant is an immediate,
# the others only change how the tensors' strides index the same elements.
FREE = frozenset(SHAPE_ONLY + MOVE + CONSTANT)

# Reductions that accumulate a truth value (in an int: 0 or 1).
FLAG_REDUCTIONS = ("reduce_any", "reduce_all")
# Reductions whose comparisons would drop a NaN: a floating one keeps an int
# flag beside its accumulator (n_<acc>), set by any NaN operand, and its
# result is NaN where the flag is set.
NAN_REDUCTIONS = ("reduce_max", "reduce_min")


def tracks_nan(st) -> bool:
    """Does the reduction `st` (a kernel-IR Accumulate or Finish) keep a NaN flag?"""
    return st.kind in NAN_REDUCTIONS and st.dtype in FLOAT_DTYPES


def accumulator_dtype(kind: str, dtype: str) -> str:
    """The dtype a `kind` reduction of `dtype` values accumulates in."""
    if kind in FLAG_REDUCTIONS:
        return "int32"
    if kind == "reduce_mean" and dtype == "int32":
        return "int64"  # TF's int32 mean does not wrap in its sum
    return COMPUTE_DTYPE[dtype]


def accumulator_bytes(st) -> int:
    """Bytes of the accumulator of the reduction `st` (Accumulate or Finish)."""
    return DTYPE_BYTES[accumulator_dtype(st.kind, st.dtype)]
