"""Kernels rebuilt from the fusion specs a graph carries: a SavedModel loaded
in a fresh process, a cached rewrite read back (rewrite_cache.py).

A FusionStitch node's `spec` attribute is data. Before anything is built from
it, it is parsed and validated against the IR's grammar
(fusion_ir.Cluster.from_json: identifiers, known primitives and attributes,
supported dtypes, numeric constants, every shape re-inferred), it must be the
canonical JSON of what it parses to, and its hash must be the node's
`kernel_key` for one of the kernel targets (kernels.target_of), which says
what to build. The hash is a checksum: it catches a spec edited or corrupted
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


def checked_cluster(spec: str, key: str) -> Tuple[ir.Cluster, str]:
    """The cluster `spec` describes and the target its key names; raises
    fusion_ir.SpecError saying why the spec is refused."""
    cluster = ir.Cluster.from_json(spec)
    if cluster.to_json() != spec:
        raise ir.SpecError("the spec is not in the canonical form tf_fusionstitch writes "
                           "(it was edited)")
    return cluster, kernels.target_of(spec, key)


def build_by_target(checked: List[Tuple[ir.Cluster, str]], timeout: float
                    ) -> List[object]:
    """kernels.build_cpu_kernels of each (cluster, target), one call per
    target: a CompiledKernel or the exception per pair, in order."""
    out: List[object] = [None] * len(checked)
    for target in dict.fromkeys(t for _, t in checked):
        index = [i for i, (_, t) in enumerate(checked) if t == target]
        built = kernels.build_cpu_kernels([checked[i][0] for i in index], timeout=timeout,
                                          target=target)
        for i, kernel in zip(index, built):
            out[i] = kernel
    return out


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
    built = build_by_target([checked_cluster(spec, key) for spec, key in pairs], timeout)
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
        # checked, not yet built, by key: (cluster, target)
        self._pending: Dict[str, Tuple[ir.Cluster, str]] = {}

    def check(self, key: str, spec: str) -> None:
        checked = checked_cluster(spec, key)
        with self._lock:
            self._pending[key] = checked

    def build(self, key: str, spec: str) -> None:
        """Registers the kernel of (key, spec), and of every pending one with it."""
        checked = checked_cluster(spec, key)
        with self._lock:
            self._pending[key] = checked
            keys, pending = list(self._pending), list(self._pending.values())
            self._pending.clear()
            built = build_by_target(pending, self._timeout)
            failure = None
            for k, kernel in zip(keys, built):
                if isinstance(kernel, Exception):
                    failure = kernel if k == key else failure
                else:
                    self._register(kernel)
        if failure is not None:
            raise failure
