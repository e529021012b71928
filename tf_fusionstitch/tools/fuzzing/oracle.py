"""The oracle: the enclosure of every value of a case (`evaluate`).

Every output is checked against an *enclosure* computed by `evaluate`: interval
arithmetic in float64 over the same DAG, starting from the exact input values.
For every value it gives [lo, hi] (floats), an exact value (integers), or a
{0, 1} interval (booleans), that contains what ANY implementation conforming
to docs/DESIGN.md, "Numerics" may return: each primitive is evaluated at the
corners of its input box (every op here is monotone in each argument, or is
handled by a rule of its own below), then widened by that op's documented error
(`op_errors.ERR`: a few ulps for transcendental functions, none for correctly rounded
arithmetic) and rounded *outward* to the dtype's grid. Consequences:

- integers and booleans are exact wherever the value is determined;
- an ill-conditioned value (a float16 cancellation, a floor of a value that
  sits on an integer within its error, a comparison of nearly equal values)
  gets a wide interval, or becomes undetermined, because the interval of its
  inputs straddles the cancellation or the discontinuity. This is a derived
  bound: it never loosens a well-conditioned value;
- a NaN must be NaN exactly where every conforming implementation gives NaN;
  where a NaN depends on rounding (inf - inf after a possible overflow) the
  element is undetermined and skipped;
- TensorFlow's own result is checked against the same enclosure. If TF falls
  outside, the *oracle* is wrong (or TF differs from the documented
  semantics): that is reported as an oracle problem, not as a compiler bug.
  So the rules below are validated on every run against TF itself.

Rules that are semantic choices, not arithmetic, are commented where they are
made (`op_errors`, `_Oracle`): denormals (TF runs with FTZ/DAZ), float-to-int casts
of NaN/Inf/out-of-range values (undefined in C++), softmax rows holding +Inf or
NaN (TF's Eigen and oneDNN kernels disagree), signs of zero (not compared),
TF's float64 erf beyond sqrt(DBL_MAX) (NaN in TF), reduction orders (partial
sums and products that may overflow or underflow). Grappler rewrites that TF
and optimize() both apply and that change results (pow by a constant, max of a
monotone function, log of softmax, not of a comparison, 1/(1/x), x / c as
x * (1/c), reassociated sums and products: the union over their possible
orders) are applied to the oracle's graph first (`grappler_model`,
`_Oracle.monotone_hoist`).
"""

from __future__ import annotations

import math
import warnings
from typing import Dict, List, Optional, Sequence

import numpy as np

from tf_fusionstitch.tools.fuzzing.case_types import norm_axes
from tf_fusionstitch.tools.fuzzing.grappler_model import count_consumers, grappler_rewrites
from tf_fusionstitch.tools.fuzzing.intervals import (COMPUTE, Iv, TINY, U, bool_iv, corners,
                                                     denormal_endpoint, finish, holds, input_iv,
                                                     int_iv, is_exact, max_finite, minmax_corners,
                                                     round_out, widen, with_passthrough)
from tf_fusionstitch.tools.fuzzing.np_dtypes import np_dtype
from tf_fusionstitch.tools.fuzzing.op_errors import (ERFC_TAIL, ERR, FLOAT_UNARY, RANGE,
                                                     RCP_EST_ERR, SIN_COS_ABS_ULPS, sigmoid)
from tf_fusionstitch.tools.fuzzing.ops import (BINARY_OPS, COMPARISONS, CaseError, INTS, REDUCE_OPS,
                                               UNARY_OPS)


# grappler::IsElementWiseMonotonic (op-table ops only)
_MONOTONE_UP = ("Ceil", "Elu", "Erf", "Exp", "Expm1", "Floor", "Log", "Log1p", "Relu", "Relu6",
                "Selu", "Sigmoid", "Sign", "Softplus", "Sqrt", "Tanh")
_MONOTONE_DOWN = ("Erfc", "Neg", "Rsqrt")


