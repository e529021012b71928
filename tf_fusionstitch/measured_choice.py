"""Keeping the fastest of a few functions that compute the same thing, by
measurement.

Where no rule of the rewrite can tell whether its plan beats TF's own on this
machine (a kernel that keeps TF's remapper from fusing a bias into a matmul,
thread-pool effects on two cores), the first calls can: with
`optimize(fn, measured_choice=N)` each version of the function runs its first
calls alternately fused and original, one untimed call of each (the fused one
traces and rewrites) and then N timed ones of each, rounded up to whole
cycles (below), and keeps the faster. Both compute the same function, so
every call does the work the caller asked for, once. The report says which
was kept and by what margin.

The calls go round by round, and round r starts with contender r (mod their
number), so a cycle of as many rounds as contenders puts each contender once
in each place of a round. A call's place moves its time by more than the
plans differ: on BERT's train step (2 cores), with two plans alternating so
that a round's first call follows a call of the same plan, that call measured
about 5% slower than the round's second in 17 of 24 rounds, whichever plan
it was, so a round's ratio moved by about 10% with the order. The decision
is therefore per cycle, where the place cancels: a cycle's ratio is the
geometric mean over its rounds of the fused call's time over the other's,
and a contender is kept over the fused function when the median over cycles
of that ratio is above 1, the largest such median winning.

fusion="explore" adds XLA's rule plan as a contender (options.measured_plans):
where the plan model cannot tell the explored plan from the rule plans, the
first calls do.

A function that draws random numbers from ops whose state lives in the op's
kernel (tf.random.uniform with an op seed, not a tf.random.Generator or
Keras' seed generators, whose state is a variable) is not timed: each
contender is another function with kernels of its own, so its first calls
would draw the numbers the other's first calls drew.

TF-free: only the clock and the bookkeeping.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence

FUSED, ORIGINAL, XLA_RULES = "fused", "original", "XLA-rule plan"

# Random ops that keep their generator's state in the kernel instance.
KERNEL_STATE_RANDOM_OPS = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomGamma", "RandomPoisson", "RandomPoissonV2",
    "RandomShuffle", "Multinomial", "RandomCrop"})


def untimeable(op_types: Iterable[str]) -> str:
    """Why a function with ops of `op_types` cannot be timed against another
    function computing the same ("" if it can)."""
    drawn = sorted(KERNEL_STATE_RANDOM_OPS.intersection(op_types))
    if not drawn:
        return ""
    return (f"measured choice: off: the function draws random numbers with "
            f"{', '.join(drawn)}, whose state is in the op, so another function's first "
            f"calls would draw the same numbers again")


def timed_rounds(calls_each: int, contenders: int) -> int:
    """Rounds timed for `calls_each` timed calls of each of `contenders`:
    rounded up to whole cycles, each contender once in each place."""
    return -(-calls_each // contenders) * contenders


def calls_to_decide(calls_each: int, contenders: int) -> int:
    """Calls a measured choice takes before it has decided: an untimed
    round, then the timed ones."""
    return contenders * (1 + timed_rounds(calls_each, contenders))


class MeasuredChoice:
    """Which contender to run next, the times so far, and the decision.
    `contenders`: the first is the fused function, kept on ties."""

    def __init__(self, calls_each: int, clock: Callable[[], float] = time.perf_counter,
                 contenders: Sequence[str] = (FUSED, ORIGINAL)):
        if calls_each < 1:
            raise ValueError("calls_each must be at least 1")
        if len(contenders) < 2 or len(set(contenders)) != len(contenders):
            raise ValueError(f"a measured choice needs two or more distinct contenders, "
                             f"got {list(contenders)}")
        self.rounds = timed_rounds(calls_each, len(contenders))
        self.clock = clock
        self.contenders = tuple(contenders)
        self._lock = threading.Lock()
        self._warm = {c: False for c in self.contenders}
        self._times: Dict[str, List[float]] = {c: [] for c in self.contenders}
        self._calls = 0   # calls recorded so far, all contenders
        self.choice: Optional[str] = None

    def next_contender(self) -> str:
        """The kept contender once decided, else whose turn it is."""
        with self._lock:
            return self.choice or self._turn(self._calls)

    def record(self, contender: str, seconds: float) -> None:
        """One finished call of `contender` that took `seconds`."""
        with self._lock:
            if self.choice is not None:
                return
            if not self._warm[contender]:
                self._warm[contender] = True       # first calls trace: not timed
            else:
                self._times[contender].append(seconds)
            self._calls += 1
            if all(len(t) >= self.rounds for t in self._times.values()):
                self.choice = self._fastest()

    def _turn(self, call: int) -> str:
        """Whose turn call number `call` is. Round r starts with contender r
        (mod their number): the first calls of a process tend to get faster,
        and one contender always running later would gain from that."""
        k = len(self.contenders)
        round_, place = divmod(call, k)
        return self.contenders[(round_ + place) % k]

    def _fastest(self) -> str:
        ratios = {c: self.ratio(c) for c in self.contenders[1:]}
        best = max(ratios, key=ratios.get)
        return best if ratios[best] > 1.0 else self.contenders[0]

    def ratio(self, other: Optional[str] = None) -> float:
        """The median over whole cycles of the fused call's time over
        `other`'s (default: the second contender), each cycle's ratio the
        geometric mean of its rounds'; above 1, `other` was faster."""
        other = other or self.contenders[1]
        rounds = [f / o for f, o in zip(self._times[self.contenders[0]], self._times[other])]
        k = len(self.contenders)
        cycles = [math.prod(rounds[i:i + k]) ** (1.0 / k)
                  for i in range(0, len(rounds) - k + 1, k)]
        return statistics.median(cycles) if cycles else float("nan")

    def summary(self) -> str:
        first = self.contenders[0]
        ratios = "; ".join(f"{self.ratio(c):.3f} over the {c}'s" for c in self.contenders[1:])
        medians = ", ".join(f"{1e3 * statistics.median(self._times[c]):.3g} ms {c}"
                            for c in self.contenders)
        cycles = len(self._times[first]) // len(self.contenders)
        return (f"measured choice: runs the {self.choice} function (median over "
                f"{cycles} cycles of {len(self.contenders)} rounds of calls of the {first} "
                f"time: {ratios}; "
                f"medians {medians})")

    def times(self, contender: str) -> List[float]:
        return list(self._times[contender])
