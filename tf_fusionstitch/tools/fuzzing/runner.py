"""The differential runner: several cases optimized as one tf.function with
min_cluster_ops=1, run against TensorFlow on fresh input draws, every output
of every case checked against the oracle's enclosure.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import List, Sequence

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch.tools.fuzzing.checking import check_value, describe
from tf_fusionstitch.tools.fuzzing.inputs import make_inputs
from tf_fusionstitch.tools.fuzzing.oracle import evaluate
from tf_fusionstitch.tools.fuzzing.tf_graph import combined_function


@dataclasses.dataclass
class CaseResult:
    case: dict
    status: str = "ok"          # ok | mismatch | oracle | invalid
    problems: List[str] = dataclasses.field(default_factory=list)
    draw: int = 0               # the draw that failed
    checked: int = 0
    total: int = 0

    @property
    def failed(self) -> bool:
        return self.status == "mismatch"


@dataclasses.dataclass
class BatchStats:
    graphs: int = 0
    kernels: int = 0
    fallbacks: int = 0
    invalid: int = 0
    oracle: int = 0
    checked: int = 0
    total: int = 0
    seconds: float = 0.0


def _to_numpy(t) -> np.ndarray:
    return np.asarray(t.numpy())


def _short(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}"
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[:3])[:600]


def run_cases(cases: Sequence[dict], draws: int = 2, stats: BatchStats = None,
              isolate: bool = True) -> List[CaseResult]:
    """Optimizes all `cases` as one tf.function and checks each case's outputs on
    `draws` fresh input draws. A crash of the batch is attributed by running each
    case alone."""
    stats = stats if stats is not None else BatchStats()
    start = time.perf_counter()
    results = [CaseResult(c) for c in cases]
    draw_inputs = [[make_inputs(c, k) for c in cases] for k in range(draws)]
    f = combined_function(cases)
    try:
        f.get_concrete_function()
        expected = [f(*[tf.constant(v) for per in per_draw for v in per])
                    for per_draw in draw_inputs]
    except Exception as e:          # TF itself refuses the batch: find the invalid case(s)
        if len(cases) == 1 or not isolate:
            for r in results:
                r.status, r.problems = "invalid", [f"TF: {_short(e)}"]
            stats.invalid += len(cases)
            return results
        out = []
        for c in cases:
            out += run_cases([c], draws, stats)
        return out
    opt = fs.optimize(f, min_cluster_ops=1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            actual = [opt(*[tf.constant(v) for per in per_draw for v in per])
                      for per_draw in draw_inputs]
    except Exception as e:
        if len(cases) > 1 and isolate:
            stats.seconds += time.perf_counter() - start
            out = []
            for c in cases:
                out += run_cases([c], draws, stats)
            if not any(r.failed for r in out):   # only the batch crashes: blame all
                for r in out:
                    r.status, r.problems = "mismatch", [f"crash in a batch: {_short(e)}"]
            return out
        for r in results:
            r.status, r.problems = "mismatch", [f"crash: {_short(e)}"]
        stats.graphs += len(cases)
        stats.seconds += time.perf_counter() - start
        return results
    report = opt.report()
    stats.graphs += len(cases)
    if report is not None:
        stats.kernels += sum(c.parts for c in report.fused_clusters)  # packs count per part
        stats.fallbacks += len(report.fallbacks)
    offsets = np.cumsum([0] + [len(c["outputs"]) for c in cases])
    for k in range(draws):
        exp_k = [_to_numpy(t) for t in tf.nest.flatten(expected[k])]
        act_k = [_to_numpy(t) for t in tf.nest.flatten(actual[k])]
        for ci, (case, res) in enumerate(zip(cases, results)):
            if res.status != "ok":
                continue
            env = evaluate(case, draw_inputs[k][ci])
            for oi, name in enumerate(case["outputs"]):
                e, a = exp_k[offsets[ci] + oi], act_k[offsets[ci] + oi]
                iv = env[name]
                where = f"output {name} ({case_op(case, name)}), draw {k}"
                if a.dtype != e.dtype or a.shape != e.shape:
                    res.status, res.draw = "mismatch", k
                    res.problems.append(f"{where}: fused {a.dtype}{list(a.shape)} vs TF "
                                        f"{e.dtype}{list(e.shape)}")
                    continue
                try:
                    tf_v = check_value(iv, e)
                except ValueError as err:
                    res.status, res.draw = "oracle", k
                    res.problems.append(f"{where}: oracle shape: {err}")
                    continue
                fs_v = check_value(iv, a)
                res.checked += fs_v.checked
                res.total += fs_v.total
                if tf_v.bad.any():
                    # the enclosure does not hold TF's own result: the oracle is wrong
                    res.status, res.draw = "oracle", k
                    res.problems.append(f"{where}: TF outside the oracle's enclosure: "
                                        + describe(iv, e, a, tf_v.bad))
                compiler = fs_v.bad & ~tf_v.bad
                if compiler.any():
                    if res.status == "ok" or res.status == "oracle":
                        res.status, res.draw = "mismatch", k
                    res.problems.append(f"{where}: " + describe(iv, e, a, compiler))
    for r in results:
        stats.checked += r.checked
        stats.total += r.total
        stats.oracle += r.status == "oracle"
    stats.seconds += time.perf_counter() - start
    return results


def case_op(case, name) -> str:
    for n in case["nodes"]:
        if n["name"] == name:
            return n["op"]
    return "input"
