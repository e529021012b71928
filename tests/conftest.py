"""Session-wide test setup shared by every test file: the markers each test
gets (core, tf, slow; gpu turned into a skip where no GPU is) and one kernel
cache for the session.

One private kernel cache for the whole pytest session, set before anything
compiles: tests that optimize the same cluster share the compiled kernel (and
the FusionStitch op library, ~10 s to build, is built once). A test that needs
an empty cache (e.g. to simulate a compiler failure) sets its own directory and
restores this one afterwards. Other files may add fixtures below.

Under pytest-xdist the workers inherit the first process's directory through
_SHARED_ENV, so they share kernels too (the cache is safe for concurrent
processes), and only that process removes it.
"""

import importlib.util
import os
import shutil
import tempfile

import pytest

import gpu_device
import import_graph

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


# The markers every test gets here (pyproject.toml registers them):
# - `core`: the test file imports nothing of TensorFlow's stack, through the
#   package, the benchmarks and the tests' helpers (import_graph.py reads the
#   imports; those in function bodies run only when called and do not count);
#   `pytest -m core` runs on a machine without TensorFlow (`make test` runs
#   them so). A file whose TensorFlow use is in a subprocess (a benchmark
#   script run end to end) says `pytestmark = pytest.mark.tf` itself.
# - `tf`: every other test.
# - `gpu`: set by the test itself: it needs a CUDA device, and is skipped
#   with the reason where there is none.
# - `slow`: the files below, whose tests take minutes each (the model zoo,
#   whole reference models): they run first, so that under `make test`'s
#   workers the short tests fill in behind them rather than one worker
#   finishing the last long test alone (the Makefile hands tests out two at a
#   time, so the slow ones are shared between workers). `-m "not slow"` is
#   the quick run.
SLOW_FILES = ("test_zoo.py",)
KINDS = ("core", "tf")

_tensorflow_reach = import_graph.TensorFlowReach()
_TENSORFLOW_INSTALLED = importlib.util.find_spec("tensorflow") is not None
_not_collected: list = []


def _kind(path) -> str:
    return "tf" if _tensorflow_reach(path) else "core"


def pytest_ignore_collect(collection_path, config):
    """Without TensorFlow, files that need it are not imported (they would
    fail to): `pytest -m core` is the run for such a machine."""
    if _TENSORFLOW_INSTALLED or collection_path.suffix != ".py" \
            or not collection_path.name.startswith("test_"):
        return None
    if _kind(collection_path) == "core":
        return None
    if not config.option.markexpr:
        raise pytest.UsageError(
            f"{collection_path.name} needs TensorFlow, which is not installed here: run "
            "`pytest -m core` for the TF-free tests, or `make test` for all of them")
    _not_collected.append(collection_path.name)
    return True


def pytest_collection_modifyitems(config, items):
    """tf.test.TestCase has a `test_session` context manager that pytest would
    collect and report as 'Not a test' skips, hiding the real skips. Each test
    gets its kind (and `slow`), and slow files go first."""
    items[:] = [item for item in items if item.name != "test_session"]
    for item in items:
        if not any(item.get_closest_marker(kind) for kind in KINDS):
            item.add_marker(_kind(item.path))
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") and not gpu_device.gpu_count():
            item.add_marker(pytest.mark.skip(reason=gpu_device.NO_GPU))
    items.sort(key=lambda item: item.path.name not in SLOW_FILES)


def pytest_terminal_summary(terminalreporter):
    if _not_collected:
        terminalreporter.write_line(
            f"{len(_not_collected)} test files need TensorFlow, which is not installed: "
            f"not collected ({', '.join(sorted(_not_collected))})")
