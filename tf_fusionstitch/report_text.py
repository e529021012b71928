"""A Report as text: a summary of one line per kernel, and the full listing.

TF-free; report.Report's __str__ and details() call these.
"""

from __future__ import annotations

import collections
from typing import Iterable, List, Tuple

# Op kinds a summary line names before it counts the rest.
KINDS_SHOWN = 6
# Shown under a summary whose byte counts scale with a dynamic extent.
DYNAMIC_NOTE = "  (×d: bytes per unit of the dynamic extents, e.g. per batch row)"


def op_kinds(tf_ops: Iterable[Tuple[str, str]], shown: int = KINDS_SHOWN) -> str:
    """'Mul x12, AddV2 x5': op types by count (most first), the rarest
    beyond `shown` kinds counted as '+N kinds'."""
    counts = collections.Counter(op for _, op in tf_ops)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{op} x{n}" for op, n in ranked[:shown])
    if len(ranked) > shown:
        more = len(ranked) - shown
        text += f", +{more} kind{'s' if more != 1 else ''}"
    return text


def byte_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def bytes_text(fixed: int, per_dynamic: int) -> str:
    """'1.0 MiB', '4.0 KiBxd' or '1.0 MiB + 4.0 KiBxd' (report_text.DYNAMIC_NOTE)."""
    parts = []
    if fixed or not per_dynamic:
        parts.append(byte_size(fixed))
    if per_dynamic:
        parts.append(f"{byte_size(per_dynamic)}×d")
    return " + ".join(parts)


def loops_text(cluster) -> str:
    loops = f"{cluster.loops} loop{'s' if cluster.loops != 1 else ''}"
    if cluster.buffered:
        loops += f" ({len(cluster.buffered)} buffered)"
    return loops


def kernel_line(cluster) -> str:
    """One cluster of the report in one line."""
    kinds = f" ({op_kinds(cluster.tf_ops)})" if cluster.tf_ops else ""
    if cluster.fused:
        packed = f", {cluster.parts} parts packed" if cluster.parts > 1 else ""
        return (f"  [fused] {cluster.name}: {len(cluster.tf_ops)} ops{kinds}, "
                f"in {bytes_text(*cluster.bytes_in)}, out {bytes_text(*cluster.bytes_out)}, "
                f"{loops_text(cluster)}{packed}")
    if cluster.split:
        return f"  [split] {cluster.name}: a pack built as its {cluster.split} parts: " \
               f"{cluster.reason}"
    return f"  [fallback] {cluster.name}: {len(cluster.tf_ops)} ops{kinds}: {cluster.reason}"


def header_lines(report) -> List[str]:
    """What summary and details both begin with: the function, kernel
    counts, the strategy's notes and the time taken."""
    return [f"tf_fusionstitch report for {report.function}{report.signature}",
            f"  memory-intensive kernels: TF {report.kernels_before} -> this plan "
            f"{report.kernels_after} (fusion={report.fusion}, "
            + (f"target={report.target}, " if report.target != "cpu" else "")
            + f"{len(report.fused_clusters)} FusionStitch)",
            *([f"  {report.exploration}"] if report.exploration else []),
            *([f"  {report.choice}"] if report.choice else []),
            *([f"  assumes equal sizes (checked on every call; other calls run "
               f"another version): " + ", ".join(
                   f"{a}[{i}] == {b}[{j}]" for a, i, b, j in report.assumed_equal)]
              if report.assumed_equal else []),
            f"  rewrite {report.rewrite_seconds:.2f} s"
            f"{' (rewrite cache hit)' if report.cache_hit else ''}, of which compile "
            f"{report.compile_seconds:.2f} s ({report.compilations} compilations)"]


def failure_text(report) -> str:
    return (f"tf_fusionstitch report for {report.function}{report.signature}\n"
            f"  not optimized: runs the original function, because the rewrite "
            f"failed after {report.rewrite_seconds:.2f} s: {report.failure}")


def totals_line(report) -> str:
    fused = report.fused_clusters
    ops = sum(len(c.tf_ops) for c in fused)
    fixed_in = sum(c.bytes_in[0] for c in fused)
    dynamic_in = sum(c.bytes_in[1] for c in fused)
    fixed_out = sum(c.bytes_out[0] for c in fused)
    dynamic_out = sum(c.bytes_out[1] for c in fused)
    parts = sum(c.parts for c in fused if c.parts > 1)
    text = (f"  total: {len(fused)} kernel{'s' if len(fused) != 1 else ''} of {ops} ops, "
            f"in {bytes_text(fixed_in, dynamic_in)}, out {bytes_text(fixed_out, dynamic_out)}")
    if parts:
        text += f", {parts} parts in packs"
    if report.fallbacks:
        left = sum(len(c.tf_ops) for c in report.fallbacks)
        text += f"; {len(report.fallbacks)} fallback(s) of {left} ops"
    if report.split_packs:
        text += f"; {len(report.split_packs)} pack(s) split"
    if report.unfused_ops:
        text += (f"; {len(report.unfused_ops)} fusible-class ops left as TF ops "
                 f"(details() says why)")
    if report.substitutions:
        text += (f"; {len(report.substitutions)} op(s) replaced by "
                 f"{', '.join(sorted({to for _, _, to in report.substitutions}))}")
    return text


def summary(report) -> str:
    """The header, one line per cluster, and the totals."""
    if report.failure:
        return failure_text(report)
    lines = header_lines(report) + [kernel_line(c) for c in report.clusters]
    lines.append(totals_line(report))
    if any(c.bytes_in[1] or c.bytes_out[1] for c in report.fused_clusters):
        lines.append(DYNAMIC_NOTE)
    return "\n".join(lines)


def details(report) -> str:
    """Every op of every cluster, and the fusible-class ops left unfused with why."""
    if report.failure:
        return failure_text(report)
    lines = header_lines(report)
    for c in report.clusters:
        ops = ", ".join(t for _, t in c.tf_ops)
        if c.fused:
            extra = f", buffered {', '.join(c.buffered)}" if c.buffered else ""
            packed = f", {c.parts} parts packed" if c.parts > 1 else ""
            lines.append(f"  [fused] {c.name}: {len(c.tf_ops)} ops{packed}, {c.loops} loop(s)"
                         f"{extra}: {ops}")
        elif c.split:
            lines.append(f"  [split] {c.name}: a pack built as its {c.split} parts\n"
                         f"      reason: {c.reason}")
        else:
            lines.append(f"  [fallback] {c.name}: {ops}\n      reason: {c.reason}")
    if report.unfused_ops:
        lines.append(f"  {len(report.unfused_ops)} fusible-class ops left as TF ops:")
        for name, op, why in report.unfused_ops[:20]:
            lines.append(f"    {name} ({op}): {why}")
        if len(report.unfused_ops) > 20:
            lines.append(f"    ... and {len(report.unfused_ops) - 20} more")
    for name, was, now in report.substitutions:
        lines.append(f"  [replaced] {name}: {was} -> {now}")
    return "\n".join(lines)
