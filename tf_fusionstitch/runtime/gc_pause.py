"""Python's cyclic garbage collector paused while a rewrite runs (and while its plan is imported).

A rewrite allocates millions of small, short-lived objects (graph views,
lowered clusters, schedules), and each few hundred allocations start a
collection that walks the young objects, now and then all of them, with
TensorFlow's and Keras' long-lived ones among them. On a GPT-2 train step
that was 0.7 s of a 6.7 s first call. Reference counting still frees
everything that is not in a cycle; cycles made during the pause wait for the
first collection after it.

Pauses nest and may overlap across threads (a background rewrite beside the
caller's): the collector is enabled again when the last one ends, and only
if it was enabled when the first began. The pause is the process's: under
optimize(..., background=True) the caller's own steps run without cyclic
collection until the rewrite is done.
"""

from __future__ import annotations

import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0
_resume = False   # whether the collector was enabled when the first pause began


@contextlib.contextmanager
def paused():
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
