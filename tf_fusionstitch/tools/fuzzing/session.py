"""A fuzzing session: generate cases, run them in batches, shrink and save
every mismatch once per failure signature (`fuzz`, driven by
`python -m tf_fusionstitch.tools.fuzz`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable, Dict, List, Optional, Tuple

from tf_fusionstitch.tools.fuzzing.case_types import infer_types
from tf_fusionstitch.tools.fuzzing.generator import case_seed, generate_case
from tf_fusionstitch.tools.fuzzing.ops import CaseError
from tf_fusionstitch.tools.fuzzing.regressions import save_regression
from tf_fusionstitch.tools.fuzzing.reproducer import to_python
from tf_fusionstitch.tools.fuzzing.runner import BatchStats, CaseResult, case_op, run_cases
from tf_fusionstitch.tools.fuzzing.shrinking import fails, shrink


@dataclasses.dataclass
class Finding:
    case: dict
    result: CaseResult
    path: Optional[pathlib.Path]
    duplicate_of: str = ""


def failure_signature(case: dict, result: CaseResult) -> str:
    """Ops of the (minimal) case and the kind of failure: two findings with the same
    signature are most likely one bug, and only the first is saved."""
    text = " ".join(result.problems)
    kind = "crash" if "crash" in text else ("shape" if " vs TF " in text else "values")
    dyn = any(i.get("static") != i["shape"] for i in case["inputs"])
    return f"{kind}:{'dynamic:' if dyn else ''}{','.join(sorted({n['op'] for n in case['nodes']}))}"


def _quick_signature(case: dict, result: CaseResult) -> str:
    """Before shrinking: failure kind, dynamic signature or not, and the failing
    output's op and dtype. A repeat is not shrunk again (shrinking costs a minute)."""
    text = result.problems[0] if result.problems else ""
    kind = "crash" if "crash" in text else ("shape" if " vs TF " in text else "values")
    dyn = any(i.get("static") != i["shape"] for i in case["inputs"])
    if kind != "values":
        return f"{kind}:{dyn}"
    name = text.split(" ", 2)[1] if text.startswith("output ") else ""
    try:
        dtype = infer_types(case)[name][0]
    except (CaseError, KeyError):
        dtype = "?"
    return f"{kind}:{dyn}:{case_op(case, name)}:{dtype}"


def fuzz(graphs: int, seed: int, batch: int = 8, draws: int = 2, shrink_budget_s: float = 90.0,
         regressions_dir=None, save: bool = True, time_limit_s: float = 0.0,
         log: Callable[[str], None] = print,
         first: int = 0) -> Tuple[BatchStats, List[Finding], List[CaseResult]]:
    """Generates cases first .. first + graphs - 1 of `seed`, runs them in
    batches, shrinks and saves every mismatch (one file per failure signature).
    Returns (stats, findings, oracle problems)."""
    stats = BatchStats()
    findings: List[Finding] = []
    oracle: List[CaseResult] = []
    seen: Dict[str, str] = {}
    quick: Dict[str, str] = {}
    start = time.monotonic()
    index, graphs = first, first + graphs
    while index < graphs:
        if time_limit_s and time.monotonic() - start > time_limit_s:
            log(f"time limit reached after {index - first} graphs")
            break
        n = min(batch, graphs - index)
        cases = [generate_case(case_seed(seed, index + k)) for k in range(n)]
        origins = [f"--seed={seed} graph {index + k}" for k in range(n)]
        index += n
        results = run_cases(cases, draws, stats)
        if ((index - first) // batch) % 10 == 0:
            wall = time.monotonic() - start
            log(f"... {stats.graphs} graphs, {stats.kernels} kernels, {len(findings)} "
                f"mismatches, {len(oracle)} oracle problems, {wall:.0f} s")
        for c, origin, r in zip(cases, origins, results):
            if r.status == "oracle":
                oracle.append(r)
                log(f"oracle problem ({origin}): " + "; ".join(r.problems[:2]))
            if not r.failed:
                continue
            log(f"MISMATCH ({origin}): " + "; ".join(r.problems[:3]))
            q = _quick_signature(c, r)
            if q in quick:
                log(f"  like {quick[q]} ({q}): not shrunk again")
                findings.append(Finding(c, r, None, quick[q]))
                continue
            small, final = c, r
            if shrink_budget_s > 0:
                small = shrink(c, lambda cand: fails(cand, draws) is not None,
                               shrink_budget_s, log=log)
                final = fails(small, draws)
                if final is None:             # flaky: keep the original
                    small, final = c, r
            sig = failure_signature(small, final)
            path = None
            if sig in seen:
                log(f"  same failure signature as {seen[sig]}: not saved again")
                findings.append(Finding(small, final, None, seen[sig]))
            else:
                if save:
                    path = save_regression(small, final, regressions_dir, origin)
                seen[sig] = str(path or origin)
                findings.append(Finding(small, final, path))
            quick[q] = seen[sig]
            log(f"minimal case ({len(small['nodes'])} ops)" + (f", saved to {path}" if path else "")
                + ":\n" + json.dumps(small) + "\n" + "\n".join(final.problems[:4]) + "\n"
                + to_python(small, final.draw))
    return stats, findings, oracle
