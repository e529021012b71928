"""Kernels rebuilt from the fusion specs a graph carries: a SavedModel loaded
in a fresh process, a cached rewrite read back (rewrite_cache.py).

A FusionStitch node's `spec` attribute is data. Before anything is built from
it, it is parsed and validated against the IR's grammar
(fusion_ir.Cluster.from_json: identifiers, known primitives and attributes,
supported dtypes, numeric constants, every shape re-inferred), it must be the
canonical JSON of what it parses to, and its hash must be the node's
`kernel_key`. The hash is a checksum: it catches a spec edited or corrupted
without its key (or made by another kernel generator), not an attacker, who
can recompute it; the validation is what keeps code out, since the source is
always regenerated from the validated spec.

TF-free: the op's resolver (custom_ops/loader.py) and the rewrite cache call it.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, Iterable, List, Tuple

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import kernels


def checked_cluster(spec: str, key: str) -> ir.Cluster:
    """The cluster `spec` describes; raises fusion_ir.SpecError saying why
    the spec is refused."""
    cluster = ir.Cluster.from_json(spec)
    if cluster.to_json() != spec:
        raise ir.SpecError("the spec is not in the canonical form tf_fusionstitch writes "
                           "(it was edited)")
    if kernels.kernel_key(spec) != key:
        raise ir.SpecError(
            f"the kernel_key {key[:40]!r} is not the hash of the spec under kernel generator "
            f"{kernels.GENERATOR_VERSION}: the spec was edited or corrupted, or another "
            "version of tf_fusionstitch wrote it (convert the model again)")
    return cluster


def graph_specs(graph_def) -> List[Tuple[str, str]]:
    """(spec, kernel_key) of every FusionStitch node of a GraphDef, in the
    graph or in a function of its library, each pair once, in order."""
    nodes = list(graph_def.node)
    for function in graph_def.library.function:
        nodes.extend(function.node_def)
    seen: Dict[Tuple[str, str], None] = {}
    for node in nodes:
        if node.op == "FusionStitch":
            seen.setdefault((node.attr["spec"].s.decode("utf-8"),
                             node.attr["kernel_key"].s.decode("utf-8")), None)
    return list(seen)


def rebuild(pairs: Iterable[Tuple[str, str]], timeout: float
            ) -> List[kernels.CompiledKernel]:
    """The kernel of each (spec, kernel_key), generated from its checked spec
    (compiled only where the kernel cache lacks it); raises the first failure."""
    pairs = list(pairs)
    clusters = [checked_cluster(spec, key) for spec, key in pairs]
    built = kernels.build_cpu_kernels(clusters, timeout=timeout)
    for kernel in built:
        if isinstance(kernel, Exception):
            raise kernel
    return built


class Resolver:
    """Kernels for keys a process meets in graphs it did not rewrite: `check`
    when a node enters a graph (cheap: no compiler), `build` when a kernel is
    first needed, which compiles every kernel checked so far in one go
    (several to a compiler run) and registers them."""

    def __init__(self, register: Callable[[kernels.CompiledKernel], None],
                 timeout: float = 120):
        self._register = register
        self._timeout = timeout
        self._lock = threading.Lock()
        self._pending: Dict[str, ir.Cluster] = {}   # checked, not yet built, by key

    def check(self, key: str, spec: str) -> None:
        cluster = checked_cluster(spec, key)
        with self._lock:
            self._pending[key] = cluster

    def build(self, key: str, spec: str) -> None:
        """Registers the kernel of (key, spec), and of every pending one with it."""
        cluster = checked_cluster(spec, key)
        with self._lock:
            self._pending[key] = cluster
            keys, clusters = list(self._pending), list(self._pending.values())
            self._pending.clear()
            built = kernels.build_cpu_kernels(clusters, timeout=self._timeout)
            failure = None
            for k, kernel in zip(keys, built):
                if isinstance(kernel, Exception):
                    failure = kernel if k == key else failure
                else:
                    self._register(kernel)
        if failure is not None:
            raise failure