class _Oracle:
    """Evaluates a case's enclosures for one draw of inputs."""

    def __init__(self, case, inputs: Sequence[np.ndarray]):
        self.case = case
        self.env: Dict[str, Iv] = {}
        for inp, v in zip(case["inputs"], inputs):
            self.env[inp["name"]] = input_iv(inp["dtype"], v)

    def run(self) -> Dict[str, Iv]:
        nodes = grappler_rewrites(self.case)
        self.nodes = {n["name"]: n for n in nodes}
        self.consumers = count_consumers(nodes, self.case["outputs"])
        for node in nodes:
            if node["op"] in ("Max", "Min"):
                hoisted = self.monotone_hoist(node)
                if hoisted is not None:
                    self.env[node["name"]] = hoisted
                    continue
            ins = []
            for k, ref in enumerate(node["inputs"]):
                if isinstance(ref, str):
                    ins.append(self.env[ref])
                else:
                    other = next(self.env[r] for r in node["inputs"] if isinstance(r, str))
                    c = np.array(ref["const"], dtype=np_dtype(other.dtype))
                    ins.append(input_iv(other.dtype, c))
            self.env[node["name"]] = self.apply(node, ins)
        return self.env

    def monotone_hoist(self, node) -> Optional[Iv]:
        """Grappler's arithmetic optimizer (which TF and optimize() both run)
        rewrites max(f(x)) to f(max(x)) (min for a decreasing f) when f is
        elementwise monotone and the reduction is f's only consumer
        (OptimizeMaxOrMinOfMonotonicStage), repeatedly down a chain. This changes
        NaN propagation (max(sqrt(x)) with some x < 0), so the oracle follows it."""
        chain, src, op = [], node["inputs"][0], node["op"]
        while isinstance(src, str) and src in self.nodes and self.consumers.get(src) == 1:
            inner = self.nodes[src]
            if inner["op"] in _MONOTONE_UP:
                flip = False
            elif inner["op"] in _MONOTONE_DOWN:
                flip = True
            else:
                break
            producer = self.nodes.get(inner["inputs"][0]) if isinstance(
                inner["inputs"][0], str) else None
            if inner["op"] in ("Relu", "Relu6") and producer is not None and \
                    producer["op"] == "BiasAdd":
                break                       # left for the remapper to fuse
            chain.append(inner["op"])
            if flip:
                op = "Min" if op == "Max" else "Max"
            src = inner["inputs"][0]
        if not chain:
            return None
        a = node.get("attrs", {})
        v = self.reduce(op, self.env[src], a["axis"], bool(a["keep_dims"]))
        for f in reversed(chain):
            v = self.unary(f, v)
        return v

    # -- dispatch ----------------------------------------------------------
    def apply(self, node, ins: List[Iv]) -> Iv:
        op, a = node["op"], node.get("attrs", {})
        d = ins[0].dtype
        if op in UNARY_OPS:
            return self.unary(op, ins[0])
        if op in BINARY_OPS:
            return self.binary(op, ins[0], ins[1])
        if op == "Select":
            c = ins[0]
            x = ins[1]
            if c.lo.ndim == 1 and x.lo.ndim > 1:
                shape = c.lo.shape + (1,) * (x.lo.ndim - 1)
                c = Iv("bool", c.lo.reshape(shape), c.hi.reshape(shape), c.unk.reshape(shape))
            return self.select(c, x, ins[2])
        if op == "SelectV2":
            return self.select(*ins)
        if op in REDUCE_OPS:
            return self.reduce(op, ins[0], a["axis"], bool(a["keep_dims"]))
        if op in ("Softmax", "LogSoftmax"):
            return self.softmax(ins[0], op == "LogSoftmax")
        if op == "BiasAdd":
            b = ins[1]
            if a.get("data_format") == "NCHW":
                shape = b.lo.shape + (1,) * (ins[0].lo.ndim - 2)
                b = Iv(b.dtype, b.lo.reshape(shape), b.hi.reshape(shape), b.unk.reshape(shape))
            return self.binary("AddV2", ins[0], b)
        if op == "Cast":
            return self.cast(ins[0], a["to"])
        if op == "LeakyRelu":   # x > 0 ? x : alpha * x, increasing for alpha >= 0
            alpha = a["alpha"]
            lo, hi, unk = corners(lambda t: np.where(t > 0, t, alpha * t), [ins[0]])
            return finish(d, lo, hi, unk)
        if op == "Hull":        # one of several results (grappler_rewrites): their union
            either = bool_iv(np.zeros(ins[0].shape), np.ones(ins[0].shape))
            v = ins[0]
            for w in ins[1:]:
                v = self.select(either, v, w)
            return v
        x = ins[0]
        if op == "Identity":
            return x
        if op == "Reshape":
            shape = tuple(a["shape"])
        elif op == "ExpandDims":
            ax = a["axis"] % (x.lo.ndim + 1)
            shape = x.shape[:ax] + (1,) + x.shape[ax:]
        elif op == "Squeeze":
            axes = norm_axes(a["axis"], x.lo.ndim)
            shape = tuple(e for i, e in enumerate(x.shape) if i not in axes)
        elif op == "BroadcastTo":
            shape = tuple(a["shape"])
            return Iv(d, np.broadcast_to(x.lo, shape).copy(), np.broadcast_to(x.hi, shape).copy(),
                      np.broadcast_to(x.unk, shape).copy())
        elif op == "Transpose":
            perm = list(a["perm"])
            return Iv(d, x.lo.transpose(perm), x.hi.transpose(perm), x.unk.transpose(perm))
        else:
            raise CaseError(f"oracle: unknown op {op}")
        return Iv(d, x.lo.reshape(shape), x.hi.reshape(shape), x.unk.reshape(shape))

    # -- elementwise -------------------------------------------------------
    def unary(self, op, x: Iv) -> Iv:
        d = x.dtype
        if op == "LogicalNot":
            return bool_iv(1 - x.hi, 1 - x.lo)
        if d in INTS:
            v = x.lo.astype(d)
            with np.errstate(all="ignore"):
                f = {"Neg": np.negative, "Abs": np.abs, "Square": np.square, "Sign": np.sign,
                     "Relu": lambda t: np.maximum(t, 0)}[op]
                return int_iv(d, f(v).astype(d), x.unk)
        if op == "IsNan":
            nan = np.isnan(x.lo) & ~x.unk
            return bool_iv(nan, nan | x.unk)
        if op == "IsFinite":
            fin = ~x.unk & np.isfinite(x.lo) & np.isfinite(x.hi)
            never = ~x.unk & (np.isnan(x.lo) | ((x.lo == x.hi) & np.isinf(x.lo)))
            return bool_iv(fin, ~never)
        if op in ("Sin", "Cos"):
            # Lipschitz 1: [f(c) - w, f(c) + w] around the interval's centre.
            f = np.sin if op == "Sin" else np.cos
            with np.errstate(all="ignore"):
                c = 0.5 * x.lo + 0.5 * x.hi
                w = 0.5 * x.hi - 0.5 * x.lo
                fc = f(c)
                lo = np.maximum(fc - w, -1.0)
                hi = np.minimum(fc + w, 1.0)
                lo = np.where(w == 0, fc, lo)
                hi = np.where(w == 0, fc, hi)
            unk = x.unk | (np.isinf(x.lo) | np.isinf(x.hi)) & (x.lo != x.hi)
            return finish(d, lo, hi, unk, ERR[op],
                           absolute=SIN_COS_ABS_ULPS * U[COMPUTE[d]])
        if op == "Erf" and d == "float64":
            # TF's Eigen erf<double> squares x and returns NaN once x*x overflows
            # (|x| > sqrt(DBL_MAX), infinities included); std::erf gives +-1. A TF
            # defect: either answer is accepted there.
            big = np.sqrt(np.finfo(np.float64).max)
            x = Iv(d, x.lo, x.hi, x.unk | (np.abs(x.lo) > big) | (np.abs(x.hi) > big))
        fn = FLOAT_UNARY[op]
        extra = ()
        straddle = (x.lo < 0) & (x.hi > 0) | ((x.lo == 0) & (x.hi > 0) & np.signbit(x.lo)) | \
            ((x.hi == 0) & (x.lo < 0) & ~np.signbit(x.hi))
        if op in ("Abs", "Square"):
            extra = [(np.where(straddle, 0.0, x.lo),)]       # the minimum inside
        lo, hi, unk = corners(fn, [x], extra)
        if op in ("Relu", "Relu6"):
            lo, hi = with_passthrough(lo, hi, x)
        if op == "Sign":
            # TF's Sign of a denormal returns a denormal (of either sign, seen);
            # denormals are not part of the contract: allow +-smallest normal there.
            den = ~np.isnan(denormal_endpoint(x))
            lo = np.where(den, np.fmin(lo, -TINY[d]), lo)
            hi = np.where(den, np.fmax(hi, TINY[d]), hi)
        if op in ("Reciprocal", "Rsqrt"):
            # a pole inside the interval: anything from -inf to inf
            unk = unk | (straddle & (x.lo != x.hi))
        absolute = 0.0
        if op == "Erfc":
            c = COMPUTE[d]
            tail = np.abs(lo) < TINY[c] * 2.0 ** 40
            absolute = np.where(tail, ERFC_TAIL[c] * U[c] * np.abs(hi), 0.0)
        if op == "Reciprocal" and COMPUTE[d] == "float32":
            # TF's vectorised float reciprocal (Eigen preciprocal: rcp_ps estimate
            # plus one Newton step) loses the Newton correction to FTZ when that
            # correction is below the smallest normal: up to FLT_MIN absolute, and
            # never more than the estimate's own error, 1.5 * 2^-12 relative
            # (Intel's bound; measured over 4e6 points in 2^[90, 126]: error <=
            # 3.4 u + min(FLT_MIN, 2^-11.6 |1/x|), relative error up to 5.3e3 u
            # for |1/x| < 2^-113). Tails of a tensor not filling a packet divide.
            with np.errstate(all="ignore"):
                mag = np.fmax(np.abs(lo), np.abs(hi))
                absolute = np.fmin(TINY["float32"], RCP_EST_ERR * mag)
        iv = finish(d, lo, hi, unk, ERR.get(op, (0, 0, 0)), absolute=absolute)
        if op in RANGE:      # bounded functions stay in their range after widening
            a, b = RANGE[op]
            iv.lo = np.where(iv.unk, iv.lo, np.clip(iv.lo, a, b))
            iv.hi = np.where(iv.unk, iv.hi, np.clip(iv.hi, a, b))
        return iv

    def binary(self, op, x: Iv, y: Iv) -> Iv:
        d = x.dtype
        if op in ("LogicalAnd", "LogicalOr"):
            f = np.minimum if op == "LogicalAnd" else np.maximum
            return bool_iv(f(x.lo, y.lo), f(x.hi, y.hi))
        if op in COMPARISONS:
            return self.compare(op, x, y)
        if d in INTS:
            return self.int_binary(op, x, y)
        if op == "Add":
            op = "AddV2"
        if op == "SquaredDifference":
            # TF rounds x - y to the dtype, then squares (test_optimize_ops).
            return self.unary("Square", self.binary("Sub", x, y))
        if op == "FloorDiv":
            # floor(x / y) with the quotient rounded first, as TF computes it
            q = self.binary("RealDiv", x, y)
            return self.unary("Floor", q)
        if op == "FloorMod":
            return self.floor_mod(x, y)
        if op == "Pow":
            return self.pow(x, y)
        fn = {"AddV2": np.add, "Sub": np.subtract, "Mul": np.multiply,
              "RealDiv": np.divide, "Div": np.divide, "DivNoNan": np.divide,
              "Maximum": np.maximum, "Minimum": np.minimum}[op]
        lo, hi, unk = corners(fn, [x, y])
        # NaN from inside the box, where corners do not see it: 0 * inf, 0 / 0, inf / inf
        shape = lo.shape
        zx, zy = holds(x, 0.0), holds(y, 0.0)
        ix = np.isinf(x.lo) | np.isinf(x.hi)
        iy = np.isinf(y.lo) | np.isinf(y.hi)
        if op == "Mul":
            unk = unk | np.broadcast_to((zx & iy) | (ix & zy), shape)
        elif op in ("RealDiv", "Div"):
            unk = unk | np.broadcast_to((zx & zy & ~(is_exact(x) & is_exact(y))) | (ix & iy), shape)
        if op in ("Maximum", "Minimum"):
            lo, hi = with_passthrough(lo, hi, x, y)
            # max/min of +0 and -0 may return either (TF: max(-0, 0) = -0,
            # and rsqrt of it -inf: --seed=20261130 graph 3435)
            both = np.broadcast_to(holds(x, 0.0) & holds(y, 0.0), lo.shape)
            lo = np.where(both & (lo == 0), -0.0, lo)
            hi = np.where(both & (hi == 0), 0.0, hi)
        if op in ("RealDiv", "Div", "DivNoNan"):
            ystr = ((y.lo < 0) | ((y.lo == 0) & np.signbit(y.lo))) & (
                (y.hi > 0) | ((y.hi == 0) & ~np.signbit(y.hi)))
            ystr = ystr & (y.lo != y.hi) | (np.signbit(y.lo) != np.signbit(y.hi))
            unk = unk | ystr            # the divisor's interval holds a pole
            if op == "DivNoNan":
                # y == 0 gives 0 (whatever x is): exact zero divisors give 0, an
                # interval touching 0 (e.g. a denormal under DAZ) is undetermined
                zero = (y.lo == 0) & (y.hi == 0) & ~y.unk
                touch = (y.lo <= 0) & (y.hi >= 0)
                lo = np.where(zero, 0.0, lo)
                hi = np.where(zero, 0.0, hi)
                unk = np.where(zero, np.broadcast_to(y.unk, lo.shape), unk | touch)
        return finish(d, lo, hi, unk, ERR.get(op, (0, 0, 0)))

    def pow(self, x: Iv, y: Iv) -> Iv:
        """x**y: monotone in each argument where x >= 0. For x < 0 only an exact
        integer exponent is defined (corners plus 0 for even powers); otherwise NaN
        or undetermined."""
        d = x.dtype
        shape = np.broadcast_shapes(x.shape, y.shape)
        xlo, xhi = np.broadcast_to(x.lo, shape), np.broadcast_to(x.hi, shape)
        ylo, yhi = np.broadcast_to(y.lo, shape), np.broadcast_to(y.hi, shape)
        zero = np.where((xlo < 0) & (xhi > 0), 0.0, xlo)     # even powers: minimum inside
        lo, hi, unk = corners(np.power, [x, y], [(zero, ylo), (zero, yhi)])
        neg = (xlo < 0) | ((xlo == 0) & np.signbit(xlo) & (xhi != xlo))
        y_int = (ylo == yhi) & (np.floor(ylo) == ylo)
        y_no_int = np.floor(ylo) == np.floor(yhi)
        y_no_int = y_no_int & (np.floor(ylo) != ylo) & np.isfinite(ylo)
        # (pow(-inf, y) is +-inf or 0 in C, not NaN)
        nan_certain = neg & (xhi < 0) & (xlo > -np.inf) & y_no_int
        # pow(1, NaN) = pow(NaN, 0) = 1: an interval holding 1 (or 0) with a NaN partner
        with np.errstate(invalid="ignore"):
            one_nan = (((xlo <= 1) & (1 <= xhi) & np.isnan(ylo)) |
                       ((ylo <= 0) & (0 <= yhi) & np.isnan(xlo)))
        unk = unk | (one_nan & ~(np.broadcast_to(is_exact(x), shape) &
                                 np.broadcast_to(is_exact(y), shape)))
        minus_inf = (xlo == -np.inf) & (xhi == -np.inf)
        unk = unk | (neg & ~y_int & ~nan_certain & ~minus_inf)
        lo = np.where(nan_certain, np.nan, lo)
        hi = np.where(nan_certain, np.nan, hi)
        return finish(d, lo, hi, unk & ~nan_certain, ERR["Pow"])

    def floor_mod(self, x: Iv, y: Iv) -> Iv:
        """TF: r = fmod(x, y); r != 0 and sign(r) != sign(y) ? r + y : r.
        Exact inputs: that formula (fmod is exact, the + y rounds). Otherwise,
        where the quotient's floor is the same over the box, x - q*y, linear."""
        d = x.dtype
        shape = np.broadcast_shapes(x.shape, y.shape)
        with np.errstate(all="ignore"):
            xl, yl = np.broadcast_to(x.lo, shape), np.broadcast_to(y.lo, shape)
            r = np.fmod(xl, yl)
            exact_val = np.where((r != 0) & ((yl < 0) != (r < 0)), r + yl, r)
            q = self.binary("RealDiv", x, y)
            ql, qh = np.floor(q.lo), np.floor(q.hi)
            same_q = ~q.unk & (ql == qh) & np.isfinite(ql)
            qv = np.where(same_q, ql, 0.0)
            lin_lo, lin_hi, lin_unk = corners(lambda a, b: a - qv * b, [x, y])
        exact = is_exact(x) & is_exact(y)
        exact = np.broadcast_to(exact, shape)
        # with an infinite operand the result jumps (fmod(x, inf) = x, then + inf
        # when x < 0): only exact operands are determined there
        infinite = np.broadcast_to(~np.isfinite(x.lo) | ~np.isfinite(x.hi), shape) | \
            np.broadcast_to(~np.isfinite(y.lo) | ~np.isfinite(y.hi), shape)
        lo = np.where(exact, exact_val, lin_lo)
        hi = np.where(exact, exact_val, lin_hi)
        unk = np.where(exact, np.broadcast_to(x.unk | y.unk, shape),
                       lin_unk | ~same_q | infinite)
        absolute = 0.0
        if d == "float64":
            # the oracle's own x - q*y in float64 rounds q*y (not exact for float64
            # operands): up to an ulp of q*y, many ulps of a cancelling result
            # (--seed=20261129 graph 10154: -1 mod 0.197, 4 ulps)
            with np.errstate(all="ignore"):
                qy = np.abs(qv) * np.maximum(np.abs(y.lo), np.abs(y.hi))
            absolute = np.where(exact | ~np.isfinite(qy), 0.0, 2 * U[d] * qy)
        return finish(d, lo, hi, unk, (1, 0, 0), absolute=absolute)

    def int_binary(self, op, x: Iv, y: Iv) -> Iv:
        d = x.dtype
        a, b = x.lo.astype(d), y.lo.astype(d)
        unk = x.unk | y.unk
        with np.errstate(all="ignore"):
            if op in ("AddV2", "Add"):
                v = a + b
            elif op == "Sub":
                v = a - b
            elif op == "Mul":
                v = a * b
            elif op == "Maximum":
                v = np.maximum(a, b)
            elif op == "Minimum":
                v = np.minimum(a, b)
            elif op == "SquaredDifference":
                v = (a - b) * (a - b)
            elif op == "FloorDiv":
                v = np.floor_divide(a, np.where(b == 0, 1, b))
            elif op == "FloorMod":
                v = np.mod(a, np.where(b == 0, 1, b))
            elif op == "Div":                     # C++ integer division truncates
                bb = np.where(b == 0, 1, b)
                q = np.floor_divide(a, bb)
                v = np.where((q * bb != a) & ((a < 0) != (bb < 0)), q + 1, q)
            else:
                raise CaseError(f"oracle: {op} on integers")
        return int_iv(d, np.asarray(v).astype(d), unk)

    def compare(self, op, x: Iv, y: Iv) -> Iv:
        shape = np.broadcast_shapes(x.shape, y.shape)
        unk = np.broadcast_to(x.unk | y.unk, shape)
        if op in ("Equal", "NotEqual"):
            # certain where both are exact, or where the intervals are disjoint
            with np.errstate(all="ignore"):
                nan = np.isnan(x.lo) | np.isnan(y.lo)
                disjoint = (x.hi < y.lo) | (y.hi < x.lo) | nan
                both = (x.lo == x.hi) & (y.lo == y.hi) & (x.lo == y.lo)
            eq_lo = both & ~unk
            eq_hi = ~disjoint | unk
            if op == "Equal":
                return bool_iv(eq_lo, eq_hi)
            return bool_iv(~eq_hi, ~eq_lo)
        fn = {"Less": np.less, "Greater": np.greater, "LessEqual": np.less_equal,
              "GreaterEqual": np.greater_equal}[op]
        with np.errstate(all="ignore"):
            res = [fn(a, b) for a in (x.lo, x.hi) for b in (y.lo, y.hi)]
        r = np.stack([np.broadcast_to(t, shape) for t in res])
        lo, hi = r.all(0), r.any(0)
        return bool_iv(lo & ~unk, hi | unk)

    def select(self, c: Iv, x: Iv, y: Iv) -> Iv:
        shape = np.broadcast_shapes(c.shape, x.shape, y.shape)
        t = (c.lo == 1)
        f = (c.hi == 0)
        bx = [np.broadcast_to(v, shape) for v in (x.lo, x.hi, x.unk)]
        by = [np.broadcast_to(v, shape) for v in (y.lo, y.hi, y.unk)]
        if x.dtype in INTS:
            eq = bx[0] == by[0]
            lo = np.where(f, by[0], bx[0])
            unk = np.where(t, bx[2], np.where(f, by[2], bx[2] | by[2] | ~eq))
            return int_iv(x.dtype, lo, unk)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ulo = np.fmin(bx[0], by[0])
            uhi = np.fmax(bx[1], by[1])
        # union of a NaN and a number: NaN or not depends on the condition
        mixed = np.isnan(bx[0]) != np.isnan(by[0])
        lo = np.where(t, bx[0], np.where(f, by[0], ulo))
        hi = np.where(t, bx[1], np.where(f, by[1], uhi))
        unk = np.where(t, bx[2], np.where(f, by[2], bx[2] | by[2] | mixed))
        if x.dtype == "bool":
            return bool_iv(np.where(unk, 0.0, lo), np.where(unk, 1.0, hi))
        lo = np.where(unk, -np.inf, lo)
        hi = np.where(unk, np.inf, hi)
        return Iv(x.dtype, lo, hi, unk)

    def cast(self, x: Iv, to: str) -> Iv:
        d = x.dtype
        if d == to:
            return x
        if to == "bool":
            if d == "bool":
                return x
            if d in INTS:
                nz = x.lo != 0
                return bool_iv(nz & ~x.unk, nz | x.unk)
            # x != 0 (NaN != 0 is true): certain where 0 is outside the interval
            nz = ~x.unk & ((x.lo > 0) | (x.hi < 0) | np.isnan(x.lo))
            z = ~x.unk & (x.lo == 0) & (x.hi == 0)
            return bool_iv(nz, ~z)
        if d == "bool":
            if to in INTS:
                return int_iv(to, x.lo, x.lo != x.hi)
            return Iv(to, x.lo.copy(), x.hi.copy(), np.zeros(x.lo.shape, bool))
        if d in INTS and to in INTS:
            return int_iv(to, x.lo.astype(d).astype(to), x.unk)
        if d in INTS:
            v = x.lo.astype(np.float64)         # exact below 2^53; else one rounding
            big = np.abs(x.lo) > 2 ** 53
            lo = np.where(big, np.nextafter(v, -np.inf), v)
            hi = np.where(big, np.nextafter(v, np.inf), v)
            return finish(to, lo, hi, x.unk.copy())
        if to in INTS:
            # float -> int truncates; NaN, Inf and out-of-range values are
            # undefined behaviour in C++ (TF gives INT_MIN on x86): undetermined.
            info = np.iinfo(to)
            with np.errstate(all="ignore"):
                tl, th = np.trunc(x.lo), np.trunc(x.hi)
            ok = ~x.unk & np.isfinite(tl) & np.isfinite(th) & (tl >= info.min) & (th <= info.max)
            ok = ok & (tl == th)
            return int_iv(to, np.where(ok, tl, 0).astype(np.int64), ~ok)
        lo, hi = round_out(x.lo, x.hi, to)      # float -> float: rounding is monotone
        return Iv(to, lo, hi, x.unk.copy())

    # -- reductions ----------------------------------------------------------
    def reduce(self, op, x: Iv, axes, keep) -> Iv:
        d = x.dtype
        r = x.lo.ndim
        ax = tuple(norm_axes(axes, r)) if r else ()
        n = int(math.prod(x.shape[i] for i in ax))
        unk = np.any(x.unk, axis=ax, keepdims=keep) if ax else x.unk.copy()
        if not ax:     # reduction over no axes: the identity
            return Iv(d, x.lo.copy(), x.hi.copy(), unk)
        if op in ("Any", "All"):
            f = np.max if op == "Any" else np.min
            init = 0.0 if op == "Any" else 1.0
            return bool_iv(f(x.lo, axis=ax, keepdims=keep, initial=init),
                            f(x.hi, axis=ax, keepdims=keep, initial=init))
        if d in INTS:
            v = x.lo.astype(d)
            info = np.iinfo(d)
            with np.errstate(all="ignore"):
                if op == "Sum":
                    out = np.sum(v, axis=ax, keepdims=keep, dtype=d)
                elif op == "Prod":
                    out = np.prod(v, axis=ax, keepdims=keep, dtype=d)
                elif op == "Max":
                    out = np.max(v, axis=ax, keepdims=keep, initial=info.min)
                elif op == "Min":
                    out = np.min(v, axis=ax, keepdims=keep, initial=info.max)
                else:
                    # Mean: TF's int32 mean is exact (it does not wrap: measured), int64's
                    # sum wraps; then C++ integer division (truncation toward zero).
                    s = np.sum(v.astype(np.int64), axis=ax, keepdims=keep, dtype=np.int64)
                    # (floor division, then toward zero: |INT64_MIN| does not exist,
                    # --seed=20261129 graph 13737)
                    q = np.floor_divide(s, max(n, 1))
                    out = np.where((s < 0) & (q * max(n, 1) != s), q + 1, q)
            return int_iv(d, np.asarray(out).astype(d), unk)
        with np.errstate(all="ignore"):
            if op in ("Max", "Min"):
                # exact; NaN propagates (TF's reducers and ours)
                f = np.max if op == "Max" else np.min
                init = -np.inf if op == "Max" else np.inf
                lo = f(x.lo, axis=ax, keepdims=keep, initial=init)
                hi = f(x.hi, axis=ax, keepdims=keep, initial=init)
                return finish(d, lo, hi, unk)
            if op in ("Sum", "Mean"):
                # |error| <= (n + 2) eps sum|x| for any summation order
                # (test_optimize_ops' reduction bound), eps = 2u of the dtype.
                # float64 sums that overflow in the oracle's own order are formed
                # again scaled down, where the exact sum may be finite (`_fsum`)
                lo, hi = _fsum(x.lo, ax, keep), _fsum(x.hi, ax, keep)
                mag = np.maximum(np.abs(x.lo), np.abs(x.hi))
                mag = _fsum(np.where(np.isfinite(mag), mag, 0.0), ax, keep)
                bound = (n + 2) * 2 * U[d] * mag      # may be inf: then so is the slack
                if op == "Mean":
                    lo = _fsum(x.lo, ax, keep, n) if n else lo / n
                    hi = _fsum(x.hi, ax, keep, n) if n else hi / n
                    bound = bound / n if n else bound
                    bound = bound + 2 * U[d] * np.maximum(np.abs(lo), np.abs(hi))
                # inf + -inf (NaN) may happen if some element can be +inf and one
                # -inf, or if partial sums can overflow both ways (order-dependent)
                big = max_finite(d)
                pos = _fsum(np.where(np.isfinite(x.hi), np.maximum(x.hi, 0), 0), ax, keep)
                neg = _fsum(np.where(np.isfinite(x.lo), np.minimum(x.lo, 0), 0), ax, keep)
                # partial sums beyond the dtype's range (bfloat16's is float32's, so
                # float32 accumulation overflows too) may give +-inf in some order
                hi = np.where((pos > big) & ~np.isnan(hi), np.inf, hi)
                lo = np.where((neg < -big) & ~np.isnan(lo), -np.inf, lo)
                amb = (np.isnan(lo) != np.isnan(hi)) | (
                    (np.any(np.isposinf(x.hi), axis=ax, keepdims=keep) | (pos > big))
                    & (np.any(np.isneginf(x.lo), axis=ax, keepdims=keep) | (neg < -big))
                    & ~(np.isnan(lo) & np.isnan(hi)))
                return finish(d, lo, hi, unk | amb, absolute=np.where(np.isnan(bound),
                                                                     0.0, bound))
            # Prod: interval product, element by element along the reduced axes
            keep_axes = [i for i in range(r) if i not in ax]
            perm = keep_axes + list(ax)
            xl = np.transpose(x.lo, perm).reshape([x.shape[i] for i in keep_axes] + [n])
            xh = np.transpose(x.hi, perm).reshape([x.shape[i] for i in keep_axes] + [n])
            plo = np.ones(xl.shape[:-1])
            phi = np.ones(xl.shape[:-1])
            amb = np.zeros(xl.shape[:-1], bool)
            for j in range(n):
                c = [plo * xl[..., j], plo * xh[..., j], phi * xl[..., j], phi * xh[..., j]]
                lo_j, hi_j, amb_j = minmax_corners(c)
                plo, phi, amb = lo_j, hi_j, amb | amb_j
            out_shape = tuple((1 if i in ax else e) for i, e in enumerate(x.shape)) if keep else \
                tuple(e for i, e in enumerate(x.shape) if i not in ax)
            plo, phi, amb = plo.reshape(out_shape), phi.reshape(out_shape), amb.reshape(out_shape)
            # Partial products depend on the order of multiplication: if the large
            # factors together can overflow, or the small ones underflow (FTZ), some
            # order gives inf, 0 or 0 * inf = NaN where the exact product is finite,
            # or inf: undetermined then (TF's order is Eigen's tree, ours is not).
            mag = np.maximum(np.abs(xl), np.abs(xh))
            mag_lo = np.minimum(np.abs(xl), np.abs(xh))
            mag_lo = np.where((xl <= 0) & (xh >= 0), 0.0, mag_lo)
            p_big = np.prod(np.where(np.isfinite(mag) & (mag > 1), mag, 1.0), -1)
            p_small = np.prod(np.where(mag_lo < 1, mag_lo, 1.0), -1)
            has_inf = np.isinf(mag).any(-1)
            has_zero = (mag_lo == 0).any(-1)
            order = ((p_big > max_finite(d)) | has_inf) & ((p_small < TINY[d]) | has_zero)
            order = order | ((p_big > max_finite(d)) & ~has_inf) | (
                (p_small < TINY[d]) & ~has_zero & (p_small > 0))
            amb = amb | order.reshape(out_shape)
            bound = (n + 2) * 2 * U[d] * np.maximum(np.abs(plo), np.abs(phi))
            return finish(d, plo, phi, unk | amb,
                           absolute=np.where(np.isfinite(bound), bound, 0.0))

    def softmax(self, x: Iv, log: bool) -> Iv:
        """Output i is increasing in x_i and decreasing in every other x_j, so its
        bounds take x_i at one end and the others at the opposite end (computed in
        float64, shifted by the row maximum m).

        Rounding, with d_j = x_j - m and u of the dtype (TF computes float16 and
        bfloat16 softmax in the dtype): d_j rounds (u|d_j|, which exp turns into a
        relative error), exp adds k u, the sum of positive terms n u, the division
        u. Only terms with e^d_j > u matter for the sum: with D the largest such
        |d_j|, softmax_i has relative error <= (|d_i| + D + n + 12) u, and
        log-softmax_i = d_i - log(sum) absolute error <= (|d_i| + |out_i| + D + n
        + 12 + 8 |log sum|) u.

        Rows holding +Inf or NaN are undetermined: TF's Eigen kernel gives NaN for
        the whole row, its oneDNN kernel only at those positions (test_optimize_ops,
        test_exp_log_softmax_with_inf); both are TF."""
        d = x.dtype
        n = x.shape[-1]
        uu = U[d]
        with np.errstate(all="ignore"):
            bad = (x.unk | np.isnan(x.lo) | np.isnan(x.hi) | np.isposinf(x.hi)).any(
                -1, keepdims=True)
            lo_in = np.where(bad, 0.0, x.lo)
            hi_in = np.where(bad, 0.0, x.hi)
            m = np.max(hi_in, axis=-1, keepdims=True) if n else np.zeros(x.shape[:-1] + (1,))
            all_neg_inf = np.isneginf(m)
            m = np.where(all_neg_inf, 0.0, m)
            dl, dh = lo_in - m, hi_in - m
            sh = np.sum(np.exp(dh), -1, keepdims=True)
            others_hi = _logsumexp_others(dh)    # log sum_{j != i} e^(x_j - m), x_j high
            others_lo = _logsumexp_others(dl)
            if log:
                lo = dl - np.logaddexp(dl, others_hi)
                hi = dh - np.logaddexp(dh, others_lo)
            else:
                lo = sigmoid(dl - others_hi)
                hi = sigmoid(dh - others_lo)
            mattering = dl >= np.log(uu) - 1
            big_d = np.max(np.where(mattering, -dl, 0.0), -1, keepdims=True) \
                if n else np.zeros(x.shape[:-1] + (1,))
            di = np.maximum(np.abs(dl), np.abs(dh))
            if log:
                out = np.maximum(np.abs(lo), np.abs(hi))
                absolute = (di + out + big_d + n + 12 + 8 * np.abs(np.log(sh))) * uu
                absolute = np.where(np.isfinite(absolute), absolute, 0.0)
                lo, hi = widen(lo, hi, 0.0, absolute)
            else:
                rel = (di + big_d + n + 12) * uu
                lo = np.where(np.isfinite(rel), lo * (1 - rel), 0.0)
                hi = np.where(np.isfinite(rel), hi * (1 + rel), hi)
        if not log:
            # exp(x - max) underflows first: outputs below ~n smallest normals may be
            # 0 (seen: TF's kernel flushes 1.5e-38)
            lo = np.where(hi < 4 * max(n, 1) * TINY[d], np.minimum(lo, 0.0), lo)
        nan_row = all_neg_inf & ~bad            # a row of -inf: exp(-inf - -inf) = NaN
        lo = np.where(nan_row, np.nan, lo)
        hi = np.where(nan_row, np.nan, hi)
        # a row whose every element may be -inf (e.g. a product that may overflow)
        # may be NaN or not (--seed=20261129 graphs 4264, 4664, 19644)
        maybe_nan_row = (np.isneginf(x.lo).all(-1, keepdims=True) if n else
                         np.zeros(x.shape[:-1] + (1,), bool)) & ~all_neg_inf
        unk = np.broadcast_to(bad | maybe_nan_row, x.shape).copy()
        return finish(d, lo, hi, unk)


