"""A trace's GraphDef after Grappler, with its tensor types, computed once per trace.

Several rewrites can start from one trace: the CPU and the GPU target's,
explore's plan and the XLA-rule plan its first calls are timed against
(options.measured_plans), and each size version of a tf.function whose trace
is shape-generic. Grappler and TF's shape inference are the dearest part of
that start (NASNetMobile's train step under cProfile: 4.5 s and 3.2 s of a
26 s rewrite), and they depend only on the trace and on whether Grappler
runs. So the result is kept for the few latest traces whose graphs still
live (a weak reference), and every rewrite gets its own copy: the passes edit
both in place.
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Dict, Sequence, Tuple

import tensorflow as tf

from tf_fusionstitch.rewriters import grappler, shapes

# Traces kept: enough for a function's CPU and GPU rewrites of its inference and
# train step; each holds a GraphDef and a type per tensor.
KEPT = 4

_lock = threading.Lock()
_kept: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
computed = 0   # how many times Grappler and shape inference ran (what tests count)


def optimized_and_typed(graph, graph_def, fetches: Sequence[str],
                        hints: Dict[str, tf.TensorSpec], run_grappler: bool
                        ) -> Tuple[tf.compat.v1.GraphDef, dict]:
    """(GraphDef, {tensor: ir.TensorType or None}) of trace `graph`, whose
    GraphDef is `graph_def`: after Grappler (keeping `fetches`) if
    `run_grappler`, typed by shapes.infer_types with `hints`. Both are the
    caller's to edit."""
    global computed
    key = (id(graph), tuple(fetches), bool(run_grappler))
    with _lock:
        entry = _kept.get(key)
        if entry is not None and entry[0]() is graph:
            _kept.move_to_end(key)
            found = entry[1:]
        else:
            found = None
    if found is None:
        if run_grappler:
            optimized = grappler.run_grappler(graph_def, graph, list(fetches))
        else:   # kept apart from the caller's, which it may edit
            optimized = tf.compat.v1.GraphDef()
            optimized.CopyFrom(graph_def)
        found = (optimized, shapes.infer_types(optimized, hints))
        with _lock:
            computed += 1
            for dead in [k for k, e in _kept.items() if e[0]() is None]:
                del _kept[dead]   # a trace gone: its GraphDef goes with it
            _kept[key] = (weakref.ref(graph), *found)
            _kept.move_to_end(key)
            while len(_kept) > KEPT:
                _kept.popitem(last=False)
    optimized, types = found
    copy = tf.compat.v1.GraphDef()
    copy.CopyFrom(optimized)
    return copy, dict(types)


def clear() -> None:
    """Forgets every kept trace."""
    with _lock:
        _kept.clear()
