"""Grappler's rewrites that change results, applied to the oracle's copy of
a case: TF and optimize() both run them, so the oracle must enclose what the
rewritten graph computes (`grappler_rewrites`), including every order of a
reassociated sum or product (`_reassociate`).
"""

from __future__ import annotations

import itertools
import json
from typing import Dict, Optional

import numpy as np

from tf_fusionstitch.tools.fuzzing.case_types import infer_types
from tf_fusionstitch.tools.fuzzing.np_dtypes import np_dtype
from tf_fusionstitch.tools.fuzzing.ops import FLOATS


def count_consumers(nodes, outputs) -> Dict[str, int]:
    """Consumers of each value as Grappler counts them for its rewrites: after
    its common subgraph elimination, which merges nodes of one op, attributes
    and inputs first, so two LogicalNot(c) are one consumer of c
    (--seed=20261130 graph 7922: not(a <= b) became a > b, NaN -> False)."""
    canon: Dict[str, str] = {}
    first: Dict[str, str] = {}
    for node in nodes:
        key = json.dumps([node["op"], [canon.get(r, r) if isinstance(r, str) else r
                                       for r in node["inputs"]], node.get("attrs", {})],
                         sort_keys=True, default=str)
        canon[node["name"]] = first.setdefault(key, node["name"])
    count: Dict[str, int] = {}
    for node in nodes:
        if canon[node["name"]] != node["name"]:
            continue                         # merged into an equal node
        for ref in node["inputs"]:
            if isinstance(ref, str):
                r = canon.get(ref, ref)
                count[r] = count.get(r, 0) + 1
    for o in outputs:
        r = canon.get(o, o)
        count[r] = count.get(r, 0) + 1
    for name, c in canon.items():
        if c != name and c in count:
            count[name] = count[c]
    return count


_INVERSE = {"Less": "GreaterEqual", "GreaterEqual": "Less", "Greater": "LessEqual",
            "LessEqual": "Greater"}


def grappler_rewrites(case) -> list:
    """The case's nodes as Grappler leaves them, for the rewrites that change
    results (TF and optimize() both run them; measured):
    - Pow(x, c) for a constant c: 0.5 -> Sqrt, -0.5 -> Rsqrt, 1 -> x, 2 -> Square,
      3 -> x * Square(x), -1 -> Reciprocal (sqrt(-inf) is NaN, pow(-inf, .5) inf);
    - LogicalNot(Less(a, b)) -> GreaterEqual(a, b), etc. (differs for NaN);
    - Reciprocal(Reciprocal(x)) -> x (differs where 1/x overflows or flushes);
    - Log(Softmax(x)) -> LogSoftmax(x) (no underflow to log(0) = -inf);
    - Maximum(x, x * a) -> LeakyRelu(x, a) (`_leaky_relu`: min for a > 1);
    each only where the inner op has no other consumer and is not an output;
    - float32/float64 x / c -> x * (1 / c) and the reassociation of trees of
      + - (or of *) ops (`_reassociate`).
    (Max/Min of a monotone op is handled in oracle.py's _Oracle.monotone_hoist.)"""
    nodes = [dict(n) for n in case["nodes"]]
    by_name = {n["name"]: n for n in nodes}
    consumers = count_consumers(nodes, case["outputs"])
    types = infer_types(case)

    def sole(ref, op=None):
        inner = by_name.get(ref) if isinstance(ref, str) else None
        if inner is None or consumers.get(ref) != 1:
            return None
        return inner if (op is None or inner["op"] in op) else None

    out = []
    for node in nodes:
        op, ins = node["op"], node["inputs"]
        if op == "Pow" and isinstance(ins[1], dict):
            c = float(ins[1]["const"])
            simple = {0.5: "Sqrt", -0.5: "Rsqrt", 1.0: "Identity", 2.0: "Square",
                      -1.0: "Reciprocal"}
            if c in simple:
                node = dict(node, op=simple[c], inputs=[ins[0]], attrs={})
            elif c == 3.0:
                sq = {"name": node["name"] + "/square", "op": "Square", "inputs": [ins[0]],
                      "attrs": {}}
                out.append(sq)
                node = dict(node, op="Mul", inputs=[ins[0], sq["name"]], attrs={})
        elif op == "LogicalNot" and sole(ins[0], _INVERSE):
            inner = by_name[ins[0]]
            node = dict(node, op=_INVERSE[inner["op"]], inputs=list(inner["inputs"]), attrs={})
        elif op == "Reciprocal" and sole(ins[0], ("Reciprocal",)):
            node = dict(node, op="Identity", inputs=[by_name[ins[0]]["inputs"][0]], attrs={})
        elif op == "Log" and sole(ins[0], ("Softmax",)):
            node = dict(node, op="LogSoftmax", inputs=[by_name[ins[0]]["inputs"][0]], attrs={})
        elif op == "Maximum" and _leaky_relu(node, by_name, consumers, types):
            x, alpha = _leaky_relu(node, by_name, consumers, types)
            node = dict(node, op="LeakyRelu", inputs=[x], attrs={"alpha": alpha})
        elif op in ("RealDiv", "Div") and isinstance(ins[1], dict) and isinstance(ins[0], str) \
                and types[node["name"]][0] in _REASSOCIATED:
            # constant folding's ReduceDivToReciprocalMul (before it pushes
            # constants down); float16/bfloat16: see ERR's RealDiv slack
            r = _fold("RealDiv", 1.0, ins[1]["const"], types[node["name"]][0])
            node = dict(node, op="Mul", inputs=[ins[0], {"const": r}], attrs={})
        out.append(node)
    return _reassociate(out, case["outputs"], types)


