"""Where the tests find the repository: its root, the benchmarks and the
tests' data folders (tests/ sits one level below the root, whatever folder a
test file is in)."""

import os
import pathlib

# Not resolved: under `bazel test` the files are symlinks in a runfiles tree, whose root is
# the repository as the package imports there (the source tree is not).
REPO = pathlib.Path(os.path.abspath(__file__)).parents[1]
BENCHMARKS = REPO / "benchmarks"
TESTS = REPO / "tests"
