"""Shrinking a failing case: remove outputs and ops, lower ranks and extents,
drop edge values and dynamic dimensions while the failure persists.
"""

from __future__ import annotations

import json
import math
import time
from typing import Callable, Optional

from tf_fusionstitch.tools.fuzzing.case_types import infer_types
from tf_fusionstitch.tools.fuzzing.generator import validate_case
from tf_fusionstitch.tools.fuzzing.ops import CaseError
from tf_fusionstitch.tools.fuzzing.runner import CaseResult, run_cases


def _dce(case) -> dict:
    """Drop nodes and inputs no output depends on."""
    live = set(case["outputs"])
    for node in reversed(case["nodes"]):
        if node["name"] in live:
            live.update(r for r in node["inputs"] if isinstance(r, str))
    return dict(case, nodes=[n for n in case["nodes"] if n["name"] in live],
                inputs=[i for i in case["inputs"] if i["name"] in live])


def _copy(case) -> dict:
    return json.loads(json.dumps(case))


def _replace_uses(case, old, new) -> dict:
    c = _copy(case)
    for node in c["nodes"]:
        node["inputs"] = [new if r == old else r for r in node["inputs"]]
    return c


def _candidates(case):
    """Smaller variants of a case, most aggressive first."""
    # 1. fewer outputs
    if len(case["outputs"]) > 1:
        for o in case["outputs"]:
            yield _dce(dict(_copy(case), outputs=[o]))
        for o in case["outputs"]:
            yield _dce(dict(_copy(case), outputs=[k for k in case["outputs"] if k != o]))
    types = infer_types(case)
    names = [n["name"] for n in case["nodes"]]
    # 2. cut a node: replace it by a new input of its type (its producers go away)
    for node in case["nodes"]:
        if node["name"] in case["outputs"]:
            continue
        d, s = types[node["name"]]
        c = _copy(case)
        new = f"x{len(c['inputs'])}_{node['name']}"
        c["inputs"].append({"name": new, "dtype": d, "shape": list(s), "static": list(s),
                            "domain": "bool:0.5" if d == "bool" else "normal", "edges": 0.0})
        yield _dce(_replace_uses(c, node["name"], new))
    # 3. bypass a node: its consumers use one of its operands instead
    for node in case["nodes"]:
        for ref in node["inputs"]:
            if isinstance(ref, str) and types[ref] == types[node["name"]]:
                c = _replace_uses(case, node["name"], ref)
                if node["name"] in c["outputs"]:
                    if ref not in names:
                        continue
                    c["outputs"] = [ref if o == node["name"] else o for o in c["outputs"]]
                    if len(set(c["outputs"])) != len(c["outputs"]):
                        continue
                yield _dce(c)
    # 4. drop edge values, plain domains, static signatures
    for i, inp in enumerate(case["inputs"]):
        if inp.get("edges"):
            c = _copy(case)
            c["inputs"][i]["edges"] = 0.0
            yield c
        if inp.get("static") != inp["shape"]:
            c = _copy(case)
            c["inputs"][i]["static"] = list(inp["shape"])
            yield c
    # 5. smaller extents: replace one extent value everywhere (keeps broadcasting)
    extents = sorted({d for i in case["inputs"] for d in i["shape"] if d > 1}, reverse=True)
    for e in extents:
        for new in sorted({1, 2, e // 2, e - 1}):
            if new >= e or new < 1:
                continue
            c = _copy(case)
            for inp in c["inputs"]:
                inp["shape"] = [new if d == e else d for d in inp["shape"]]
                inp["static"] = [(new if d == e else d) if d is not None else None
                                 for d in inp.get("static", inp["shape"])]
            for node in c["nodes"]:
                if "shape" in node.get("attrs", {}):
                    node["attrs"]["shape"] = [new if d == e else d for d in node["attrs"]["shape"]]
            yield c
    # 6. lower ranks: drop a size-1 (or any) dim of one input
    for i, inp in enumerate(case["inputs"]):
        for j in range(len(inp["shape"])):
            c = _copy(case)
            del c["inputs"][i]["shape"][j]
            del c["inputs"][i]["static"][j]
            yield c


def _valid(case) -> bool:
    try:
        infer_types(case)
    except (CaseError, KeyError, IndexError, TypeError):
        return False
    return validate_case(case) is None


def shrink(case: dict, still_fails: Callable[[dict], bool], budget_s: float = 120.0,
           log: Callable[[str], None] = None) -> dict:
    """Greedy: take the first smaller valid variant that still fails, repeat."""
    deadline = time.monotonic() + budget_s
    best = _dce(_copy(case))
    if not _valid(best) or not still_fails(best):
        best = case
    progress = True
    while progress and time.monotonic() < deadline:
        progress = False
        for cand in _candidates(best):
            if time.monotonic() > deadline:
                break
            if not cand["nodes"] or not _valid(cand) or _size(cand) >= _size(best):
                continue
            if still_fails(cand):
                best = cand
                progress = True
                if log:
                    log(f"  shrunk to {len(best['nodes'])} ops, {len(best['inputs'])} inputs, "
                        f"{sum(math.prod(i['shape']) for i in best['inputs'])} input elements")
                break
    return best


def _size(case) -> tuple:
    return (len(case["nodes"]), len(case["outputs"]),
            sum(math.prod(i["shape"]) for i in case["inputs"]),
            sum(len(i["shape"]) for i in case["inputs"]),
            sum(bool(i.get("edges")) for i in case["inputs"]),
            sum(i.get("static") != i["shape"] for i in case["inputs"]))


def fails(case: dict, draws: int = 2) -> Optional[CaseResult]:
    """The case's result if it shows a compiler mismatch, else None."""
    r = run_cases([case], draws)[0]
    return r if r.failed else None
