"""What `optimize` did to a function: clusters, kernels, fallbacks, time."""

from __future__ import annotations

import dataclasses
from typing import List, Tuple


@dataclasses.dataclass
class ClusterReport:
    name: str                          # the FusionStitch node (or first TF node on fallback)
    tf_ops: List[Tuple[str, str]]      # (node name, op type) replaced
    fused: bool
    reason: str = ""                   # why it fell back, when it did
    kernel_key: str = ""
    loops: int = 0                     # column loops per row (1 + reductions in sequence)
    buffered: Tuple[str, ...] = ()     # values kept in a per-row buffer


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

    @property
    def fused_clusters(self) -> List[ClusterReport]:
        return [c for c in self.clusters if c.fused]

    @property
    def fallbacks(self) -> List[ClusterReport]:
        return [c for c in self.clusters if not c.fused]

    def __str__(self) -> str:
        lines = [f"tf_fusionstitch report for {self.function}{self.signature}",
                 f"  memory-intensive kernels: TF {self.kernels_before} -> this plan "
                 f"{self.kernels_after} (fusion={self.fusion}, "
                 f"{len(self.fused_clusters)} FusionStitch)",
                 *([f"  {self.exploration}"] if self.exploration else []),
                 f"  rewrite {self.rewrite_seconds:.2f} s, of which compile "
                 f"{self.compile_seconds:.2f} s ({self.compilations} compilations)"]
        for c in self.clusters:
            ops = ", ".join(t for _, t in c.tf_ops)
            if c.fused:
                extra = f", buffered {', '.join(c.buffered)}" if c.buffered else ""
                lines.append(f"  [fused] {c.name}: {len(c.tf_ops)} ops, {c.loops} loop(s)"
                             f"{extra}: {ops}")
            else:
                lines.append(f"  [fallback] {c.name}: {ops}\n      reason: {c.reason}")
        if self.unfused_ops:
            lines.append(f"  {len(self.unfused_ops)} fusible-class ops left as TF ops:")
            for name, op, why in self.unfused_ops[:20]:
                lines.append(f"    {name} ({op}): {why}")
            if len(self.unfused_ops) > 20:
                lines.append(f"    ... and {len(self.unfused_ops) - 20} more")
        return "\n".join(lines)
