"""The model tests build whole third-party models (tests/models/test_zoo.py):
a Keras model, its optimizer and their traced functions hold one another in
reference cycles, which only the cyclic collector frees, so each test ends
with a collection.

Even so a test worker's memory grows with every model it builds (to 10 GB
per worker over the zoo in one CI run, on a 24 GB machine): `make test`
runs these tests in parts, each in pytest-xdist workers of their own that
exit with what they hold. TF_FUSIONSTITCH_TEST_MODEL_PART=K/N keeps part K
of N (every N-th test by node id); unset, every test runs.
"""

import gc
import os
import pathlib

import pytest

PART_ENV = "TF_FUSIONSTITCH_TEST_MODEL_PART"


def _part():
    text = os.environ.get(PART_ENV, "")
    if not text:
        return None
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        k = n = 0
    if not 1 <= k <= n:
        raise pytest.UsageError(f"{PART_ENV}={text!r}: expected K/N with 1 <= K <= N, e.g. 1/2")
    return k, n


def pytest_collection_modifyitems(config, items):
    part = _part()
    if part is None:
        return
    k, n = part
    here = pathlib.Path(__file__).parent
    models = sorted(item.nodeid for item in items if here in item.path.parents)
    not_mine = set(models) - set(models[k - 1::n])
    dropped = [item for item in items if item.nodeid in not_mine]
    config.hook.pytest_deselected(items=dropped)
    items[:] = [item for item in items if item not in dropped]


@pytest.fixture(autouse=True)
def collect_the_models_built():
    yield
    gc.collect()
