"""Fused pricing (`planner/fused_pricing.py`) and GEMM wave quantization, on hand-built IR
graphs with hand-computed bytes. TF-free."""

import pytest

from tf_fusionstitch.planner import cluster as cluster_lib
from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import fused_pricing, ir

N = 1024 * 256            # elements of one activation
ACT = N * 4               # its bytes


class Builder:
    def __init__(self):
        self.g = ir.Graph("g")

    def placeholder(self, name, shape=(1024, 256)):
        self.g.add_tensor(ir.Tensor(name, shape, "float32", 4))
        self.g.add_op(ir.Op(name + "_op", "Placeholder", [], [name]))
        return name

    def op(self, name, op_type, inputs, shape=(1024, 256), attrs=None):
        self.g.add_tensor(ir.Tensor(name, shape, "float32", 4))
        self.g.add_op(ir.Op(name + "_op", op_type, list(inputs), [name], dict(attrs or {})))
        return name

    def done(self, inputs, outputs):
        self.g.inputs, self.g.outputs = inputs, outputs
        return self.g.finalize()


def layer_norm_like():
    """x @ w, then centre and scale the rows (a reduction read by its consumers), then a
    second product: the memory-intensive ops between the products form one cluster."""
    b = Builder()
    x = b.placeholder("x", (1024, 256))
    w = b.placeholder("w", (256, 256))
    y = b.op("y", "MatMul", [x, w])
    axis = b.op("axis", "Const", [], shape=())
    mean = b.op("mean", "Mean", [y, axis], shape=(1024, 1))
    centred = b.op("centred", "Sub", [y, mean])
    square = b.op("square", "Square", [centred])
    var = b.op("var", "Mean", [square, axis], shape=(1024, 1))
    scale = b.op("scale", "Rsqrt", [var], shape=(1024, 1))
    normed = b.op("normed", "Mul", [centred, scale])
    out = b.op("out", "MatMul", [normed, w])
    return b.done([x, w], [out])


def placements(g):
    return {name: op.phase for name, op in g.ops.items()}


def test_a_cluster_reads_its_inputs_once_writes_its_outputs_once_and_launches_once():
    g = layer_norm_like()
    costs = fused_pricing.fused_costs(g, placements(g), "stitch")
    assert set(costs) == {f"{n}_op" for n in ("mean", "centred", "square", "var", "scale",
                                              "normed")}
    # y (the product's output) is read once, normed written once; nothing in between.
    assert sum(c.bytes for c in costs.values()) == 2 * ACT + 4   # + the axis constant
    assert [n for n, c in costs.items() if c.launches] == ["mean_op"]


def test_the_xla_rule_ends_a_cluster_at_each_reduction():
    g = layer_norm_like()
    costs = fused_pricing.fused_costs(g, placements(g), "xla")
    launches = [n for n, c in costs.items() if c.launches]
    # mean | centred, square, var | scale, normed: the reductions' readers start clusters.
    assert launches == ["mean_op", "centred_op", "scale_op"]
    # y is read by the first two clusters; centred is written by the second and read by
    # the third; normed written by the third; both row statistics are written and read.
    rows = 1024 * 4
    assert sum(c.bytes for c in costs.values()) == 2 * ACT + ACT + ACT + ACT + 4 * rows + 2 * 4


def test_the_cost_model_prices_a_cluster_below_its_ops_one_by_one():
    g = layer_norm_like()
    # FLOPs for free: every op is bound by memory traffic, and the products cost their
    # launch and bytes alone, the same under every rule.
    spec = cluster_lib.get_cluster({"base": "1xV100", "flops": 1e30})
    times = {}
    for rule in fused_pricing.RULES:
        model = cm.CostModel(g, spec, fusion=rule)
        times[rule] = model.evaluate(cm.Config()).step_time
    assert times["stitch"] < times["xla"] < times["none"]
    # The difference is exactly the traffic and the launches the clusters save.
    unfused_bytes = sum(op.bytes for op in g.ops.values()
                        if op.name in fused_pricing.fused_costs(g, placements(g), "stitch"))
    saved = (unfused_bytes - (2 * ACT + 4)) / spec.memory_bandwidth + 5 * spec.op_overhead
    assert times["none"] - times["stitch"] == pytest.approx(saved, rel=1e-9)


