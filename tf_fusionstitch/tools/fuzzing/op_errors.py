"""Each op's documented error beyond the rounding of its result (`ERR` and
the special bounds below it), and the float64 reference functions of the
unary float ops that the oracle evaluates at the corners of a box.
"""

from __future__ import annotations

import math

import numpy as np

from tf_fusionstitch.tools.fuzzing.intervals import f64
from tf_fusionstitch.tools.fuzzing.ops import SELU_ALPHA, SELU_SCALE


# Error of one op's implementation, beyond the rounding of its result to the
# output type (which the outward rounding accounts for), as
# (units of roundoff u of the compute type, relative; u of the output type,
#  relative; u of the output type, absolute); u = 2^-24 for float32 (half an
# ulp). An enclosure is widened by these once: it must hold TF's result and
# ours, each within that much of the exact value. The numbers are the larger
# of our documented bounds (vecmath.ULP_BOUNDS: exp/log 2 ulp, tanh/erf 3,
# erfc 4; float64 uses std::) and TF's own error, measured over 5e5 points
# per op and dtype against float64/libm (max seen, in u, float32 / float64):
#   exp 2/2.8, expm1 5/4, log 3.3/2, log1p 4.6/4, tanh 5.6/9, sigmoid 8/4,
#   erf 6/4, erfc 11/12 (66/516 within 2^40 of the smallest normal, below),
#   softplus 7.7/7.8, sin 2.2, cos 2.7, rsqrt 2.9, reciprocal 3.4 (TF's float
#   reciprocal is not correctly rounded), pow 2/3; div, mul, sqrt exact.
# float16/bfloat16: TF rounds every op to the dtype, so only its composite
# kernels add error in units of the dtype: sigmoid 2.5 u, softplus 7.6 u, rsqrt
# 2 u (1/sqrt, rounded twice).
# - softplus: TF switches to x above -log(eps)-2 and to exp(x) below
#   log(eps)+2; those approximations are off by up to e^(log(eps)+2)/2 ~ 7.4 u.
# - elu/selu: TF and we compute exp(x) - 1 (not expm1), so for x < 0 the
#   error is absolute: ~1 u of 1 from the subtraction plus the exp's error
#   (float16/bfloat16: TF rounds exp(x) to the dtype first): 3 u absolute,
#   times selu's scale*alpha.
# - selu: TF rounds scale and scale*alpha to the dtype (bfloat16: 1.0507 becomes
#   1.0469): 2 u of the dtype for float16/bfloat16.
# - sin/cos: argument reduction errors are absolute (Lipschitz 1): 4 u
#   absolute on top of 4 u relative.
ERR = {
    "RealDiv": (1, 2, 0), "Div": (1, 2, 0), "Sqrt": (1, 0, 0), "DivNoNan": (1, 0, 0),
    "FloorDiv": (1, 0, 0), "Reciprocal": (4, 0, 0), "Rsqrt": (4, 2, 0),
    "Exp": (6, 0, 0), "Expm1": (8, 0, 0), "Log": (6, 0, 0), "Log1p": (8, 0, 0),
    "Tanh": (12, 0, 0), "Sigmoid": (12, 4, 0), "Erf": (8, 0, 0), "Erfc": (16, 0, 0),
    "Softplus": (10, 10, 0), "Elu": (8, 0, 3), "Selu": (8, 2, 3 * SELU_ALPHA * SELU_SCALE),
    "Sin": (4, 0, 0), "Cos": (4, 0, 0), "Pow": (6, 2, 0),
}
# x / c: Grappler's constant folding makes it x * (1 / c) with 1 / c rounded to
# the dtype (float16/bfloat16: 2 u of the dtype; measured: a third of the
# float16 quotients by 3 differ from x / 3; float32/float64: grappler_rewrites
# rewrites it so, measured equal to TF's in every element).
# pow: Grappler rewrites x**2, x**3, ... with a constant exponent into products,
# rounded in the dtype by TF (float16/bfloat16: two roundings, 2 u of the dtype).
# TF's erfc near underflow (result below 2^40 smallest normals): 66 u (float32),
# 516 u (float64) measured.
ERFC_TAIL = {"float32": 100, "float64": 800}
RCP_EST_ERR = 1.5 * 2.0 ** -12      # relative error of x86 rcp_ps (see Reciprocal)
SIN_COS_ABS_ULPS = 4


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x) if np.size(x) else f64(x)


def _erfc(x):
    return np.vectorize(math.erfc, otypes=[np.float64])(x) if np.size(x) else f64(x)


def sigmoid(x):
    with np.errstate(all="ignore"):
        e = np.exp(-np.abs(x))
        return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


def _relu(x):
    return np.where(x < 0, 0.0, x)     # NaN stays NaN


# after widening, bounded transcendental functions are clamped to their range
# (relu/relu6 need no clamp, they add no error; a clamp would cut off denormals
# they pass through)
RANGE = {"Sigmoid": (0.0, 1.0), "Tanh": (-1.0, 1.0), "Erf": (-1.0, 1.0), "Erfc": (0.0, 2.0)}

FLOAT_UNARY = {   # monotone (corners suffice) unless listed in _SPECIAL_UNARY
    "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Log1p": np.log1p, "Expm1": np.expm1,
    "Sqrt": np.sqrt, "Tanh": np.tanh, "Sigmoid": sigmoid, "Erf": _erf, "Erfc": _erfc,
    "Softplus": lambda x: np.logaddexp(0.0, x),
    "Relu": _relu, "Relu6": lambda x: np.where(x > 6, 6.0, _relu(x)),
    "Elu": lambda x: np.where(x < 0, np.expm1(x), x),
    "Selu": lambda x: SELU_SCALE * np.where(x < 0, SELU_ALPHA * np.expm1(x), x),
    "Floor": np.floor, "Ceil": np.ceil, "Round": np.rint, "Sign": np.sign,
    "Abs": np.abs, "Square": np.square, "Reciprocal": lambda x: 1.0 / x,
    "Rsqrt": lambda x: 1.0 / np.sqrt(x),
}
