"""A distribution-free confidence interval for a median, from order statistics.

The benchmarks compare contenders round by round (one call of each per round,
so both ran under the same load); whether fs is slower than xla_like is then a
question about the median of the per-round ratios. With n rounds, the number
of rounds below the true median is Binomial(n, 1/2) whatever the noise looks
like, so the j-th smallest and j-th largest ratio bound the median with
probability 1 - 2 P(Bin(n, 1/2) < j). No normality is assumed: a busy
machine's times are skewed.
"""

from math import comb
from typing import Optional, Sequence, Tuple


def median_interval(values: Sequence[float], level: float = 0.95
                    ) -> Optional[Tuple[float, float]]:
    """The narrowest order-statistic interval that holds the median of the
    distribution `values` came from with probability at least `level`; None
    when there are too few values for any (five or fewer at 0.95)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be between 0 and 1, got {level}")
    n = len(values)
    ordered = sorted(values)
    below = 0.0   # P(Bin(n, 1/2) < j), for the j tried
    best = None
    for j in range(1, n // 2 + 1):
        # [x_(j), x_(n+1-j)] misses the median when fewer than j values lie
        # on one side of it: probability 2 P(Bin < j).
        below += comb(n, j - 1) / 2.0 ** n
        if 1.0 - 2.0 * below < level:
            break
        best = (ordered[j - 1], ordered[n - j])
    return best
