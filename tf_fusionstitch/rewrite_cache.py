"""The rewrite cache: a traced function's rewritten GraphDef, kept on disk.

`optimize` spends seconds per trace on Grappler, shape inference, clustering,
lowering and code generation even when every kernel is already compiled. This
cache keeps the outcome of all that, keyed by everything that decides it:

  - the traced GraphDef as TensorFlow gave it but for the names a trace makes
    up (trace_names.py: library functions and custom gradients, numbered by
    first use; serialized deterministically), so a new tf.function of the same
    step hits; its fetch and control-output names, and the static shape TF knew for each
    tensor (variable shapes are not in the GraphDef; they reach the rewrite as
    shape hints);
  - the resolved `optimize` options;
  - TensorFlow's version, the kernel generator's version (kernels.GENERATOR_VERSION,
    which kernel keys include), REWRITE_VERSION below, and a hash of the
    source of every module the rewrite runs (so a code change never reuses
    an old plan, version bump or not).

The value is JSON (never pickle: this directory also holds the shared objects
we dlopen, docs/DESIGN.md, "Security"): the rewritten GraphDef (base64 of its
serialized bytes), the output names and the Report. It is stored through
runtime/cache.py (user-owned 0700 directory, written atomically, sha256
verified on every read), in $TF_FUSIONSTITCH_CACHE_DIR when set.

A hit is trusted only as far as it re-checks: every FusionStitch node's kernel
(in the graph or in a function of its library) is regenerated from the fusion
spec in its `spec` attribute, checked as spec_kernels.py checks a SavedModel's
(compiled only if the kernel cache lacks it), and it is registered with the op
library again; rewritten library functions are registered with the eager
runtime (function_bodies.register_functions). Anything wrong with an entry (absent,
altered, unparsable, a kernel that fails) makes `load` return None and the
caller rewrites from scratch. Only plans whose clusters all fused, with no
pack split into its parts, are stored: a fallback may be passing (a missing
compiler, a timeout). The stored graph is in canonical names and gets the
loading trace's back.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import importlib.util
import json
import pathlib
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from tf_fusionstitch import kernels, spec_kernels
from tf_fusionstitch.report import Report
from tf_fusionstitch.runtime import cache

# Bump when the meaning of a cached entry changes (its format, or what the key covers).
REWRITE_VERSION = "rewrite-3"   # 3: epilogues TF's remapper fuses stay TF ops
SUFFIX = ".rewrite.json"

# The packages whose code decides the rewritten graph (planner and tools do not).
_SOURCE_PACKAGES = ("tf_fusionstitch", "tf_fusionstitch.codegen", "tf_fusionstitch.runtime",
                    "tf_fusionstitch.rewriters", "tf_fusionstitch.custom_ops")
_SOURCE_SUFFIXES = (".py", ".cc", ".h")


@dataclasses.dataclass
class Entry:
    graph_def: Any                 # tf.compat.v1.GraphDef
    output_names: List[str]
    report: Report                 # as stored; the caller fills in this trace's fields


@functools.lru_cache(maxsize=1)
def source_fingerprint() -> str:
    """sha256 over the source files of the packages the rewrite runs."""
    digest = hashlib.sha256()
    for package in _SOURCE_PACKAGES:
        spec = importlib.util.find_spec(package)
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(pathlib.Path(directory).iterdir()):
                if path.suffix in _SOURCE_SUFFIXES and path.is_file():
                    data = path.read_bytes()
                    digest.update(f"{package}/{path.name}:{len(data)}\n".encode())
                    digest.update(data)
    return digest.hexdigest()


def make_key(graph_def_bytes: bytes, outputs: Sequence[str], control_outputs: Sequence[str],
             shapes_text: str, options: Dict[str, Any], tf_version: str) -> str:
    """The cache key (a content_key) of one rewrite."""
    return cache.content_key(
        REWRITE_VERSION, kernels.GENERATOR_VERSION, tf_version, source_fingerprint(),
        hashlib.sha256(graph_def_bytes).hexdigest(), json.dumps(list(outputs)),
        json.dumps(sorted(control_outputs)), hashlib.sha256(shapes_text.encode()).hexdigest(),
        json.dumps(options, sort_keys=True))


def store(key: str, graph_def, output_names: Sequence[str], report: Report) -> None:
    """Writes the entry (raises CacheError/OSError; callers may ignore them)."""
    obj = {"version": REWRITE_VERSION, "key": key,
           "graph_def": base64.b64encode(graph_def.SerializeToString(deterministic=True))
                              .decode("ascii"),
           "output_names": list(output_names), "report": json.loads(report.to_json())}
    cache.write_verified(key, SUFFIX, json.dumps(obj, sort_keys=True).encode("utf-8"))


def load(key: str, register: Callable[[kernels.CompiledKernel], None],
         timeout: float = 120, restore: Callable[[Any], Any] = lambda graph_def: graph_def
         ) -> Optional[Entry]:
    """The entry under `key` with every kernel it names rebuilt (from the
    kernel cache) and passed to `register`, or None on a miss or any fault.
    `restore` gives the stored graph this trace's names back
    (trace_names.TraceNames.specific) before its functions are registered.
    Sets report.compile_seconds and .compilations to what this reload took."""
    try:
        data = cache.read_verified(key, SUFFIX)
    except (cache.CacheError, OSError):
        return None
    if data is None:
        return None
    try:
        import tensorflow as tf
        from tf_fusionstitch.runtime import cpu_compiler

        obj = json.loads(data.decode("utf-8"))
        if not isinstance(obj, dict) or obj.get("version") != REWRITE_VERSION \
                or obj.get("key") != key:
            return None
        graph_def = restore(tf.compat.v1.GraphDef.FromString(
            base64.b64decode(obj["graph_def"], validate=True)))
        output_names = obj["output_names"]
        if not isinstance(output_names, list) or \
                not all(isinstance(n, str) for n in output_names):
            return None
        report = Report.from_json(json.dumps(obj["report"]))
        start, compilations = time.perf_counter(), cpu_compiler.compilations
        for kernel in spec_kernels.rebuild(spec_kernels.graph_specs(graph_def), timeout):
            register(kernel)
        # Rewritten library functions have new names the eager runtime must know.
        from tf_fusionstitch.rewriters import function_bodies
        function_bodies.register_functions(graph_def)
        report.compile_seconds = time.perf_counter() - start
        report.compilations = cpu_compiler.compilations - compilations
        return Entry(graph_def, output_names, report)
    except Exception:  # any fault in an entry means: rewrite from scratch
        return None
