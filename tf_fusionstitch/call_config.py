"""The session config an optimized function's eager calls run under.

TensorFlow runs its meta-optimizer on a function when it first instantiates
it, by default two rounds of every pass. A rewritten trace has already been
through the rounds that simplify (rewriters/grappler.py), and a second round
over the rewritten graph finds nothing: on EfficientNetB0's train step the
first round removed about 1,250 nodes and fused 33, the second changed none and
took 0.3 s of each new trace's first call. So a rewritten function runs
under the caller's own config with one round, unless the caller chose a
number of rounds. Every pass TF would run still runs, in TF's order.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Optional, Tuple

from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

_ONE = rewriter_config_pb2.RewriterConfig.ONE
_DEFAULT = rewriter_config_pb2.RewriterConfig.DEFAULT_NUM_ITERS

_lock = threading.Lock()
_derived: Optional[Tuple[bytes, context.FunctionCallOptions]] = None


def one_round(serialized: bytes) -> config_pb2.ConfigProto:
    """The ConfigProto `serialized`, with the meta-optimizer at one round
    where it had TF's default; rounds the caller chose are kept."""
    config = config_pb2.ConfigProto.FromString(serialized)
    rewrite = config.graph_options.rewrite_options
    if rewrite.meta_optimizer_iterations == _DEFAULT:
        rewrite.meta_optimizer_iterations = _ONE
    return config


def _options_for(current: context.FunctionCallOptions) -> context.FunctionCallOptions:
    global _derived
    serialized = current.config_proto_serialized
    if serialized is None:   # TF's own fallback then: every rewriter off
        return current
    with _lock:
        if _derived is None or _derived[0] != serialized:
            derived = context.FunctionCallOptions(executor_type=current.executor_type,
                                                  config_proto=one_round(serialized))
            _derived = (serialized, derived)
        return _derived[1]


@contextlib.contextmanager
def rewritten_calls() -> Iterator[None]:
    """Eager function calls on this thread, inside the block, run under
    one_round of the thread's current options. Outside eager execution (a
    call traced into another function) it changes nothing: that function is
    optimized as a whole, under its own caller's config."""
    if not context.executing_eagerly():
        yield
        return
    ctx = context.context()
    current = ctx.function_call_options
    ctx.function_call_options = _options_for(current)
    try:
        yield
    finally:
        ctx.function_call_options = current
