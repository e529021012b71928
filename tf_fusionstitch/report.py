"""What `optimize` did to a function: clusters, kernels, fallbacks, time."""

from __future__ import annotations

import dataclasses
import json
import typing
from typing import Any, List, Tuple

from tf_fusionstitch import report_html, report_text


@dataclasses.dataclass
class ClusterReport:
    name: str                          # the FusionStitch node (or first TF node on fallback)
    tf_ops: List[Tuple[str, str]]      # (node name, op type) replaced
    fused: bool
    reason: str = ""                   # why it fell back, when it did
    kernel_key: str = ""
    loops: int = 0                     # column loops per row (1 + reductions in sequence)
    buffered: Tuple[str, ...] = ()     # values kept in a per-row buffer
    parts: int = 1                     # unconnected parts packed in one launch
    # A pack whose kernel failed (`reason` says why): the number of parts it
    # was split into, each lowered and reported on its own (tf_ops empty).
    split: int = 0
    # Bytes the kernel reads and writes: (of tensors with static shapes, per
    # unit of the dynamic extents of the others), fusion_ir.tensor_bytes.
    bytes_in: Tuple[int, int] = (0, 0)
    bytes_out: Tuple[int, int] = (0, 0)


@dataclasses.dataclass
class PlanGraph:
    """The graph a plan runs, for pictures: its own nodes (a fused kernel is
    its FusionStitch node, named as its ClusterReport) and data edges."""
    nodes: List[Tuple[str, str]] = dataclasses.field(default_factory=list)  # (name, op)
    edges: List[Tuple[int, int]] = dataclasses.field(default_factory=list)  # (from, to)

    @staticmethod
    def of(graph_def) -> "PlanGraph":
        index = {node.name: i for i, node in enumerate(graph_def.node)}
        edges = set()
        for i, node in enumerate(graph_def.node):
            for name in node.input:
                if not name.startswith("^"):
                    source = index.get(name.split(":")[0])
                    if source is not None:
                        edges.add((source, i))
        return PlanGraph([(node.name, node.op) for node in graph_def.node], sorted(edges))


@dataclasses.dataclass
class Report:
    function: str
    signature: str
    clusters: List[ClusterReport]
    # memory-intensive kernels (rewriters/kernel_count.py) of the graph TF runs
    # (after Grappler) and of this plan (TF ops left + FusionStitch kernels)
    kernels_before: int
    kernels_after: int
    compile_seconds: float
    compilations: int                  # compiler invocations (cache hits excluded)
    rewrite_seconds: float
    unfused_ops: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    fusion: str = "stitch"             # the strategy that made this plan
    exploration: str = ""              # fusion="explore": options and what the search did
    # The plan came from the rewrite cache (tf_fusionstitch/rewrite_cache.py):
    # rewrite_seconds is then the time of the lookup and the kernels' reload.
    cache_hit: bool = False
    # Input sizes (Placeholder, axis, Placeholder, axis) this plan assumes
    # equal: every call checks them (tf_fusionstitch/versions.py). And those
    # whose equality would decide a gradient's reduction, assumed or not.
    assumed_equal: List[Tuple[str, int, str, int]] = dataclasses.field(default_factory=list)
    equal_sizes_wanted: List[Tuple[str, int, str, int]] = dataclasses.field(
        default_factory=list)
    # Why this trace runs the original function unchanged: the rewrite itself
    # failed (a bug of tf_fusionstitch, never of the user's function). Empty
    # when the plan above is what runs. Such a trace also has one fallback.
    failure: str = ""
    # optimize(fn, measured_choice=N), and fusion="explore" (measured_plans):
    # which of the fused function, the original and XLA's rule plan this
    # version runs, from timing them on its first calls.
    choice: str = ""
    # Ops replaced by another TF op that computes the same, faster
    # (rewriters/depthwise_calls.py): (node, what it was, what it became).
    substitutions: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)
    target: str = "cpu"                # the kernels' target (kernels.TARGETS)
    # The graph this trace runs (not in to_json: set from the trace's graph).
    graph: PlanGraph = dataclasses.field(default_factory=PlanGraph)

    @staticmethod
    def failed(function: str, signature: str, fusion: str, reason: str,
               rewrite_seconds: float) -> "Report":
        """The report of a trace whose rewrite failed and runs the original."""
        whole = ClusterReport("whole function", [], False, reason=reason)
        return Report(function=function, signature=signature, clusters=[whole],
                      kernels_before=0, kernels_after=0, compile_seconds=0.0,
                      compilations=0, rewrite_seconds=rewrite_seconds, fusion=fusion,
                      failure=reason)

    @property
    def fused_clusters(self) -> List[ClusterReport]:
        return [c for c in self.clusters if c.fused]

    @property
    def fallbacks(self) -> List[ClusterReport]:
        """The clusters that stay as TensorFlow ops."""
        return [c for c in self.clusters if not c.fused and not c.split]

    @property
    def split_packs(self) -> List[ClusterReport]:
        """The packs built as their parts instead (those have entries of their own)."""
        return [c for c in self.clusters if c.split]

    def __str__(self) -> str:
        """One line per kernel (op kinds, bytes, loops, parts) and totals."""
        return report_text.summary(self)

    def details(self) -> str:
        """Every op of every kernel, and each fusible-class op left unfused with why."""
        return report_text.details(self)

    def save_html(self, path) -> None:
        """Writes one self-contained page (no network needed to view it): the
        kernel table and a picture of the plan's graph (report_html.py)."""
        report_html.save(self, path)

    def to_json(self) -> str:
        """The report as JSON text (for the rewrite cache; never pickle),
        without the plan's graph (each trace takes it from its own graph)."""
        fields = dataclasses.asdict(self)
        del fields["graph"]
        return json.dumps(fields, sort_keys=True, allow_nan=False)

    @staticmethod
    def from_json(text: str) -> "Report":
        """Inverse of to_json, driven by the fields' type annotations; raises
        ValueError for anything that does not decode to a Report that
        encodes back to the same JSON (a field type it cannot decode, too)."""
        report = _decode(Report, json.loads(text))
        if json.loads(report.to_json()) != json.loads(text):
            raise ValueError("the report does not survive a JSON round trip")
        return report


def _decode(tp: Any, value: Any) -> Any:
    """`value` (parsed JSON) as an instance of type `tp`: dataclasses, lists,
    tuples and str/int/float/bool; any other type is refused."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        if not isinstance(value, dict) or not set(value) <= names:
            raise ValueError(f"not a {tp.__name__}: {value!r:.80}")
        try:
            return tp(**{k: _decode(hints[k], v) for k, v in value.items()})
        except TypeError as e:  # a required field is missing
            raise ValueError(f"not a {tp.__name__}: {e}") from None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (list, tuple) and args and isinstance(value, list):
        if origin is list:
            return [_decode(args[0], v) for v in value]
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        if len(args) == len(value):
            return tuple(_decode(a, v) for a, v in zip(args, value))
    elif tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    elif tp in (str, int, bool) and type(value) is tp:
        return value
    # A field annotated loosely (`list`, `Any`) lands here too: give it a
    # precise type (List[str], Tuple[int, ...], a dataclass) or hits never happen.
    raise ValueError(f"cannot decode {value!r:.80} as {tp}")
