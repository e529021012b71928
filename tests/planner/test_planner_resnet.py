"""keras.applications ResNet50's train step (random weights, SGD with momentum, ImageNet
shapes) imports with an axis rule for every convolution, batch statistic and pool, prices
its convolutions as He et al. count them, and `strategy="auto"` on 8xV100 picks data
parallelism."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import graph_import, ir, op_rules

BATCH, SIDE = 256, 224
# He et al. 2016, Table 1: ResNet-50 is 3.8e9 multiply-adds per 224x224 image.
PUBLISHED_MULTIPLY_ADDS = 3.8e9


class ResNet50Test(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        keras.utils.set_random_seed(0)
        model = keras.applications.ResNet50(weights=None, input_shape=(SIDE, SIDE, 3))
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
        optimizer.build(model.trainable_variables)

        @tf.function
        def step(images, labels):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                    labels, model(images, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        # Tracing allocates no activations: the batch only sets the static shapes.
        cls.graph = graph_import.from_function(
            step, (tf.zeros((BATCH, SIDE, SIDE, 3)), tf.zeros((BATCH,), tf.int32)))[0]

    def test_every_op_has_an_axis_rule(self):
        self.assertEqual(op_rules.conservative_ops(self.graph), {})

    def test_convolution_flops_match_the_published_count(self):
        by_type = {}
        for op in self.graph.ops.values():
            by_type[op.type] = by_type.get(op.type, 0.0) + op.flops / BATCH
        forward = sum(op.flops for op in self.graph.ops.values()
                      if op.type == "Conv2D" and op.phase == ir.FORWARD) / BATCH
        self.assertAllClose(forward, 2 * PUBLISHED_MULTIPLY_ADDS, rtol=0.05)
        # The filter gradient costs what the forward convolution does; the input gradient
        # a little less (the first convolution's input, the image, needs none).
        self.assertAllClose(by_type["Conv2DBackpropFilter"], forward, rtol=1e-12)
        self.assertLess(by_type["Conv2DBackpropInput"], forward)
        self.assertGreater(by_type["Conv2DBackpropInput"], 0.95 * forward)

    def test_auto_on_8xv100_is_data_parallel(self):
        plan = planner.search_graph(self.graph, "8xV100", strategy="auto", method="dp")
        self.assertEqual((plan.replicas, plan.tensor_parallel, len(plan.stages)), (8, 1, 1))
        self.assertTrue(plan.feasible)
        self.assertEqual({n: a for n, a in plan.variable_splits.items() if a is not None}, {})


if __name__ == "__main__":
    tf.test.main()
