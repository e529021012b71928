"""Session-wide test setup shared by every test file.

One private kernel cache for the whole pytest session, set before anything
compiles: tests that optimize the same cluster share the compiled kernel (and
the FusionStitch op library, ~10 s to build, is built once). A test that needs
an empty cache (e.g. to simulate a compiler failure) sets its own directory and
restores this one afterwards. Other files may add fixtures below.

Under pytest-xdist the workers inherit the first process's directory through
_SHARED_ENV, so they share kernels too (the cache is safe for concurrent
processes), and only that process removes it.
"""

import os
import shutil
import tempfile

_SHARED_ENV = "TF_FUSIONSTITCH_TEST_SESSION_CACHE"
if os.path.isdir(os.environ.get(_SHARED_ENV, "")):
    _SESSION_CACHE, _OWNER = os.environ[_SHARED_ENV], False
else:
    _SESSION_CACHE, _OWNER = tempfile.mkdtemp(prefix="tf_fusionstitch-test-cache-"), True
    os.chmod(_SESSION_CACHE, 0o700)
    os.environ[_SHARED_ENV] = _SESSION_CACHE
_PREVIOUS_CACHE = os.environ.get("TF_FUSIONSTITCH_CACHE_DIR")
os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = _SESSION_CACHE
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SESSION_CACHE_DIR = _SESSION_CACHE


def pytest_unconfigure(config):
    if _PREVIOUS_CACHE is None:
        os.environ.pop("TF_FUSIONSTITCH_CACHE_DIR", None)
    else:
        os.environ["TF_FUSIONSTITCH_CACHE_DIR"] = _PREVIOUS_CACHE
    if _OWNER:
        os.environ.pop(_SHARED_ENV, None)
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


# Files whose tests take minutes each (the whole model zoo): run first, so that
# under `make test`'s workers the short tests fill in behind them rather than
# one worker finishing the last long test alone. The Makefile hands tests out
# two at a time (--maxschedchunk=2), so the zoo is shared between workers.
SLOW_FILES = ("test_zoo.py",)


def pytest_collection_modifyitems(config, items):
    """tf.test.TestCase has a `test_session` context manager that pytest would
    collect and report as 'Not a test' skips, hiding the real skips. Slow
    files go first (SLOW_FILES)."""
    items[:] = [item for item in items if item.name != "test_session"]
    items.sort(key=lambda item: item.path.name not in SLOW_FILES)
