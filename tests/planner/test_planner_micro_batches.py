"""`micro_batches.schedule`: GPipe and 1F1B orders per pipeline stage; the batch axes of a
fused kernel's values (`batch_axes`) and the check that what the writes read of one is a
mean over the batch (TF-free)."""

import types

from absl.testing import absltest

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.planner import batch_axes, micro_batches


def _f32(*shape):
    return ir.TensorType("float32", shape)


def _op(name, prim, inputs, extents, **attrs):
    return ir.make_op(name, prim, inputs, _f32(*extents), **attrs)


def _kernel(inputs, ops, outputs):
    """A FusionStitch NodeDef stand-in: its name and its spec."""
    spec = ir.Cluster(tuple(inputs), tuple(ops), tuple(outputs)).to_json()
    return types.SimpleNamespace(name="kernel", attr={"spec": types.SimpleNamespace(
        s=spec.encode("utf-8"))})


def _spelled(order):
    return " ".join(f"{phase[0].upper()}{i}" for i, phase in order)


class ScheduleTest(absltest.TestCase):

    def test_gpipe_runs_every_forward_first(self):
        orders = micro_batches.schedule("gpipe", stages=2, micro_batches=3)
        self.assertEqual([_spelled(o) for o in orders], ["F0 F1 F2 B0 B1 B2"] * 2)

    def test_1f1b_fills_then_alternates(self):
        orders = micro_batches.schedule("1f1b", stages=4, micro_batches=4)
        self.assertEqual([_spelled(o) for o in orders], [
            "F0 F1 F2 F3 B0 B1 B2 B3",
            "F0 F1 F2 B0 F3 B1 B2 B3",
            "F0 F1 B0 F2 B1 F3 B2 B3",
            "F0 B0 F1 B1 F2 B2 F3 B3"])

    def test_unknown_schedule(self):
        with self.assertRaisesRegex(ValueError, "unknown pipeline schedule 'zigzag'"):
            micro_batches.schedule("zigzag", stages=2, micro_batches=2)


# A bias gradient fused with its update: in0 is the activation gradient [batch, 8, 16],
# in1 the pre-activation (ReLU's mask), in2 the bias. The sum runs over the batch and the
# sequence; the update scales it (SGD) or squares it (Adam's second moment).
_BIAS_GRADIENT = [
    _op("t0", "const", [], (), value=0.0),
    ir.make_op("t1", "greater", ["in1", "t0"], ir.TensorType("bool", (4, 8, 16))),
    _op("t2", "select", ["t1", "in0", "t0"], (4, 8, 16)),
    _op("t3", "reduce_sum", ["t2"], (16,), axes=[0, 1], keep_dims=False),
]
_BIAS_INPUTS = [("in0", _f32(4, 8, 16)), ("in1", _f32(4, 8, 16)), ("in2", _f32(16))]


class BatchAxesTest(absltest.TestCase):

    def test_axes_follow_the_kernel_primitives(self):
        ops = _BIAS_GRADIENT + [
            _op("t4", "reshape", ["in0"], (4, 8, 1, 16), shape=[4, 8, 1, 16]),
            _op("t5", "transpose", ["t4"], (16, 1, 8, 4), perm=[3, 2, 1, 0]),
            _op("t6", "reduce_mean", ["in0"], (4, 1, 16), axes=[1], keep_dims=True),
            _op("t7", "mul", ["t6", "in2"], (4, 1, 16)),
        ]
        axes = batch_axes._propagate(ir.Cluster(tuple(_BIAS_INPUTS), tuple(ops), ("t3",)),
                                     [frozenset({0}), frozenset({0}), frozenset()])
        self.assertEqual(axes["t2"], {0})
        self.assertEqual(axes["t3"], frozenset())       # summed over the batch
        self.assertEqual(axes["t4"], {0})
        self.assertEqual(axes["t5"], {3})
        self.assertEqual(axes["t6"], {0})                # another axis reduced
        self.assertEqual(axes["t7"], {0})                # broadcast on the right

    def test_a_reshape_dropping_one_example_is_the_batch_sum(self):
        self.assertEqual(batch_axes._reshaped((1, 8, 16), (8, 16), {0}), frozenset())
        self.assertEqual(batch_axes._reshaped((8, 16), (1, 8, 16), {0}), {1})
        self.assertEqual(batch_axes._reshaped((4, 8), (4, 8, 1), {0}), {0})
        self.assertIsNone(batch_axes._reshaped((2, 3), (6,), {0}))

    def test_a_chain_of_kernels_resolves_without_recursion(self):
        # Kernel k reads kernel k-1's output: 3,000 of them, deeper than Python's stack.
        depth = 3000
        spec = ir.Cluster((("in0", _f32(4, 16)),),
                          (_op("t0", "neg", ["in0"], (4, 16)),), ("t0",)).to_json()

        def fused(node):
            k = int(node[1:])
            return None if k == 0 else (spec, [f"k{k - 1}:0"])

        def shapes(tensor):
            return (2, 16), (4, 16)   # only k0's output is not fused
        axes = batch_axes.BatchAxes(shapes, fused)
        self.assertEqual(axes.of(f"k{depth}:0"), {0})


class AffineCheckTest(absltest.TestCase):

    def check(self, ops, output):
        kernel = _kernel(_BIAS_INPUTS, ops, [output])
        micro_batches._check_affine(kernel, "kernel:0", [True, True, False],
                                    {"in0", "in1", "t1", "t2"})

    def test_a_scaled_sum_over_the_batch_is_a_mean(self):
        self.check(_BIAS_GRADIENT + [
            _op("t4", "const", [], (), value=0.1),
            _op("t5", "mul", ["t3", "t4"], (16,)),
            _op("t6", "sub", ["in2", "t5"], (16,))], "t6")

    def test_a_square_after_the_sum_is_refused(self):
        with self.assertRaisesRegex(ValueError, "kernel computes kernel:0.*nonlinear"):
            self.check(_BIAS_GRADIENT + [_op("t4", "square", ["t3"], (16,))], "t4")


if __name__ == "__main__":
    absltest.main()
