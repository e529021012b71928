"""pytest under `bazel test`: runs in the runfiles tree (the source tree, with the folders
setup.py renames copied under tf_fusionstitch/ by bazel/defs.bzl's import_root) and passes
the test's args to pytest."""

import os
import sys

import pytest

if __name__ == "__main__":
    # Bazel's own scratch folder: the tests' temporary files and CuPy's cache go there.
    scratch = os.environ.get("TEST_TMPDIR")
    if scratch:
        os.environ.setdefault("HOME", scratch)
    sys.exit(pytest.main(["-p", "no:cacheprovider", *sys.argv[1:]]))
