"""benchmarks/median_interval.py: the order-statistic interval the benchmarks
use to say whether one contender is slower than another; and rounds.py's summary
of it over processes."""

import sys

import numpy as np
import pytest

import repo_paths

sys.path.insert(0, str(repo_paths.BENCHMARKS))
from median_interval import median_interval  # noqa: E402
import rounds  # noqa: E402


def test_too_few_values_give_no_interval():
    # five values: all on one side of the median with probability 1/16 > 5%
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None
    assert median_interval([]) is None


def test_six_values_give_the_extremes():
    # 1 - 2/64 = 0.969 >= 0.95 with j = 1; j = 2 gives 1 - 14/64 < 0.95
    assert median_interval([6.0, 1.0, 5.0, 2.0, 4.0, 3.0]) == (1.0, 6.0)


def test_known_order_statistics_for_twenty_values():
    # n = 20: P(Bin(20, 1/2) <= 5) = 0.0207, <= 6 is 0.0577: j = 6, the 6th
    # smallest and the 6th largest (coverage 0.9586)
    values = list(range(100, 120))
    assert median_interval(values) == (105, 114)
    # at 0.5: j = 8 covers 0.737, j = 9 only 0.497
    assert median_interval(values, level=0.5) == (107, 112)


def test_interval_holds_the_median_as_often_as_promised():
    # skewed noise (what a busy machine gives): the true median is 1.0 * exp(0)
    rng = np.random.default_rng(0)
    trials, hits = 2000, 0
    for _ in range(trials):
        sample = np.exp(rng.standard_normal(25) * 0.5) + rng.exponential(0.2, 25)
        lo, hi = median_interval(sample.tolist())
        hits += lo <= TRUE_MEDIAN <= hi
    assert hits / trials >= 0.94  # promised 0.957 for n = 25


def _true_median():
    rng = np.random.default_rng(1)
    big = np.exp(rng.standard_normal(2_000_000) * 0.5) + rng.exponential(0.2, 2_000_000)
    return float(np.median(big))


TRUE_MEDIAN = _true_median()


def test_bad_level_is_refused():
    with pytest.raises(ValueError, match="level"):
        median_interval([1.0] * 10, level=1.0)


def test_the_summary_over_processes_takes_each_processs_median_ratio():
    # process medians of base/other: 2.0 (rounds 2, 2, 2), 1.0 (2/2, 3/3) and 0.5
    processes = [([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]), ([2.0, 3.0], [2.0, 3.0]),
                 ([1.0], [2.0])]
    assert rounds.process_ratio_summary(processes) == (1.0, (0.5, 2.0), None)
    # seven processes: the 95% interval of their median is their range (order statistics)
    seven = [([1.0 + i / 100], [1.0]) for i in range(7)]
    mid, (lowest, highest), interval = rounds.process_ratio_summary(seven)
    assert (mid, lowest, highest) == (1.03, 1.0, 1.06)
    assert interval == (1.0, 1.06)