def test_views_alone_stay_free_and_clusters_stay_in_their_placement():
    b = Builder()
    x = b.placeholder("x")
    w = b.placeholder("w", (256, 256))
    flat = b.op("flat", "Reshape", [x])
    y = b.op("y", "MatMul", [flat, w])
    a = b.op("a", "Relu", [y])
    c = b.op("c", "Relu", [a])
    g = b.done([x, w], [c])
    place = {name: ("second" if name == "c_op" else "first") for name in g.ops}
    costs = fused_pricing.fused_costs(g, place, "stitch")
    assert costs["flat_op"] == fused_pricing.FusedCost(0.0, False)
    # a and c are in different places: two clusters, a's output written and read back.
    assert costs["a_op"] == fused_pricing.FusedCost(2 * ACT, True)
    assert costs["c_op"] == fused_pricing.FusedCost(2 * ACT, True)


def test_no_cluster_waits_for_its_own_output_through_a_product():
    # a = relu(x); b = a + a @ w: fusing a with b would make one kernel that feeds the
    # product and waits for it. They are two kernels, a's output written and read back.
    b = Builder()
    x = b.placeholder("x", (256, 256))
    w = b.placeholder("w", (256, 256))
    a = b.op("a", "Relu", [x], shape=(256, 256))
    y = b.op("y", "MatMul", [a, w], shape=(256, 256))
    out = b.op("out", "AddV2", [a, y], shape=(256, 256))
    g = b.done([x, w], [out])
    for rule in ("stitch", "xla"):
        costs = fused_pricing.fused_costs(g, placements(g), rule)
        tile = 256 * 256 * 4
        assert costs["a_op"] == fused_pricing.FusedCost(2 * tile, True)
        assert costs["out_op"] == fused_pricing.FusedCost(3 * tile, True)


def test_a_long_chain_is_one_cluster_without_recursion():
    b = Builder()
    x = b.placeholder("x", (64,))
    t = x
    for k in range(5000):
        t = b.op(f"t{k}", "Tanh", [t], shape=(64,))
    g = b.done([x], [t])
    costs = fused_pricing.fused_costs(g, placements(g), "stitch")
    assert sum(c.launches for c in costs.values()) == 1
    assert sum(c.bytes for c in costs.values()) == 2 * 64 * 4


def test_unknown_rules_are_refused_with_the_known_ones():
    g = layer_norm_like()
    with pytest.raises(ValueError, match="'stitch' or 'xla'"):
        fused_pricing.fused_costs(g, placements(g), "tvm")
    with pytest.raises(ValueError, match="none, stitch, xla"):
        cm.CostModel(g, cluster_lib.get_cluster("1xV100"), fusion="fused")


def test_wave_quantization():
    # 4096 x 1024 outputs in 128 x 128 tiles: 256 tiles, 4 waves of 80 -> 256 / 320.
    assert cm.wave_efficiency(4096 * 1024, 80) == pytest.approx(0.8)
    # 4096 x 4096: 1024 tiles in 13 waves.
    assert cm.wave_efficiency(4096 * 4096, 80) == pytest.approx(1024 / 1040)
    # Fewer tiles than units: tiled finer to fill the device.
    assert cm.wave_efficiency(64 * 512, 80) == 1.0
    assert cm.wave_efficiency(4096 * 1024, 0) == 1.0


def test_a_product_of_partly_full_waves_costs_its_waves():
    b = Builder()
    x = b.placeholder("x", (4096, 1024))
    w = b.placeholder("w", (1024, 1024))
    y = b.op("y", "MatMul", [x, w], shape=(4096, 1024))
    g = b.done([x, w], [y])
    v100 = cluster_lib.get_cluster("1xV100")
    flat = cluster_lib.get_cluster({"base": "1xV100", "compute_units": 0})
    quantized = cm.CostModel(g, v100).evaluate(cm.Config()).step_time
    peak = cm.CostModel(g, flat).evaluate(cm.Config()).step_time
    flops = 2 * 4096 * 1024 * 1024
    assert peak == pytest.approx(flops / v100.flops + v100.op_overhead)
    assert quantized == pytest.approx(flops / v100.flops / 0.8 + v100.op_overhead)


def test_compute_units_are_validated():
    with pytest.raises(ValueError, match="compute_units"):
        cluster_lib.get_cluster({"base": "8xV100", "compute_units": -1})
    assert cluster_lib.get_cluster("8xH200").compute_units == 132
