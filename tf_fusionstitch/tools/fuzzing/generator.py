"""The generator: random valid cases (3-12 op-table ops over a few inputs),
deterministic in their seed, and the seed of each graph of a fuzzing run.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional

import numpy as np
import tensorflow as tf

from tf_fusionstitch.tools.fuzzing.case_types import (broadcast, infer_types, node_type,
                                                      operand_types)
from tf_fusionstitch.tools.fuzzing.inputs import make_inputs
from tf_fusionstitch.tools.fuzzing.ops import (B, BINARY_OPS, CASE_VERSION, COMPARISONS, CaseError,
                                               DTYPES, F, FI, FIB, INTS, REDUCE_OPS, UNARY_OPS)
from tf_fusionstitch.tools.fuzzing.tf_graph import build_outputs


# ops whose second operand must keep away from zero (integers: a fresh divisor
# input in +-[2, 20], so that neither division by zero nor INT_MIN / -1 occurs).
_DIVISIONS = ("RealDiv", "Div", "FloorDiv", "FloorMod")
_NEEDS = {"Log": "pos", "Rsqrt": "pos", "Sqrt": "nonneg", "Log1p": "nonneg",
          "Reciprocal": "nonzero"}
_MAKES = {"Exp": "pos", "Sigmoid": "pos", "Softplus": "nonneg", "Square": "nonneg",
          "Abs": "nonneg", "Relu": "nonneg", "Relu6": "nonneg", "Sqrt": "nonneg",
          "Erfc": "nonneg", "Softmax": "nonneg"}


_EXTENTS = (1, 1, 1, 2, 2, 3, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 33)
_DTYPE_WEIGHTS = {"float32": .36, "float16": .15, "bfloat16": .13, "float64": .13,
                  "int32": .11, "int64": .08, "bool": .04}
_POW_EXPONENTS = (0.5, -0.5, 2.0, 3.0, 4.0, -1.0, 1.0, 1.5, -2.0, 0.25)
MAX_ELEMENTS = 6000


class _Gen:
    def __init__(self, rng: np.random.Generator, seed: int):
        self.r = rng
        self.seed = int(seed)
        self.inputs, self.nodes = [], []
        self.types: Dict[str, tuple] = {}
        self.props: Dict[str, str] = {}        # 'pos', 'nonneg', 'nonzero' or 'any'
        self.uses: Dict[str, int] = {}
        self.dynamic = self.r.random() < 0.3
        self.zero_dims = self.r.random() < 0.06
        self.big = self.r.random() < 0.04
        self.edge_rate = self.r.choice([0.0, 0.1, 0.25], p=[0.55, 0.3, 0.15])
        self.int_edges = self.r.random() < 0.3

    # -- helpers ---------------------------------------------------------
    def chance(self, p) -> bool:
        return bool(self.r.random() < p)

    def choice(self, seq):
        return seq[int(self.r.integers(len(seq)))]

    def extent(self) -> int:
        if self.zero_dims and self.chance(0.15):
            return 0
        if self.big and self.chance(0.3):
            return self.choice((127, 257, 1000, 4099))
        return self.choice(_EXTENTS)

    def shape(self, rank=None) -> tuple:
        for _ in range(20):
            r = rank if rank is not None else int(self.r.choice(5, p=[.08, .2, .3, .27, .15]))
            s = tuple(self.extent() for _ in range(r))
            if math.prod(s) <= MAX_ELEMENTS:
                return s
        return (2, 3)[:rank if rank is not None else 2]

    def compatible(self, s: tuple) -> tuple:
        """A shape that broadcasts with s (it may widen s's size-1 dims)."""
        for _ in range(20):
            mode = self.r.random()
            r = len(s) if mode < .5 else (
                int(self.r.integers(0, len(s) + 1)) if mode < .75 else
                min(4, len(s) + int(self.r.integers(1, 3))))
            out = []
            for i in range(r):
                j = len(s) - r + i
                if j < 0:
                    out.append(self.choice((1, 2, 3, 4)))
                elif s[j] == 1:
                    out.append(1 if self.chance(.6) else self.extent())
                else:
                    out.append(s[j] if self.chance(.75) else 1)
            out = tuple(out)
            if math.prod(broadcast(s, out)) <= MAX_ELEMENTS:
                return out
        return s

    def new_input(self, dtype: str, shape: tuple, domain: str = None) -> str:
        name = f"x{len(self.inputs)}"
        if domain is None:
            domain = ("bool:" + self.choice(("0.1", "0.5", "0.9"))) if dtype == "bool" else (
                "small" if dtype in INTS else self.choice(("normal", "normal", "normal",
                                                           "wide", "small", "unit")))
        edges = 0.0
        if self.edge_rate and self.chance(0.6) and dtype != "bool" and (
                dtype not in INTS or self.int_edges):
            edges = float(self.edge_rate)
        static = [None if (self.dynamic and self.chance(.5)) else d for d in shape]
        self.inputs.append({"name": name, "dtype": dtype, "shape": list(shape),
                            "static": static, "domain": domain, "edges": edges})
        self.types[name] = (dtype, tuple(shape))
        self.props[name] = {"positive": "pos", "unit": "pos", "divisor": "nonzero"}.get(
            domain, "any") if not edges else "any"
        return name

    def emit(self, op, inputs, attrs=None, prop="any") -> str:
        node = {"name": f"n{len(self.nodes)}", "op": op, "inputs": list(inputs),
                "attrs": attrs or {}}
        t = node_type(node, operand_types(node, self.types))   # raises CaseError
        if math.prod(t[1]) > MAX_ELEMENTS:
            raise CaseError("too large")
        self.nodes.append(node)
        self.types[node["name"]] = t
        self.props[node["name"]] = _MAKES.get(op, prop)
        for ref in inputs:
            if isinstance(ref, str):
                self.uses[ref] = self.uses.get(ref, 0) + 1
        return node["name"]

    def values(self, dtypes=None, min_rank=0) -> List[str]:
        return [v for v, (d, s) in self.types.items()
                if (dtypes is None or d in dtypes) and len(s) >= min_rank]

    def pick(self, dtypes, min_rank=0) -> Optional[str]:
        """A recent value most of the time (chains); any value otherwise
        (shared producers with several consumers)."""
        vals = self.values(dtypes, min_rank)
        if dtypes is not None and "bool" in dtypes and len(dtypes) > 1 and self.chance(.8):
            vals = [v for v in vals if self.types[v][0] != "bool"] or vals
        if not vals:
            return None
        if self.chance(0.65):
            return vals[-1 - int(self.r.integers(min(3, len(vals))))]
        return self.choice(vals)

    def operand(self, dtypes, min_rank=0) -> str:
        v = self.pick(dtypes, min_rank)
        if v is not None:
            return v
        # convert something, or make a new input
        src = self.pick(FIB)
        target = self.main if self.main in dtypes else self.choice(list(dtypes))
        if src is not None and len(self.types[src][1]) >= min_rank and self.chance(.5):
            return self.emit("Cast", [src], {"to": target})
        return self.new_input(target, self.shape(rank=max(min_rank, int(
            self.r.choice(5, p=[.08, .2, .3, .27, .15])))))

    def guarded(self, v: str, need: str) -> str:
        """Make v satisfy a domain need most of the time (else NaN/Inf paths are exercised)."""
        have = self.props.get(v, "any")
        ok = have == need or have == "pos" or (need == "nonneg" and have == "pos")
        if ok or self.chance(0.2):
            return v
        g = self.r.random()
        if g < .4:
            return self.emit("AddV2", [self.emit("Abs", [v]), {"const": 0.5}], prop="pos")
        if g < .6:
            return self.emit("Exp", [v])
        if g < .8:
            return self.emit("AddV2", [self.emit("Square", [v]), {"const": 0.25}], prop="pos")
        return self.emit("Sigmoid", [v])

    def second(self, a: str, dtype: str, domain=None) -> str:
        """Second operand of a binary op with a: existing broadcast-compatible value,
        a scalar constant, or a new input of a compatible shape."""
        s = self.types[a][1]
        u = self.r.random()
        if u < .4:
            cands = [v for v in self.values((dtype,)) if v != a and _compat(self.types[v][1], s)
                     and (domain is None or self.props.get(v) in ("pos",) + (
                         ("nonzero",) if domain == "nonzero" else ()))]
            if cands:
                return self.choice(cands)
        if u < .55 and dtype != "bool" and domain != "divisor":
            c = {"pos": self.choice((0.5, 2.0, 3.0)), "nonzero": self.choice((-2.0, 0.5, 4.0))
                 }.get(domain, self.choice((0.5, -1.0, 2.0, 0.0, 1.5, -3.0)))
            return {"const": int(c) if dtype in INTS and c == int(c) else (
                float(c) if dtype not in INTS else 2)}
        dom = {"pos": "positive", "nonzero": "positive", "divisor": "divisor"}.get(domain)
        return self.new_input(dtype, self.compatible(s), dom)

    # -- op builders -----------------------------------------------------
    def unary(self):
        op = self.choice(list(UNARY_OPS))
        x = self.operand(UNARY_OPS[op])
        if op in _NEEDS:
            x = self.guarded(x, _NEEDS[op])
        self.emit(op, [x])

    def binary(self):
        if self.chance(.7):
            op = self.choice([o for o in BINARY_OPS if o not in COMPARISONS + (
                "LogicalAnd", "LogicalOr")])
        else:
            op = self.choice(list(COMPARISONS) + ["LogicalAnd", "LogicalOr"])
        dts = BINARY_OPS[op]
        a = self.operand(dts)
        d = self.types[a][0]
        if d not in dts:
            a = self.emit("Cast", [a], {"to": self.choice([t for t in dts if t in FI] or list(dts))})
            d = self.types[a][0]
        if op in _DIVISIONS and d in INTS:
            b = self.second(a, d, "divisor")
        elif op in ("RealDiv", "Div", "FloorDiv", "FloorMod") or (op == "DivNoNan" and self.chance(.5)):
            b = self.second(a, d, "nonzero")
            if isinstance(b, str):
                b = self.guarded(b, "nonzero")
        elif op == "Pow":
            a = self.guarded(a, "pos")
            if self.chance(.5):
                b = {"const": float(self.choice(_POW_EXPONENTS))}
            else:
                b = self.new_input(d, self.compatible(self.types[a][1]), "small")
        else:
            b = self.second(a, d)
        if isinstance(b, str) and self.chance(.3) and op not in _DIVISIONS + ("Pow",):
            a, b = b, a                        # constants and new inputs on either side
        if isinstance(a, dict):
            a, b = b, a
        self.emit(op, [a, b])

    def reduction(self):
        op = self.choice(list(REDUCE_OPS))
        x = self.operand(REDUCE_OPS[op])
        s = self.types[x][1]
        r = len(s)
        if r == 0:
            axes = []
        elif self.chance(.07):
            axes = []
        elif self.chance(.2):
            axes = list(range(r))
        else:
            axes = sorted(self.r.choice(r, size=int(self.r.integers(1, r + 1)), replace=False).tolist())
        axes = [int(a) - (r if self.chance(.3) else 0) for a in axes]
        self.emit(op, [x], {"axis": axes, "keep_dims": self.chance(.5)})

    def stitch(self):
        """A reduction and a consumer that broadcasts it back over its input (the
        layernorm/softmax shape FusionStitching stitches into one kernel)."""
        x = self.operand(F, min_rank=1)
        r = len(self.types[x][1])
        axes = [r - 1] if self.chance(.6) else sorted(
            self.r.choice(r, size=int(self.r.integers(1, r + 1)), replace=False).tolist())
        red = self.emit(self.choice(("Mean", "Max", "Sum", "Min")), [x],
                        {"axis": [int(a) for a in axes], "keep_dims": True})
        op = self.choice(("Sub", "Mul", "AddV2", "RealDiv", "SquaredDifference"))
        if op == "RealDiv":
            red = self.guarded(red, "nonzero")
        self.emit(op, [x, red] if self.chance(.7) else [red, x])

    def softmax(self):
        x = self.operand(F, min_rank=1)
        self.emit(self.choice(("Softmax", "LogSoftmax")), [x])

    def bias_add(self):
        x = self.operand(FI, min_rank=2)
        d, s = self.types[x]
        fmt = "NCHW" if len(s) >= 3 and self.chance(.3) else "NHWC"
        c = s[1] if fmt == "NCHW" else s[-1]
        cands = [v for v in self.values((d,)) if self.types[v][1] == (c,)]
        b = self.choice(cands) if cands and self.chance(.4) else self.new_input(d, (c,))
        self.emit("BiasAdd", [x, b], {"data_format": fmt})

    def condition(self, s: tuple, exact=False) -> str:
        cands = [v for v in self.values(B) if (self.types[v][1] == s if exact
                                                else _compat(self.types[v][1], s))]
        if cands and self.chance(.5):
            return self.choice(cands)
        if self.chance(.5):
            fl = [v for v in self.values(FI) if (self.types[v][1] == s if exact
                                                 else _compat(self.types[v][1], s))]
            if fl:
                a = self.choice(fl)
                other = self.second(a, self.types[a][0]) if not exact else \
                    self.new_input(self.types[a][0], self.types[a][1])
                return self.emit(self.choice(COMPARISONS), [a, other])
        return self.new_input("bool", s if exact else self.compatible(s))

    def select(self):
        x = self.operand(FIB)
        d, s = self.types[x]
        if self.chance(.35):                      # v1: same shapes; condition maybe a row vector
            same = [v for v in self.values((d,)) if v != x and self.types[v][1] == s]
            y = self.choice(same) if same and self.chance(.5) else self.new_input(d, s)
            if len(s) > 1 and self.chance(.4):
                c = self.new_input("bool", (s[0],))
            else:
                c = self.condition(s, exact=True)
            self.emit("Select", [c, x, y])
        else:
            y = self.second(x, d) if d != "bool" else self.new_input(d, self.compatible(s))
            if isinstance(y, dict):
                y = self.new_input(d, self.compatible(s))
            c = self.condition(broadcast(s, self.types[y][1]))
            self.emit("SelectV2", [c, x, y] if self.chance(.5) else [c, y, x])

    def cast(self):
        x = self.operand(FIB)
        d = self.types[x][0]
        self.emit("Cast", [x], {"to": self.choice([t for t in DTYPES if t != d])})

    def reshape(self):
        x = self.operand(FIB)
        s = list(self.types[x][1])
        k = self.r.random()
        ones = [i for i, e in enumerate(s) if e == 1]
        if k < .35 and len(s) < 5:
            self.emit("ExpandDims", [x], {"axis": int(self.r.integers(-len(s) - 1, len(s) + 1))})
        elif k < .6 and ones:
            axes = sorted(self.r.choice(ones, size=int(self.r.integers(1, len(ones) + 1)),
                                        replace=False).tolist())
            self.emit("Squeeze", [x], {"axis": [int(a) - (len(s) if self.chance(.3) else 0)
                                                for a in axes]})
        elif k < .8 and len(s) >= 2:
            self.emit("Transpose", [x], {"perm": [int(i) for i in self.r.permutation(len(s))]})
        elif k < .9:
            t = [e for e in s if e != 1]
            for _ in range(int(self.r.integers(0, 3))):
                t.insert(int(self.r.integers(0, len(t) + 1)), 1)
            if len(t) <= 5:
                self.emit("Reshape", [x], {"shape": t})
        else:
            target = list(self.compatible(tuple(s)))
            target = list(broadcast(s, target))
            self.emit("BroadcastTo", [x], {"shape": target})

    def _restore(self, n_nodes: int, n_inputs: int) -> None:
        dropped = {n["name"] for n in self.nodes[n_nodes:]} | {
            i["name"] for i in self.inputs[n_inputs:]}
        for node in self.nodes[n_nodes:]:
            for ref in node["inputs"]:
                if isinstance(ref, str) and ref not in dropped:
                    self.uses[ref] -= 1
        del self.nodes[n_nodes:]
        del self.inputs[n_inputs:]
        for name in dropped:
            self.types.pop(name, None)
            self.props.pop(name, None)
            self.uses.pop(name, None)

    def build(self) -> dict:
        self.main = str(self.r.choice(list(_DTYPE_WEIGHTS), p=list(_DTYPE_WEIGHTS.values())))
        for _ in range(int(self.r.integers(1, 3))):
            self.new_input(self.main, self.shape())
        target = int(self.r.integers(3, 13))
        actions = [(self.unary, .25), (self.binary, .28), (self.reduction, .1),
                   (self.stitch, .06), (self.softmax, .05), (self.bias_add, .04),
                   (self.select, .08), (self.cast, .05), (self.reshape, .09)]
        fns, ps = zip(*actions)
        ps = np.array(ps) / sum(ps)
        tries = 0
        while len(self.nodes) < target and tries < 200:
            tries += 1
            n_before, i_before = len(self.nodes), len(self.inputs)
            try:
                fns[int(self.r.choice(len(fns), p=ps))]()
            except CaseError:
                self._restore(n_before, i_before)     # roll back a half-built op
        sinks = [n["name"] for n in self.nodes if not self.uses.get(n["name"])]
        extra = [n["name"] for n in self.nodes if self.uses.get(n["name"]) and self.chance(.15)]
        outputs = [n["name"] for n in self.nodes if n["name"] in set(sinks + extra)]
        return {"version": CASE_VERSION, "seed": self.seed, "inputs": self.inputs,
                "nodes": self.nodes, "outputs": outputs}


def _compat(a, b) -> bool:
    try:
        np.broadcast_shapes(tuple(a), tuple(b))
        return True
    except ValueError:
        return False


def validate_case(case) -> Optional[str]:
    """None if TF runs the case eagerly on its first draw (and the oracle handles it),
    else the reason."""
    try:
        infer_types(case)
        args = [tf.constant(v) for v in make_inputs(case, 0)]
        outs = build_outputs(case, args)
        for o in outs:
            o.numpy()
    except (CaseError, tf.errors.OpError, ValueError, TypeError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return None


def generate_case(seed: int) -> dict:
    """A valid random case, deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    last = None
    for attempt in range(100):
        case = _Gen(rng, seed).build()
        if len(case["nodes"]) < 3:
            continue
        last = validate_case(case)
        if last is None:
            return case
    raise RuntimeError(f"no valid case from seed {seed}: {last}")


def case_seed(run_seed: int, index: int) -> int:
    return int(np.random.SeedSequence([run_seed, index]).generate_state(1)[0])
