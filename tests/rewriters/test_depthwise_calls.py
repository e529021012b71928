"""Depthwise convolutions that Keras writes as a grouped Conv2D in a call XLA
compiles run as TF's DepthwiseConv2dNative (rewriters/depthwise_calls.py):
Keras layers as users write them, fresh random inputs, TF's results."""

import numpy as np
import keras
import tensorflow as tf
from absl.testing import parameterized
from tensorflow.core.framework import node_def_pb2

import tf_fusionstitch as fs
from tf_fusionstitch.rewriters import depthwise_calls
from tests.optimize_testlib import quiet_call, random, rng

EPS32 = float(np.finfo(np.float32).eps)


def _grouped_model(channels, multiplier, kernel, strides, padding, dilation=1, groups=None):
    inputs = keras.Input([13, 13, channels])
    conv = keras.layers.Conv2D(channels * multiplier, kernel, strides=strides, padding=padding,
                               dilation_rate=dilation, groups=groups or channels,
                               use_bias=False)
    model = keras.Model(inputs, conv(inputs))
    fn = tf.function(lambda x: model(x), input_signature=[tf.TensorSpec([None, 13, 13,
                                                                         channels])])
    return fn, conv


def _ops(graph_def):
    return [n.op for n in graph_def.node]


class DepthwiseCallsTest(tf.test.TestCase, parameterized.TestCase):

    @parameterized.named_parameters(
        ("7x7_same", 6, 1, 7, 1, "same"),         # ConvNeXt's
        ("3x3_valid_stride_2_multiplier_3", 4, 3, 3, 2, "valid"),
        ("5x5_same_stride_2_multiplier_2", 5, 2, 5, 2, "same"),
    )
    def test_grouped_convolutions_run_as_depthwise_and_match_tf(
            self, channels, multiplier, kernel, strides, padding):
        fn, conv = _grouped_model(channels, multiplier, kernel, strides, padding)
        opt = fs.optimize(fn)
        gen = rng(7300)
        for batch in (2, 3):
            x = random(gen, (batch, 13, 13, channels), "float32")
            got, want = quiet_call(opt, x), fn(x)
            self.assertEqual(got.shape, want.shape)
            # Both are sums of kernel*kernel products, so each lies within
            # (n + 2) eps sum|x w| of the exact value (n: the products summed).
            filt = np.reshape(np.abs(conv.kernel.numpy()).astype(np.float64),
                              (kernel, kernel, channels, multiplier))
            magnitude = tf.nn.depthwise_conv2d(
                np.abs(x.numpy()).astype(np.float64), filt, [1, strides, strides, 1],
                padding.upper()).numpy()
            bound = 2 * (kernel * kernel + 2) * EPS32 * magnitude
            np.testing.assert_array_less(np.abs(got.numpy() - want.numpy()), bound + 1e-30)
        report = opt.report()
        self.assertLen(report.substitutions, 1)
        self.assertEqual(report.substitutions[0][2], "DepthwiseConv2dNative")
        self.assertIn("replaced by DepthwiseConv2dNative", str(report))
        ops = _ops(opt.graph_def)
        self.assertIn("DepthwiseConv2dNative", ops)
        self.assertNotIn("StatefulPartitionedCall", ops)

    def test_the_option_off_keeps_the_call(self):
        fn, _ = _grouped_model(4, 1, 3, 1, "same")
        opt = fs.optimize(fn, depthwise_calls=False)
        x = random(rng(7301), (2, 13, 13, 4), "float32")
        self.assertAllEqual(quiet_call(opt, x), fn(x))
        self.assertEqual(opt.report().substitutions, [])
        self.assertIn("StatefulPartitionedCall", _ops(opt.graph_def))

    @parameterized.named_parameters(
        ("dilated", dict(dilation=2)),
        ("groups_of_two_channels", dict(groups=2)),
    )
    def test_other_grouped_convolutions_stay_calls(self, args):
        fn, _ = _grouped_model(4, 1, 3, 1, "same", **args)
        opt = fs.optimize(fn)
        x = random(rng(7302), (2, 13, 13, 4), "float32")
        self.assertAllEqual(quiet_call(opt, x), fn(x))   # the same XLA call runs
        self.assertEqual(opt.report().substitutions, [])

    def test_reasons(self):
        def body(**attrs):
            conv = node_def_pb2.NodeDef(name="c", op="Conv2D")
            conv.attr["T"].type = attrs.get("dtype", tf.float32).as_datatype_enum
            conv.attr["data_format"].s = attrs.get("data_format", b"NHWC")
            conv.attr["dilations"].list.i.extend(attrs.get("dilations", [1, 1, 1, 1]))
            conv.attr["strides"].list.i.extend(attrs.get("strides", [1, 1, 1, 1]))
            return depthwise_calls.Body(conv, 0, 1, True)
        T = fs.fusion_ir.TensorType
        x, w = T("float32", (None, 8, 8, 4)), T("float32", (3, 3, 1, 8))
        self.assertEqual(depthwise_calls.why_not(body(), x, w), "")
        cases = {
            "not NHWC": (body(data_format=b"NCHW"), x, w),
            "dtype float16": (body(dtype=tf.float16), x, w),
            "dilated": (body(dilations=[1, 2, 2, 1]), x, w),
            "equal spatial strides": (body(strides=[1, 1, 2, 1]), x, w),
            "channels are not known": (body(), T("float32", (None, 8, 8, None)), w),
            "filter's shape": (body(), x, None),
            "single channels": (body(), x, T("float32", (3, 3, 2, 8))),
            "not a multiple of 4": (body(), x, T("float32", (3, 3, 1, 6))),
        }
        for expected, args in cases.items():
            self.assertIn(expected, depthwise_calls.why_not(*args))


if __name__ == "__main__":
    tf.test.main()
