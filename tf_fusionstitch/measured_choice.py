"""Keeping the faster of the fused and the original function, by measurement.

Where no rule of the rewrite can tell whether its plan beats TF's own on this
machine (a kernel that keeps TF's remapper from fusing a bias into a matmul,
thread-pool effects on two cores), the first calls can: with
`optimize(fn, measured_choice=N)` each version of the function runs its first
calls alternately fused and original, one untimed call of each (the fused one
traces and rewrites) and then N timed ones of each, and keeps the one whose
time is lower in most pairs of consecutive calls. Both compute the same
function, so every call does the work the caller asked for, once. The report
says which was kept and by what margin.

TF-free: only the clock and the bookkeeping.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Callable, List, Optional

FUSED, ORIGINAL = "fused", "original"


class MeasuredChoice:
    """Which of the two to run next, the times so far, and the decision."""

    def __init__(self, calls_each: int, clock: Callable[[], float] = time.perf_counter):
        if calls_each < 1:
            raise ValueError("calls_each must be at least 1")
        self.calls_each = calls_each
        self.clock = clock
        self._lock = threading.Lock()
        self._warm = {FUSED: False, ORIGINAL: False}
        self._times = {FUSED: [], ORIGINAL: []}
        self._next = FUSED
        self.choice: Optional[str] = None

    def next_contender(self) -> str:
        """FUSED or ORIGINAL: the kept one once decided, else whose turn it is."""
        with self._lock:
            return self.choice or self._next

    def record(self, contender: str, seconds: float) -> None:
        """One finished call of `contender` that took `seconds`."""
        with self._lock:
            if self.choice is not None:
                return
            if not self._warm[contender]:
                self._warm[contender] = True       # first calls trace: not timed
            else:
                self._times[contender].append(seconds)
            self._next = ORIGINAL if contender == FUSED else FUSED
            if all(len(t) >= self.calls_each for t in self._times.values()):
                self.choice = ORIGINAL if self.ratio() > 1.0 else FUSED

    def ratio(self) -> float:
        """The median over pairs of the fused call's time over the original's."""
        pairs = list(zip(self._times[FUSED], self._times[ORIGINAL]))
        return statistics.median(f / o for f, o in pairs) if pairs else float("nan")

    def summary(self) -> str:
        fused, original = self._times[FUSED], self._times[ORIGINAL]
        return (f"measured choice: runs the {self.choice} function (median over "
                f"{len(fused)} pairs of calls of the fused time over the original's "
                f"{self.ratio():.3f}; medians {1e3 * statistics.median(fused):.3g} ms fused, "
                f"{1e3 * statistics.median(original):.3g} ms original)")

    def times(self, contender: str) -> List[float]:
        return list(self._times[contender])
