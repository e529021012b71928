"""A progress bar for compilations that take a while (TF-free).

tqdm's bar on stderr, shown only once `DELAY_S` have passed and only when
stderr is a terminal: a short rewrite, a test log or a batch job print nothing.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from tqdm import tqdm

DELAY_S = 2.0


@contextlib.contextmanager
def kernels_bar(total: int, what: str = "tf_fusionstitch: compiling kernels") -> Iterator[tqdm]:
    """A bar of `total` kernels (`bar.update(n)` as n finish), with the
    elapsed time; quiet when stderr is not a terminal (tqdm's disable=None)."""
    with tqdm(total=total, desc=what, unit="kernel", delay=DELAY_S, disable=None,
              file=sys.stderr, leave=False, dynamic_ncols=True) as bar:
        yield bar
