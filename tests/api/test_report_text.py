"""Report as text: the one-line-per-kernel summary and its totals, and
details(), the full listing as str(report) printed it before the summary."""

import collections
import re

from tf_fusionstitch import report_text
from tf_fusionstitch.report import ClusterReport, Report


def sample():
    fused = ClusterReport("fs/a/FusionStitch", [("a/mul", "Mul"), ("a/mul_1", "Mul"),
                                                ("a/add", "AddV2"), ("b/exp", "Exp")],
                          True, kernel_key="k1", loops=2, buffered=("t1",), parts=2,
                          bytes_in=(1024, 64), bytes_out=(0, 32))
    small = ClusterReport("c/FusionStitch", [("c/neg", "Neg"), ("c/abs", "Abs")], True,
                          kernel_key="k2", loops=1, bytes_in=(3 << 20, 0), bytes_out=(2048, 0))
    return Report(
        function="step", signature="(float32[None, 8])",
        clusters=[fused,
                  ClusterReport("c/exp", [("c/exp", "Exp"), ("c/neg", "Neg")], False,
                                reason="CompileError: no compiler"),
                  ClusterReport("d/x", [], False,
                                reason="pack of 2 parts split: SpecError: too big", split=2),
                  small],
        kernels_before=9, kernels_after=4, compile_seconds=0.25, compilations=3,
        rewrite_seconds=1.5, unfused_ops=[(f"e/op{i}", "Tanh", "no fusible neighbour")
                                          for i in range(22)],
        exploration="explore k=3 beam=3", assumed_equal=[("x", 0, "y", 0)])


# str(report) of the sample's first three clusters before the summary existed
# (main at bead4d3): details() must print the same.
OLD_LISTING = """\
tf_fusionstitch report for step(float32[None, 8])
  memory-intensive kernels: TF 9 -> this plan 4 (fusion=stitch, 1 FusionStitch)
  explore k=3 beam=3
  assumes equal sizes (checked on every call; other calls run another version): x[0] == y[0]
  rewrite 1.50 s, of which compile 0.25 s (3 compilations)
  [fused] fs/a/FusionStitch: 4 ops, 2 parts packed, 2 loop(s), buffered t1: Mul, Mul, AddV2, Exp
  [fallback] c/exp: Exp, Neg
      reason: CompileError: no compiler
  [split] d/x: a pack built as its 2 parts
      reason: pack of 2 parts split: SpecError: too big
  22 fusible-class ops left as TF ops:
""" + "".join(f"    e/op{i} (Tanh): no fusible neighbour\n" for i in range(20)) + \
    "    ... and 2 more"


def test_details_is_the_old_listing():
    report = sample()
    report.clusters.pop()          # the old listing had three clusters
    assert report.details() == OLD_LISTING


def test_summary_is_one_line_per_cluster_with_totals():
    text = str(sample())
    lines = text.splitlines()
    header = OLD_LISTING.splitlines()[:5]
    header[1] = header[1].replace("1 FusionStitch", "2 FusionStitch")
    assert lines[:5] == header
    assert lines[5] == ("  [fused] fs/a/FusionStitch: 4 ops (Mul x2, AddV2 x1, Exp x1), "
                        "in 1.0 KiB + 64 B×d, out 32 B×d, 2 loops (1 buffered), 2 parts packed")
    assert lines[6] == "  [fallback] c/exp: 2 ops (Exp x1, Neg x1): CompileError: no compiler"
    assert lines[7] == ("  [split] d/x: a pack built as its 2 parts: pack of 2 parts split: "
                        "SpecError: too big")
    assert lines[8] == ("  [fused] c/FusionStitch: 2 ops (Abs x1, Neg x1), in 3.0 MiB, "
                        "out 2.0 KiB, 1 loop")
    assert lines[9] == ("  total: 2 kernels of 6 ops, in 3.0 MiB + 64 B×d, out 2.0 KiB + 32 B×d, "
                        "2 parts in packs; 1 fallback(s) of 2 ops; 1 pack(s) split; 22 "
                        "fusible-class ops left as TF ops (details() says why)")
    assert lines[10] == report_text.DYNAMIC_NOTE
    assert len(lines) == 11


def test_op_kinds_counts_every_op_and_names_the_most_frequent():
    ops = [(f"n{i}", kind) for i, kind in enumerate(
        ["Mul"] * 12 + ["AddV2"] * 5 + ["A", "B", "C", "D", "E", "F"])]
    text = report_text.op_kinds(ops)
    assert text.startswith("Mul x12, AddV2 x5, A x1, B x1, C x1, D x1, +2 kinds")
    shown = dict(re.findall(r"(\w+) x(\d+)", text))
    counts = collections.Counter(kind for _, kind in ops)
    assert all(int(n) == counts[kind] for kind, n in shown.items())


def test_bytes_text():
    assert report_text.bytes_text(0, 0) == "0 B"
    assert report_text.bytes_text(1536, 0) == "1.5 KiB"
    assert report_text.bytes_text(0, 4 << 20) == "4.0 MiB×d"
    assert report_text.bytes_text(5 << 30, 100) == "5.0 GiB + 100 B×d"


def test_a_failed_rewrite_says_so_in_both():
    report = Report.failed("f", "()", "stitch", "ValueError: boom", 0.5)
    assert "not optimized" in str(report) and str(report) == report.details()


def test_the_graph_is_not_in_the_json():
    report = sample()
    report.graph.nodes.append(("x", "Placeholder"))
    back = Report.from_json(report.to_json())
    assert back.graph.nodes == [] and back.clusters == report.clusters
