"""Interleaved timing rounds, and the round-by-round ratio of two contenders.

One round calls every contender once, in a new random order (shuffled rather than
rotated, so that no contender always runs right after the same other one). Within a
round all ran under the same load: the per-round ratio of two contenders cancels a busy
machine's drift, which the ratio of their medians does not.
"""

import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from median_interval import median_interval


def time_rounds(calls: Dict[str, Callable], args: Sequence, rounds: int, warmup: int,
                seed: int = 2) -> Tuple[Dict[str, List[float]], Dict[str, List[float]]]:
    """Per contender, the wall and process CPU seconds of each timed call (rounds after
    `warmup` untimed ones); each time is one call whose result is not copied out."""
    wall = {label: [] for label in calls}
    cpu = {label: [] for label in calls}
    order = np.random.default_rng(seed)
    for r in range(warmup + rounds):
        for label in order.permutation(list(calls)):
            c0, t0 = time.process_time(), time.perf_counter()
            calls[label](*args)
            if r >= warmup:
                wall[label].append(time.perf_counter() - t0)
                cpu[label].append(time.process_time() - c0)
    return wall, cpu


def ratio_summary(base: Sequence[float], other: Sequence[float]
                  ) -> Tuple[Tuple[float, float, float], Optional[Tuple[float, float]]]:
    """base's time over other's, round by round: its quartiles (25, 50, 75) and the
    median's 95% interval (None with fewer than six rounds). Above 1x: other is faster."""
    ratios = [b / o for b, o in zip(base, other)]
    quartiles = tuple(float(q) for q in np.percentile(ratios, [25, 50, 75]))
    return quartiles, median_interval(ratios)


def process_ratio_summary(processes: Sequence[Tuple[Sequence[float], Sequence[float]]]
                          ) -> Tuple[float, Tuple[float, float], Optional[Tuple[float, float]]]:
    """`processes`: per process, (base's times, other's times), round by round. Each
    process's median round ratio is one sample of what a process gets: their median,
    their range and the 95% interval of that median over processes (None with fewer
    than six). It holds the spread between instances of a plan, which one process's
    rounds cannot."""
    medians = [ratio_summary(base, other)[0][1] for base, other in processes]
    return (float(np.median(medians)), (min(medians), max(medians)),
            median_interval(medians))
