"""`import tf_fusionstitch` registers the FusionStitch op with TensorFlow, so
that `tf.saved_model.load` reads graphs that hold it.

At once when TensorFlow is already imported, else right after TensorFlow's own
import (a finder on sys.meta_path that wraps its loader once): importing the
TF-free core never imports TensorFlow itself. Registering loads the op library
(custom_ops/loader.py: built with the C++ compiler the first time, cached
after), which also installs the resolver that builds a loaded graph's kernels
from their specs. Where that fails (no compiler, an unsupported TensorFlow) it
warns, and the failure is raised again where the op is needed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings

_TENSORFLOW = "tensorflow"


def register_with_tensorflow() -> None:
    """Registers the op now if TensorFlow is imported, else once it is."""
    if _TENSORFLOW in sys.modules:
        _register()
    elif not any(isinstance(f, _AfterTensorFlowImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterTensorFlowImport())


def _register() -> None:
    try:
        from tf_fusionstitch.custom_ops import loader
        loader.load()
    except Exception as e:  # noqa: BLE001  (importing the package must not fail for it)
        warnings.warn(f"tf_fusionstitch: the FusionStitch op is not registered ({e}); "
                      "graphs and SavedModels that hold FusionStitch nodes cannot be "
                      "loaded in this process", RuntimeWarning, stacklevel=3)


class _AfterTensorFlowImport(importlib.abc.MetaPathFinder):
    """Finds TensorFlow with the other finders and wraps its loader so that
    the op is registered once TensorFlow's import has run. A mere look-up
    (importlib.util.find_spec) leaves it in place for the import itself."""

    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != _TENSORFLOW or self._finding:
            return None
        self._finding = True   # the look-up below asks every finder, this one too
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._finding = False
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenRegister(spec.loader, self)
        return spec


class _ThenRegister(importlib.abc.Loader):
    """TensorFlow's loader, which registers the op after the module has run."""

    def __init__(self, loader, finder: _AfterTensorFlowImport):
        self._loader = loader
        self._finder = finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its own loader (get_source, resources).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        self._loader.exec_module(module)
        _register()

    def __getattr__(self, name):
        return getattr(self._loader, name)
