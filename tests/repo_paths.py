"""Where the tests find the repository: its root, the benchmarks and the
tests' data folders (tests/ sits one level below the root, whatever folder a
test file is in)."""

import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TESTS = REPO / "tests"
