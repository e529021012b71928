"""An optimized function's eager calls run under the caller's config with one
round of TF's meta-optimizer (call_config.py): the rewritten graph has been
through the simplifying rounds already. The caller's own settings and their
rounds, when chosen, are kept, and the thread's options are restored after."""

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
from tensorflow.python.eager import context

import tf_fusionstitch as fs
from tf_fusionstitch import call_config
from optimize_testlib import assert_same, rng

RewriterConfig = rewriter_config_pb2.RewriterConfig


def _current_config() -> config_pb2.ConfigProto:
    serialized = context.context().function_call_options.config_proto_serialized
    return config_pb2.ConfigProto.FromString(serialized)


class OneRoundTest(tf.test.TestCase):

    def test_default_rounds_become_one_and_chosen_rounds_stay(self):
        config = config_pb2.ConfigProto(inter_op_parallelism_threads=3)
        config.graph_options.rewrite_options.remapping = RewriterConfig.OFF
        derived = call_config.one_round(config.SerializeToString())
        rewrite = derived.graph_options.rewrite_options
        self.assertEqual(rewrite.meta_optimizer_iterations, RewriterConfig.ONE)
        self.assertEqual(rewrite.remapping, RewriterConfig.OFF)
        self.assertEqual(derived.inter_op_parallelism_threads, 3)

        config.graph_options.rewrite_options.meta_optimizer_iterations = RewriterConfig.TWO
        kept = call_config.one_round(config.SerializeToString())
        self.assertEqual(kept.graph_options.rewrite_options.meta_optimizer_iterations,
                         RewriterConfig.TWO)

    def test_the_block_runs_one_round_with_the_callers_settings_then_restores(self):
        ctx = context.context()
        saved = ctx.function_call_options
        callers = config_pb2.ConfigProto.FromString(saved.config_proto_serialized)
        callers.graph_options.rewrite_options.remapping = RewriterConfig.OFF
        ctx.function_call_options = context.FunctionCallOptions(config_proto=callers)
        try:
            before = ctx.function_call_options
            with call_config.rewritten_calls():
                rewrite = _current_config().graph_options.rewrite_options
                self.assertEqual(rewrite.meta_optimizer_iterations, RewriterConfig.ONE)
                self.assertEqual(rewrite.remapping, RewriterConfig.OFF)
            self.assertIs(ctx.function_call_options, before)
        finally:
            ctx.function_call_options = saved

    def test_inside_another_function_nothing_changes(self):
        seen = []

        @tf.function
        def outer():
            before = context.context().function_call_options
            with call_config.rewritten_calls():
                seen.append(context.context().function_call_options is before)
            return tf.constant(0)
        outer()
        self.assertEqual(seen, [True])

    def test_an_optimized_call_gives_tfs_results_and_leaves_the_thread_as_it_was(self):
        w = tf.Variable(rng(0).standard_normal([16, 8]).astype("float32"))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
        def f(x):
            h = tf.nn.relu(x @ w + 1.0)
            return tf.nn.softmax(h * 2.0 - tf.reduce_mean(h, axis=-1, keepdims=True))
        fast = fs.optimize(f)
        before = context.context().function_call_options
        for rows in (3, 5):
            x = tf.constant(rng(rows).standard_normal([rows, 16]).astype("float32"))
            assert_same(self, fast(x), f(x))
            self.assertIs(context.context().function_call_options, before)
        self.assertGreater(fast.report().kernels_before, fast.report().kernels_after)


if __name__ == "__main__":
    tf.test.main()
