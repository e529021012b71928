"""The TensorFlow versions this package supports, and the check that the installed one is one.

The package depends on no particular TensorFlow distribution (`tensorflow`, `tensorflow-cpu`,
`tensorflow[and-cuda]`, ... all install the same `tensorflow` module), so pip cannot check the
version: the modules that use TensorFlow call `check()` before importing it. The version is
read from the installed distributions' metadata, not by importing TensorFlow, so this module
stays TF-free (setup.py reads the range from it too).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.metadata
import re
from typing import List, Optional, Sequence, Tuple

# Supported: MINIMUM <= version < BELOW (major.minor); setup.py's extras use the same range.
MINIMUM = (2, 21)
BELOW = (2, 22)
PIP_RANGE = f">={MINIMUM[0]}.{MINIMUM[1]},<{BELOW[0]}.{BELOW[1]}"

MODULE = "tensorflow"
# The distributions of that module on PyPI (the check itself finds any by its files; tests and
# scripts use this list to look for a second one in `pip list`).
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel",
                 "tensorflow-macos", "tf-nightly", "tf-nightly-cpu")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _provides_module(dist: importlib.metadata.Distribution) -> bool:
    top_level = dist.read_text("top_level.txt")
    if top_level is not None:
        return MODULE in top_level.split()
    # No top_level.txt (not built by setuptools): the installed files say.
    record = dist.read_text("RECORD") or ""
    return any(line.startswith(MODULE + "/") for line in record.splitlines())


def installed(path: Optional[Sequence[str]] = None) -> List[Tuple[str, str]]:
    """(distribution, version) of each installed distribution that provides the `tensorflow`
    module (two of them is the broken environment pip makes when a second one installs over
    the first). `path`: where to look instead of sys.path."""
    found = {}
    kwargs = {} if path is None else {"path": list(path)}
    for dist in importlib.metadata.distributions(**kwargs):
        name = dist.metadata["Name"]
        if name and _canonical(name) not in found and _provides_module(dist):
            found[_canonical(name)] = dist.version
    return sorted(found.items())


def supported(version: str) -> bool:
    match = re.match(r"(\d+)\.(\d+)", version)
    return bool(match) and MINIMUM <= (int(match[1]), int(match[2])) < BELOW


def check(path: Optional[Sequence[str]] = None) -> str:
    """The installed TensorFlow's version; ImportError if it is missing or unsupported,
    naming what is installed and what to pip install."""
    dists = installed(path)
    if not dists:
        if importlib.machinery.PathFinder.find_spec(MODULE, path) is None:
            raise ImportError(
                f"tf_fusionstitch needs TensorFlow {PIP_RANGE}, which is not installed. "
                f"Install it with the package: pip install 'tf_fusionstitch[cpu]' (CPU) or "
                f"'tf_fusionstitch[and-cuda]' (GPU), or TensorFlow alone: "
                f"pip install 'tensorflow{PIP_RANGE}'")
        # A TensorFlow without metadata (built from source, on PYTHONPATH): ask it.
        dists = [(MODULE, importlib.import_module(MODULE).__version__)]
    wrong = [(name, version) for name, version in dists if not supported(version)]
    if wrong:
        listed = ", ".join(f"{name} {version}" for name, version in dists)
        upgrades = " ".join(f"'{name}{PIP_RANGE}'" for name, _ in wrong)
        several = (f" ({len(dists)} distributions provide the `{MODULE}` module, which "
                   f"breaks it: uninstall all but one)" if len(dists) > 1 else "")
        raise ImportError(
            f"tf_fusionstitch needs TensorFlow {PIP_RANGE}; installed: {listed}{several}. "
            f"Install a supported version of the same distribution: pip install {upgrades}")
    return dists[0][1]
