"""The model tests build whole third-party models (tests/models/test_zoo.py):
a Keras model, its optimizer and their traced functions hold one another in
reference cycles, which only the cyclic collector frees, so each test ends
with a collection.

Even so a test worker's memory grows with every model it builds (to 10 GB
per worker over the zoo in one CI run, on a 24 GB machine): `make test`
runs these tests in parts, each in pytest-xdist workers of their own that
exit with what they hold. TF_FUSIONSTITCH_TEST_MODEL_PART=K/N keeps part K
of N; unset, every test runs.

The parts are balanced by each test's measured time (durations.json, seconds
in a `make test` run with two workers; a test it does not list counts as its
fastest entry, since it lists the slowest ones): the slowest test goes to the
part with the least time so far, and each part runs its slowest tests first,
so no worker is left alone with one long test at the end. Setting
TF_FUSIONSTITCH_TEST_DURATIONS_OUT=path records the times of a run into that
file (merged with what it holds), from which durations.json is refreshed.
"""

import gc
import json
import os
import pathlib

import pytest

PART_ENV = "TF_FUSIONSTITCH_TEST_MODEL_PART"
DURATIONS_OUT_ENV = "TF_FUSIONSTITCH_TEST_DURATIONS_OUT"
_HERE = pathlib.Path(__file__).parent
_recorded = {}


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


def _key(nodeid: str) -> str:
    """A test's id relative to this folder (durations.json's keys)."""
    return nodeid.split("tests/models/", 1)[-1]


def _durations():
    measured = json.loads((_HERE / "durations.json").read_text())
    unknown = min(measured.values(), default=1.0)
    return lambda nodeid: measured.get(_key(nodeid), unknown)


def balanced_parts(nodeids, duration, n):
    """`nodeids` in n parts of about equal time, each slowest first."""
    parts, totals = [[] for _ in range(n)], [0.0] * n
    for nodeid in sorted(nodeids, key=lambda i: (-duration(i), i)):
        least = totals.index(min(totals))
        parts[least].append(nodeid)
        totals[least] += duration(nodeid)
    return parts


def pytest_collection_modifyitems(config, items):
    part = _part()
    if part is None:
        return
    k, n = part
    duration = _durations()
    models = [item.nodeid for item in items if _HERE in item.path.parents]
    mine = balanced_parts(models, duration, n)[k - 1]
    order = {nodeid: rank for rank, nodeid in enumerate(mine)}
    others = set(models) - set(mine)
    dropped = [item for item in items if item.nodeid in others]
    config.hook.pytest_deselected(items=dropped)
    kept = [item for item in items if item.nodeid not in others]
    items[:] = sorted(kept, key=lambda item: order.get(item.nodeid, len(order)))


def pytest_runtest_logreport(report):
    if report.when == "call" and os.environ.get(DURATIONS_OUT_ENV):
        _recorded[_key(report.nodeid)] = round(report.duration)


def pytest_sessionfinish(session):
    path = os.environ.get(DURATIONS_OUT_ENV)
    if not path or hasattr(session.config, "workerinput") or not _recorded:
        return   # (xdist workers report to the controller, which writes)
    out = pathlib.Path(path)
    merged = json.loads(out.read_text()) if out.exists() else {}
    merged.update(_recorded)
    out.write_text(json.dumps(dict(sorted(merged.items(), key=lambda kv: -kv[1])), indent=1)
                   + "\n")


@pytest.fixture(autouse=True)
def collect_the_models_built():
    yield
    gc.collect()