def _leaky_relu(node, by_name, consumers, types) -> Optional[tuple]:
    """(x, alpha) where the remapper (FindMulAndMaximum, remapper.cc) fuses
    Maximum(x, x * alpha) into LeakyRelu(x, alpha) = x > 0 ? x : alpha * x.
    It checks only alpha >= 0, so for alpha > 1 TF returns min(x, alpha * x)
    (a TF bug; TF defines the reference), and for alpha = 0, LeakyRelu(+inf) is
    inf where max(inf, 0 * inf) is NaN. The product may be x / c, which
    constant folding made x * (1/c) first. Measured: float32 and bfloat16 only
    (float16 and float64 keep the Maximum); the inner op has no other consumer."""
    d = types[node["name"]][0]
    if d not in ("float32", "bfloat16") or not all(isinstance(r, str) for r in node["inputs"]):
        return None
    for m_ref, x in (node["inputs"], node["inputs"][::-1]):
        m = by_name.get(m_ref)
        if m is None or consumers.get(m_ref) != 1 or len(m["inputs"]) != 2:
            continue
        a, b = m["inputs"]
        if m["op"] == "Mul" and (a, b) != (x, x):
            alpha = b if a == x else a if b == x else None
            if isinstance(alpha, dict):
                alpha = float(alpha["const"])
            else:
                continue
        elif m["op"] in ("RealDiv", "Div") and a == x and isinstance(b, dict):
            alpha = _fold("RealDiv", 1.0, b["const"], d)
        else:
            continue
        if alpha >= 0:
            return x, alpha
    return None


_REASSOCIATED = ("float32", "float64")
_ADD_FAMILY = ("Add", "AddV2", "Sub")
_MAX_TERMS = 5            # (2n-3)!! orders: 105 for 5 terms


def _fold(op, a, b, dtype) -> float:
    """Grappler's constant folding of op(a, b): TF's kernel, rounded to the dtype."""
    nd = np_dtype(dtype)
    with np.errstate(all="ignore"):
        fn = {"AddV2": np.add, "Mul": np.multiply, "RealDiv": np.divide}[op]
        return float(fn(np.array(a, nd), np.array(b, nd)).astype(nd))


def _orders(items):
    """Every binary tree over `items` (commutative: a tree and its mirror once)."""
    if len(items) == 1:
        yield items[0]
        return
    first, rest = items[0], items[1:]
    for k in range(len(rest)):
        for combo in itertools.combinations(range(len(rest)), k):
            left = [first] + [rest[i] for i in combo]
            right = [rest[i] for i in range(len(rest)) if i not in combo]
            for lt in _orders(left):
                for rt in _orders(right):
                    yield (lt, rt)


