"""Versions of one optimized function, each assuming some of its inputs'
dynamic sizes equal, and the check that picks one per call.

With a dynamic batch, a gradient may have to sum over the batch axis of an
operand whose batch TF lets broadcast (labels of batch 1 against logits of
batch 32): TF leaves that Sum's axes to run time, and no proof over the
graph can settle them (rewriters/decided_shapes.py). The call's arguments
can: when the labels' batch equals the logits' on this call, the Sum sums
nothing there. So the rewrite may assume such equalities, and each call runs
a version of the function whose assumptions its arguments meet (a version
that assumes nothing always does).

A size is named by (leaf, axis): the leaf's position among the call's
arguments flattened (tf.nest, composites expanded), and its axis. The
versions are keyed by the pairs among the *wanted* ones (those whose
equality some trace found would decide a gradient, or that reach a loop
together: rewriters/decided_shapes.py) that hold on the call:
  - the first call's version may assume every pair of the call's sizes
    that are equal; its trace narrows that to the pairs it relied on (its
    guard) and reports the wanted pairs;
  - each later call computes which wanted pairs hold and runs the version
    kept for exactly those, tracing a new one (which may assume them) if
    there is none. A version only runs on calls that meet its guard.
A call whose sizes are not all known (inside another tf.function) meets
only the guard of a version that assumes nothing.
"""

from __future__ import annotations

import threading
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

LeafDim = Tuple[int, int]                # (leaf position, axis)
LeafPair = Tuple[LeafDim, LeafDim]       # sorted
Sizes = List[Optional[Tuple[Optional[int], ...]]]   # per leaf: its shape, as far as known

# Versions kept per function; past this, a call runs the most specialized
# version whose guard it meets (one that assumes nothing meets every call).
MAX_VERSIONS = 8


def call_sizes(leaves: Sequence) -> Sizes:
    """Each leaf's shape as far as known now (None: not a tensor, or rank unknown)."""
    sizes: Sizes = []
    for leaf in leaves:
        shape = getattr(leaf, "shape", None)
        try:
            sizes.append(None if shape is None else tuple(
                None if d is None else int(d) for d in shape))
        except (TypeError, ValueError):   # TensorShape of unknown rank, odd shape objects
            sizes.append(None)
    return sizes


def holds(sizes: Sizes, pair: LeafPair) -> bool:
    """Whether both sizes of `pair` are known in `sizes` and equal."""
    values = []
    for leaf, axis in pair:
        shape = sizes[leaf] if leaf < len(sizes) else None
        if shape is None or axis >= len(shape) or shape[axis] is None:
            return False
        values.append(shape[axis])
    return values[0] == values[1]


class Version:
    """One traced function and the equalities its traces may assume."""

    def __init__(self, guard: Optional[FrozenSet[LeafPair]], first_sizes: Sizes = ()):
        # None until the first trace narrows "every equal pair of first_sizes"
        # down to the pairs it relied on.
        self.guard = guard
        self._first_sizes = list(first_sizes)
        self.fn: Optional[Callable] = None
        self.key: Optional[FrozenSet[LeafPair]] = None   # set once registered
        self.report = None                                # its latest trace's (api.Report)
        self.choice = None        # measured_choice.MeasuredChoice, when optimize was asked to

    def first_size(self, leaf: int, axis: int) -> Optional[int]:
        """The size of the argument's axis in the call that made this
        version, if known: the sizes a plan is priced at."""
        shape = self._first_sizes[leaf] if leaf < len(self._first_sizes) else None
        return shape[axis] if shape is not None and axis < len(shape) else None

    def equal_classes(self, dims: Sequence[LeafDim]) -> List[List[LeafDim]]:
        """`dims` grouped into classes a trace may take as equal (classes of
        one left out), in a deterministic order."""
        if self.guard is None:
            by_size: Dict[int, List[LeafDim]] = {}
            for leaf, axis in dims:
                size = self.first_size(leaf, axis)
                if size is not None:
                    by_size.setdefault(size, []).append((leaf, axis))
            groups = list(by_size.values())
        else:
            # The guard's pairs closed under transitivity: a == b, b == c give a == c.
            parent: Dict[LeafDim, LeafDim] = {d: d for d in dims}
            for pair in self.guard:
                for d in pair:
                    parent.setdefault(d, d)

            def find(d):
                while parent[d] != d:
                    d = parent[d]
                return d
            for a, b in self.guard:
                parent[find(a)] = find(b)
            by_root: Dict[LeafDim, List[LeafDim]] = {}
            for d in dims:
                by_root.setdefault(find(d), []).append(d)
            groups = list(by_root.values())
        return sorted(sorted(g) for g in groups if len(g) > 1)

    def meets(self, sizes: Sizes) -> bool:
        return self.guard is not None and all(holds(sizes, p) for p in self.guard)


class Versions:
    """The versions of one function; `make(version)` builds its tf.function."""

    def __init__(self, make: Callable[[Version], Callable]):
        self._make = make
        self._lock = threading.Lock()
        self._by_key: Dict[FrozenSet[LeafPair], Version] = {}
        self._wanted: Set[LeafPair] = set()
        self._generic: Optional[Version] = None

    @property
    def generic(self) -> Version:
        """The version that assumes nothing: right for every call."""
        with self._lock:
            if self._generic is None:
                self._generic = self._new(frozenset())
            return self._generic

    def ready(self) -> Optional[Version]:
        """The one version every call runs, while no trace wants an
        equality: the common case needs no look at the call's sizes."""
        return None if self._wanted else self._by_key.get(frozenset())

    def pick(self, sizes: Sizes) -> Version:
        """The version to run a call with these sizes (maybe not traced yet)."""
        with self._lock:
            if not self._by_key:
                return self._new(None, sizes)
            key = frozenset(p for p in self._wanted if holds(sizes, p))
            version = self._by_key.get(key)
            if version is not None:
                return version
            if len(self._by_key) < MAX_VERSIONS:
                return self._new(key, sizes)
            fitting = [v for v in self._by_key.values() if v.meets(sizes)]
        if fitting:
            return max(fitting, key=lambda v: len(v.guard))
        return self.generic

    def traced(self, version: Version, assumed: Set[LeafPair], wanted: Set[LeafPair]) -> None:
        """What one trace of `version` relied on and found worth assuming."""
        with self._lock:
            if version.guard is None:
                version.guard = frozenset(assumed)
            else:   # a trace may only use what its guard implies
                dims = sorted({d for pair in assumed for d in pair})
                class_of = {d: i for i, group in enumerate(version.equal_classes(dims))
                            for d in group}
                beyond = [p for p in assumed if class_of.get(p[0], -1) != class_of.get(p[1])]
                if beyond:
                    raise AssertionError(f"a trace assumed {sorted(beyond)} beyond its "
                                         "version's guard")
            self._wanted |= wanted

    def settle(self, version: Version, sizes: Sizes) -> None:
        """Keeps `version` for later calls like this one, once it ran or traced."""
        with self._lock:
            if version.key is not None:
                return
            if version.guard is None:          # no trace reached the rewrite
                version.guard = frozenset()
            key = frozenset(p for p in self._wanted if holds(sizes, p))
            if key not in self._by_key and version.guard <= key:
                version.key = key
                self._by_key[key] = version

    def _new(self, guard, sizes: Sizes = ()) -> Version:
        version = Version(guard, sizes)
        version.fn = self._make(version)
        return version
