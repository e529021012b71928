"""What the report's page draws (TF-free): where kernels sit, and that no
scope of a 5,000-node graph shows more boxes than a reader can take in."""

import collections
import random

from tf_fusionstitch import report_html
from tf_fusionstitch.report import ClusterReport, PlanGraph, Report


def test_a_kernel_sits_in_the_scope_of_most_of_its_ops():
    assert report_html.kernel_scope(["a/b/x", "a/b/y", "c/z"]) == "a/b"
    assert report_html.kernel_scope(["a/x", "b/y"]) == ""
    assert report_html.kernel_scope(["a/b/c/x"]) == "a/b/c"


def test_a_scope_of_one_op_is_dissolved():
    # "a/mul/y" (a constant in the scope TF opens for it) joins "a"; a/MatMul keeps two
    assert report_html.folded(["a/mul", "a", "a", "a/MatMul/R", "a/MatMul", "a/b/c/d", ""]) == \
        ["a", "a", "a", "a/MatMul", "a/MatMul", "a", ""]


def big_report(seed=0):
    """A train step's shape: 24 layers of scoped ops, an optimizer's 1,700
    flat ops in one scope, 300 kernels; 5,300 nodes."""
    rng = random.Random(seed)
    kinds = ["Mul", "AddV2", "MatMul", "ReadVariableOp", "Const", "Reshape", "Sub"]
    nodes = [(f"model/layer_{i}/{block}/op_{j}", rng.choice(kinds))
             for i in range(24) for block in ("attention", "ffn", "norm") for j in range(60)]
    nodes += [(f"adam/Sub_{j}", rng.choice(kinds)) for j in range(5000 - len(nodes))]
    clusters = []
    for k in range(300):
        members = rng.sample([n for n, _ in nodes[:4320]], 5)
        nodes.append((f"{members[0]}/FusionStitch_{k}", "FusionStitch"))
        clusters.append(ClusterReport(f"{members[0]}/FusionStitch_{k}",
                                      [(m, "Mul") for m in members], True, loops=1))
    edges = sorted({(i, i + rng.randint(1, 30)) for i in range(len(nodes) - 31)})
    return Report("step", "()", clusters, 5000, 300, 1.0, 300, 30.0,
                  graph=PlanGraph(nodes, edges))


def test_no_scope_of_a_5000_node_graph_shows_more_than_max_boxes():
    report = big_report()
    data = report_html.graph_data(report)
    assert [u[:2] for u in data["units"]] == [list(n) for n in report.graph.nodes]
    boxes = collections.defaultdict(set)     # scope -> its units and child scopes
    for name, _, _, scope in data["units"]:
        boxes[scope].add(name)
        parts = scope.split("/") if scope else []
        for depth in range(len(parts)):
            boxes["/".join(parts[:depth])].add("/".join(parts[:depth + 1]))
    assert max(len(b) for b in boxes.values()) <= report_html.MAX_BOXES
    assert "adam/[fused kernels x" not in " ".join(boxes)   # no kernel is in adam
    kernels = [u for u in data["units"] if u[2] >= 0]
    assert sorted(u[2] for u in kernels) == list(range(300))
