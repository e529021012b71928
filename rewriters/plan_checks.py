"""The plan model's error on this machine (plan_time.py): it predicts TF's
own time for a few small graphs, each of which exercises one of its terms,
and the calibration (cpu_costs.py) measures them:

- "small chain": 256 dependent elementwise ops over 4K elements, each a
  launch and one core's work from its cache (launch-bound: the executor's
  time; long enough to stand above a call's noise);
- "large chain": 8 over 4M elements, each split over all cores
  (bandwidth-bound);
- "matmuls": 4 dependent 512 x 512 matmuls (the matmul flop rate);
- "two small chains": two independent small chains, which TF runs inline,
  one after the other, in the thread that made both ready;
- "matmuls beside a small chain": the small chain shares the cores with the
  matmuls (a one-core kernel takes a core from a matmul for its time);
- "matmuls beside a large chain": both use every core, so their times add.

The plan guard (plan_guard.py) acts on what the model says a change of plan
costs, not on its absolute times: so the error it uses is the model's error
on changes, CHANGES below, each a graph and the same graph with more work
beside it. A change's error is the difference between its predicted and
its measured cost, relative to the measured time of the graph it was made
in (the unit of the guard's predicted gain); `error` is the largest.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
import time
from typing import Callable, Dict, List, Tuple

import numpy as np
import tensorflow as tf

from tf_fusionstitch.rewriters import plan_time, shapes
from tf_fusionstitch.rewriters.graph_view import GraphView

SMALL, LARGE, MATRIX = 1 << 12, 1 << 22, 512
SMALL_CHAIN = 256


@dataclasses.dataclass(frozen=True)
class Check:
    graph: str
    measured_s: float
    predicted_s: float

    @property
    def error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s


def _chain(x, y, length: int):
    for _ in range(length):
        x = x * y   # y an argument: Grappler can neither fold nor merge the chain
    return x


def _matmuls(a, b, count: int = 4):
    for _ in range(count):
        a = tf.matmul(a, b)
    return a


def _graphs() -> Dict[str, Callable]:
    return {
        "small chain": lambda s, t, l, m, a, b: _chain(s, t, SMALL_CHAIN),
        "large chain": lambda s, t, l, m, a, b: _chain(l, m, 8),
        "matmuls": lambda s, t, l, m, a, b: _matmuls(a, b),
        "two small chains": lambda s, t, l, m, a, b: (_chain(s, t, SMALL_CHAIN),
                                                      _chain(t, s, SMALL_CHAIN)),
        "matmuls beside a small chain": lambda s, t, l, m, a, b: (_matmuls(a, b),
                                                                  _chain(s, t, SMALL_CHAIN)),
        "matmuls beside a large chain": lambda s, t, l, m, a, b: (_matmuls(a, b),
                                                                  _chain(l, m, 8)),
    }


def _arguments():
    # numpy, not tf.random.Generator: a generator is a variable, and creating
    # one while a tf.function traces (calibration runs at trace time) makes
    # TF trace that function twice.
    rng = np.random.default_rng(0)
    near_one = lambda shape: tf.constant(rng.uniform(0.999, 1.001, shape).astype(np.float32))
    return (near_one([SMALL]), near_one([SMALL]), near_one([LARGE]), near_one([LARGE]),
            near_one([MATRIX, MATRIX]) / MATRIX, near_one([MATRIX, MATRIX]))


def _median(fn, args, rounds: int = 21) -> float:
    fn(*args)  # trace and warm
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _view(concrete) -> GraphView:
    graph_def = concrete.graph.as_graph_def()
    return GraphView(graph_def, shapes.infer_types(graph_def, {}))


def run(costs: Dict, passes: int = 3) -> List[Check]:
    """Each graph's measured time against the plan model's prediction from
    `costs` (all of BUILTIN's names). Measured: a median less an empty
    call's, taken in `passes` passes over all graphs (a busy moment of a
    shared machine then spoils one pass, not one graph), the median pass."""
    machine = plan_time.Machine.from_costs(costs)
    args = _arguments()
    empty = tf.function(lambda *a: a[0], autograph=False)
    functions = {name: tf.function(body, autograph=False) for name, body in _graphs().items()}
    times = collections.defaultdict(list)
    for _ in range(passes):
        call = _median(empty, args)
        for name, fn in functions.items():
            times[name].append(max(_median(fn, args) - call, 1e-7))  # busy moments can invert them
    checks = []
    for name, fn in functions.items():
        view = _view(fn.get_concrete_function(*args))
        predicted = plan_time.predict(plan_time.Sizes(view), [], machine,
                                      lambda nodes: 0.0).step_s
        checks.append(Check(name, statistics.median(times[name]), predicted))
    return checks


# (graph, the graph with more work beside it): the changes whose cost the
# model's error is measured on.
CHANGES = (("small chain", "two small chains"),
           ("matmuls", "matmuls beside a small chain"),
           ("matmuls", "matmuls beside a large chain"),
           ("large chain", "matmuls beside a large chain"))


def change_errors(checks: List[Check]) -> Dict[Tuple[str, str], float]:
    """Per change of CHANGES, |predicted - measured cost| / measured time
    of the changed graph."""
    by_graph = {c.graph: c for c in checks}
    errors = {}
    for base, changed in CHANGES:
        b, c = by_graph[base], by_graph[changed]
        predicted, measured = c.predicted_s - b.predicted_s, c.measured_s - b.measured_s
        errors[(base, changed)] = abs(predicted - measured) / c.measured_s
    return errors


def error(checks: List[Check]) -> float:
    """The model's largest error on a change (change_errors)."""
    return max(change_errors(checks).values())