def _reassociate(nodes, outputs, types) -> list:
    """Grappler reassociates trees of + and - ops, and of * ops (x / c counts
    as x * (1/c)), of float32/float64 values:
    - constant folding's ConstantPushDown (constant_folding.cc), for a constant
      c and an inner op with no other consumer: (a + b) - c -> a + (b - c) or
      b + (a - c) (which operand of a commutative op stays outside depends on
      node names), c * (a * b) -> a * (c * b), repeated until nothing changes,
      folding constants that meet (in the dtype);
    - the arithmetic optimizer's AddOpsRewrite and MinimizeBroadcasts, which
      re-pair the operands of a tree of Add (or Mul) ops by shape, e.g. back to
      (a + b) - c when a and b have one shape.
    Rounding then happens in another order: (a + b) - c and a + (b - c) differ
    by an ulp of the partial sums, which is large next to a cancelling result;
    products may also overflow or underflow in one order only. The oracle takes
    the union over every order of the tree's signed terms (a - b is a + (-b)
    exactly; constants that meet are folded as Grappler does): TF's result is
    one of them. Trees with a constant (pushdown) or of Add/AddV2 or Mul only
    (re-pairing); not trees with a non-constant division. float16/bfloat16:
    Add/AddV2 or Mul trees only (ConstantPushDown skips these dtypes; the
    re-pairing does not, measured: (x + y) + z with z shaped like x). Integers
    are exact (wrapping), so their order does not matter. Up to _MAX_TERMS
    terms; larger trees keep TF's graph order (not seen)."""
    by_name = {n["name"]: n for n in nodes}
    consumers = count_consumers(nodes, outputs)

    def family(n):
        dtype = types.get(n["name"], (None,))[0] if n is not None else None
        if dtype in _REASSOCIATED:
            return "add" if n["op"] in _ADD_FAMILY else "mul" if n["op"] == "Mul" else None
        if dtype in FLOATS:        # float16/bfloat16: re-pairing only (no pushdown)
            return "add" if n["op"] in ("Add", "AddV2") else "mul" if n["op"] == "Mul" else None
        return None

    def interior(ref, fam):
        n = by_name.get(ref) if isinstance(ref, str) else None
        return n is not None and family(n) == fam and consumers.get(ref) == 1

    inner = {ref for n in nodes if family(n) for ref in n["inputs"]
             if interior(ref, family(n))}
    out = []
    for node in nodes:
        fam = family(node)
        if fam is None or node["name"] in inner:
            out.append(node)
            continue
        terms, ops = [], []

        def collect(n, sign):
            ops.append(n["op"])
            for k, ref in enumerate(n["inputs"]):
                sk = -sign if (n["op"] == "Sub" and k == 1) else sign
                if interior(ref, fam):
                    collect(by_name[ref], sk)
                else:
                    terms.append((ref, sk))

        collect(node, 1)
        has_const = any(isinstance(t, dict) for t, _ in terms)
        if len(ops) < 2 or len(terms) > _MAX_TERMS or not (
                has_const or all(o in ("Add", "AddV2", "Mul") for o in ops)):
            out.append(node)
            continue
        dtype = types[node["name"]][0]
        finals = []
        for k, tree in enumerate(_orders(terms)):
            emitted = []
            counter = itertools.count()

            def emit(t):
                if isinstance(t, tuple) and len(t) == 2 and isinstance(t[1], int):
                    return t                                # a leaf: (ref, sign)
                (a, sa), (b, sb) = emit(t[0]), emit(t[1])
                if isinstance(a, dict) and isinstance(b, dict):
                    if fam == "mul":
                        return {"const": _fold("Mul", a["const"], b["const"], dtype)}, 1
                    v = _fold("AddV2", sa * a["const"], sb * b["const"], dtype)
                    return {"const": v}, 1
                name = f"{node['name']}/order{k}.{next(counter)}"
                if fam == "mul":
                    emitted.append({"name": name, "op": "Mul", "inputs": [a, b], "attrs": {}})
                    return name, 1
                if sa == sb:
                    emitted.append({"name": name, "op": "AddV2", "inputs": [a, b], "attrs": {}})
                    return name, sa
                x, y = (a, b) if sa > 0 else (b, a)
                emitted.append({"name": name, "op": "Sub", "inputs": [x, y], "attrs": {}})
                return name, 1

            ref, sign = emit(tree)
            if isinstance(ref, dict) or sign < 0:          # (all constants: not a tree here)
                name = f"{node['name']}/order{k}.neg"
                emitted.append({"name": name, "op": "Neg", "inputs": [ref], "attrs": {}})
                ref = name
            out += emitted
            finals.append(ref)
        out.append({"name": node["name"], "op": "Hull", "inputs": finals, "attrs": {}})
    return out
