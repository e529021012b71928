"""Rewriting on a thread while the first calls run the original function.

A cold first call of an optimized train step pays the rewrite and the C++
compiler on top of TF's own tracing: 2-4x TF's first call on the zoo's
keras.applications CNNs (benchmarks/first_call.py). With
`optimize(fn, background=True)` the first call starts the rewrite of the
version that call would run (OptimizedFunction.prepare) on a thread and runs
the original function itself, and so does every call until that rewrite is
done; from then on calls run the optimized function. The two compute the
same function, each within the numerics contract, so a caller sees results
of one or the other. A call made while another tf.function is being traced
waits for the rewrite instead: that outer graph is built once and should
hold the optimized version.

TF-free: a thread and its state.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional


class BackgroundRewrite:
    """One rewrite on a thread, started by the first call."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None
        self._done = threading.Event()

    def pending(self, prepare: Callable[[], object]) -> bool:
        """Whether calls still run the original: the first call starts
        `prepare` on a thread; False once it has finished."""
        if self._done.is_set():
            return False
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, args=(prepare,),
                                                name="tf_fusionstitch-rewrite", daemon=True)
                self._thread.start()
        return not self._done.is_set()

    def _work(self, prepare: Callable[[], object]) -> None:
        try:
            prepare()
        except Exception:  # noqa: BLE001  (an error of the user's function: the calls
            pass           # after this one trace it again and raise it as TF does)
        finally:
            self._done.set()

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Waits for a started rewrite to finish; True when none is running."""
        with self._lock:
            started = self._thread is not None
        return self._done.wait(timeout) if started else True