def _fsum(a, ax, keep, div=1):
    """sum(a) / div in float64. Where that overflows, the sum is formed again
    scaled by 2^-64 (a float64 sum may be finite where the oracle's order
    overflows). Not scaled otherwise: scaling first would flush values below
    2^-958 (float64 denormals, which TF's Sum over one element returns as they
    are: --seed=20261129 graphs 5276, 9635, 13690, 14688)."""
    with np.errstate(all="ignore"):
        s = np.sum(a, axis=ax, keepdims=keep)
        sc = 2.0 ** -64
        scaled = np.sum(a * sc, axis=ax, keepdims=keep) / div / sc
        return np.where(np.isfinite(s), s / div, scaled)


def _logsumexp_others(d: np.ndarray) -> np.ndarray:
    """out[..., i] = log(sum_{j != i} exp(d[..., j])), without cancellation: for i
    other than the row's argmax the sum holds the max's term e^0 = 1, so removing
    e^(d_i - M) <= 1 from it loses at most n ulps; the argmax itself gets a sum of
    its own around the second largest value."""
    n = d.shape[-1]
    if n <= 1:
        return np.full(d.shape, -np.inf)
    with np.errstate(all="ignore"):
        am = np.argmax(d, -1)[..., None]
        m = np.take_along_axis(d, am, -1)
        ms = np.where(np.isfinite(m), m, 0.0)
        e = np.exp(d - ms)
        out = np.log(np.maximum(np.sum(e, -1, keepdims=True) - e, 0.0)) + ms
        rest = d.copy()
        np.put_along_axis(rest, am, -np.inf, -1)
        m2 = np.max(rest, -1, keepdims=True)
        m2s = np.where(np.isfinite(m2), m2, 0.0)
        at_max = np.log(np.sum(np.exp(rest - m2s), -1, keepdims=True)) + m2s
        np.put_along_axis(out, am, at_max, -1)
    return out


def evaluate(case, inputs: Sequence[np.ndarray]) -> Dict[str, Iv]:
    """Enclosures of every value of the case for these input values."""
    return _Oracle(case, inputs).run()
