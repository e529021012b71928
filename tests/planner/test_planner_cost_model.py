"""Cost-model terms against hand-computed values, and BERT-large against a published figure."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.planner import cost_model as cm
from tf_fusionstitch.planner import graph_import, reference_models

from benchmarks import planner_models  # the repository root (pytest's pythonpath)


class FormulaTest(tf.test.TestCase):
    """Each term of the cost model, worked out by hand."""

    def test_roofline(self):
        # 2e12 FLOPs at 1e12 FLOP/s = 2 s; 1e9 B at 1e11 B/s = 0.01 s -> compute bound.
        self.assertAllClose(cm.roofline_time(2e12, 1e9, 1e12, 1e11, 1e-6), 2.000001)
        # 1e9 FLOPs = 1 ms; 1e11 B = 1 s -> memory bound.
        self.assertAllClose(cm.roofline_time(1e9, 1e11, 1e12, 1e11), 1.0)
        self.assertEqual(cm.roofline_time(0, 0, 1e12, 1e11, 1e-6), 0.0)

    def test_ring_collectives(self):
        n, nbytes, bw, lat = 4, 1e9, 1e11, 1e-5
        # 2(n-1) alpha + 2(n-1)/n N/beta = 6e-5 + 1.5 * 0.01
        self.assertAllClose(cm.all_reduce_time(nbytes, n, bw, lat), 6e-5 + 0.015)
        # (n-1) alpha + (n-1)/n N/beta = 3e-5 + 0.75 * 0.01
        self.assertAllClose(cm.all_gather_time(nbytes, n, bw, lat), 3e-5 + 0.0075)
        self.assertAllClose(cm.reduce_scatter_time(nbytes, n, bw, lat), 3e-5 + 0.0075)
        self.assertAllClose(cm.p2p_time(nbytes, bw, lat), 1e-5 + 0.01)
        self.assertEqual(cm.all_reduce_time(nbytes, 1, bw, lat), 0.0)
        self.assertAllClose(cm.traffic("all_reduce", 1e9, 4), 1.5e9)
        self.assertAllClose(cm.traffic("all_gather", 1e9, 4), 0.75e9)
        self.assertAllClose(cm.traffic("reduce_scatter", 1e9, 4), 0.75e9)
        self.assertEqual(cm.traffic("all_reduce", 1e9, 1), 0.0)

    def test_pipeline_schedule(self):
        # (m + p - 1) * slowest stage: (4 + 3 - 1) * 3 = 18.
        self.assertEqual(cm.pipeline_time([1.0, 2.0, 3.0], 4), 18.0)
        self.assertAllClose(cm.bubble_fraction(3, 4), 2 / 6)
        self.assertEqual(cm.in_flight_micro_batches(0, 4, 8, "gpipe"), 8)
        self.assertEqual(cm.in_flight_micro_batches(0, 4, 8, "1f1b"), 4)
        self.assertEqual(cm.in_flight_micro_batches(3, 4, 8, "1f1b"), 1)
        self.assertEqual(cm.in_flight_micro_batches(0, 4, 2, "1f1b"), 2)
        with self.assertRaisesRegex(ValueError, "schedule"):
            cm.in_flight_micro_batches(0, 4, 2, "zigzag")

    def test_memory_formula(self):
        self.assertEqual(cm.memory_per_device(10, 20, 5, 3), 45)


class TracedStepTest(tf.test.TestCase):
    """Memory and data-parallel terms on a real traced step, computed by hand."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # One dense layer x(16,4) @ w(4,8) + b, loss mean(square(.)), Adam: 40 parameters.
        step, inputs, variables = reference_models.build_eager("mlp", batch=16, sizes=(4, 8))
        cls.graph = graph_import.from_function(step, inputs, variables=variables.values())[0]

    def test_weights_gradients_optimizer_state_activations(self):
        cluster = planner.get_cluster("1xV100")
        est = cm.CostModel(self.graph, cluster).evaluate(cm.Config())
        params = 4 * 8 + 8
        weights_and_adam = params * 4 * 3          # w, m, v in float32
        gradients = params * 4
        # Saved for backward: x (16x4, read by the weight gradient) and the layer output
        # (16x8, read by the gradient of the square). Views and the loss are not saved.
        activations = (16 * 4 + 16 * 8) * 4
        self.assertEqual(est.peak_memory, weights_and_adam + gradients + activations)

    def test_data_parallel_gradient_all_reduce(self):
        cluster = planner.get_cluster("2xV100")
        model = cm.CostModel(self.graph, cluster)
        est = model.evaluate(cm.Config(replicas=2))
        grads = (4 * 8 + 8) * 4
        # Ring over 2 NVLink peers: 2(n-1) alpha + 2(n-1)/n N / beta.
        expected = 2 * 5e-6 + grads / 150e9
        self.assertAllClose(est.dp_times, [expected])
        # Activations halve with the per-replica batch; weights do not.
        self.assertEqual(est.peak_memory, 40 * 4 * 3 + 40 * 4 + (8 * 4 + 8 * 8) * 4)
        # Step = compute + update + all-reduce, nothing overlapped.
        self.assertAllClose(est.step_time, est.stage_times[0] + est.update_times[0] + expected)

    def test_step_time_follows_the_pipeline_formula(self):
        cluster = planner.get_cluster("2xV100")
        model = cm.CostModel(self.graph, cluster)
        est = model.evaluate(cm.Config(stages=2, micro_batches=4, cuts=(1,)))
        self.assertLen(est.stage_times, 2)
        self.assertAllClose(est.step_time, (4 + 2 - 1) * max(est.stage_times)
                            + max(est.update_times) + max(est.dp_times))

    def test_devices_sharing_cores_take_all_their_work_end_to_end(self):
        # 2xCPU: two logical devices of one process on the same cores. Measured on 4xCPU
        # (benchmarks/plan_execution.py), data parallelism ran slower than the one-device
        # work it splits, and a pipeline of one micro-batch with unequal stages as fast as
        # one device: the devices compute no faster together than one alone, and no
        # pipeline bubble idles the cores.
        shared = planner.get_cluster("2xCPU")
        own = planner.get_cluster({"base": "2xCPU", "shared_cores": False})
        self.assertTrue(shared.shared_cores)
        one = cm.CostModel(self.graph, planner.get_cluster("1xCPU")).evaluate(cm.Config())
        data = cm.CostModel(self.graph, shared).evaluate(cm.Config(replicas=2))
        alone = cm.CostModel(self.graph, own).evaluate(cm.Config(replicas=2))
        # Both replicas' work (each half the batch) in turn, then the all-reduce.
        self.assertAllClose(data.step_time, 2 * (data.stage_times[0] + data.update_times[0])
                            + data.dp_times[0])
        self.assertGreater(data.step_time, alone.step_time)
        # Two stages of one micro-batch, however unequal, over a free link: the one-device
        # work, where the pipeline formula would charge twice the slower stage.
        free_link = planner.get_cluster({"base": "2xCPU", "intra_bandwidth": 1e30,
                                         "intra_latency": 0.0})
        piped = cm.Config(stages=2, micro_batches=1, cuts=(1,))
        est = cm.CostModel(self.graph, free_link).evaluate(piped)
        self.assertAllClose(est.step_time, one.step_time)
        self.assertLess(est.step_time, 2 * max(est.stage_times) + max(est.update_times))

    def test_invalid_configs_are_refused(self):
        model = cm.CostModel(self.graph, planner.get_cluster("2xV100"))
        with self.assertRaisesRegex(ValueError, "devices"):
            model.evaluate(cm.Config(replicas=4))
        with self.assertRaisesRegex(ValueError, "batch 16"):
            model.evaluate(cm.Config(stages=2, micro_batches=3, cuts=(1,)))
        with self.assertRaisesRegex(ValueError, "cuts"):
            model.evaluate(cm.Config(stages=2, micro_batches=2, cuts=()))


class PipelineStagesTest(tf.test.TestCase):
    """Where backward and update ops run, and what crosses a cut, on a two-layer MLP."""

    def test_two_stage_split_between_the_layers(self):
        step, inputs, variables = reference_models.build_eager("mlp", batch=16,
                                                               sizes=(4, 8, 2))
        graph = graph_import.from_function(step, inputs, variables=variables.values())[0]
        model = cm.CostModel(graph, planner.get_cluster("2xV100"))
        cut = model.unit_of["MatMul_1"]            # layer 1 starts stage 1
        stage = dict(zip(range(model.num_units), model.stage_of_unit((cut,))))
        on = {name: stage[u] for name, u in model.anchor.items()}
        updates = {op.inputs[0]: op.name for op in graph.ops.values()
                   if op.type == "ResourceApplyAdam"}
        w1_update = updates[graph.variables["layer1/w:0"].handle]
        w0_update = updates[graph.variables["layer0/w:0"].handle]
        # A weight's gradient and update run where the weight's layer runs.
        self.assertEqual(on["gradient_tape/MatMul_1/MatMul_1"], 1)   # dW1
        self.assertEqual(on["gradient_tape/MatMul_1/MatMul"], 1)     # dX1
        self.assertEqual(on[w1_update], 1)
        self.assertEqual(on["gradient_tape/ReluGrad"], 0)
        self.assertEqual(on["gradient_tape/MatMul/MatMul"], 0)       # dW0
        self.assertEqual(on[w0_update], 0)
        for m in (1, 2):
            est = model.evaluate(cm.Config(stages=2, micro_batches=m, cuts=(cut,)))
            # Crossing the cut per micro-batch: the ReLU output forward, its gradient back,
            # 16/m x 8 floats each.
            self.assertEqual(est.p2p_bytes, [16 * 8 * 4 / m, 16 * 8 * 4 / m])
            # Weights, Adam slots and gradients: layer 0 (4x8 + 8) and layer 1 (8x2 + 2).
            w0, w1 = (4 * 8 + 8) * 4, (8 * 2 + 2) * 4
            acts0 = (16 * 4 + 16 * 8) * 4 / m   # x and the first layer's output
            acts1 = 16 * 2 * 4 / m              # y_hat - y, read by the square's gradient
            # 1F1B: stage 0 holds min(p, m) micro-batches in flight, stage 1 one.
            self.assertEqual(est.memory_per_stage, [4 * w0 + acts0 * min(2, m), 4 * w1 + acts1])
            # GPipe runs all m forwards first: every stage holds m micro-batches.
            gpipe = model.evaluate(cm.Config(stages=2, micro_batches=m, cuts=(cut,),
                                             schedule="gpipe"))
            self.assertEqual(gpipe.memory_per_stage, [4 * w0 + acts0 * m, 4 * w1 + acts1 * m])
            self.assertEqual(gpipe.step_time, est.step_time)


class BertLargeTest(tf.test.TestCase):

    # Published: NVIDIA DeepLearningExamples, TensorFlow/LanguageModeling/BERT/README.md,
    # "Pre-training training performance: single-node on DGX-1 32GB" (8x V100 32GB,
    # TF 20.06 container, scripts/run_pretraining_lamb.sh), sequence length 128, FP32, batch
    # 32 per GPU: 357.00 sentences/s on 8 GPUs.
    # https://github.com/NVIDIA/DeepLearningExamples/tree/master/TensorFlow/LanguageModeling/BERT
    # One step of 8 x 32 sequences therefore takes 256 / 357.00 = 0.717 s. FP32, so the
    # 8xV100 preset's peak is V100 SXM2's FP32 15.7 TFLOP/s (no tensor cores). The script
    # runs with XLA (its use_xla defaults to true), so the step's memory-intensive ops run
    # fused: priced with fusion="xla". Their run accumulates gradients over 256 micro-steps
    # (all-reduce and LAMB update amortised); our step all-reduces and updates every step,
    # ~36 ms of 0.7 s.
    PUBLISHED = 256 / 357.00

    def test_keras_hub_pretraining_step_matches_published_v100_throughput(self):
        # keras_hub's BertBackbone at BERT-large's configuration with the run's heads (masked
        # LM on 20 positions a sequence, tied to the token embedding; next sentence), LAMB
        # and dropout 0.1, built from constructors at the run's full size (graph mode,
        # nothing allocated).
        graph = planner_models.bert_pretraining_ir()
        params = sum(v.nbytes // 4 for v in graph.trainable_variables())
        self.assertBetween(params, 330e6, 340e6)    # BERT-large
        cluster = planner.get_cluster("8xV100")
        times = {}
        for fusion in ("xla", "stitch", "none"):
            est = cm.CostModel(graph, cluster, fusion).evaluate(cm.Config(replicas=8))
            self.assertTrue(est.feasible, est.reason)
            times[fusion] = est.step_time
            print(f"\nkeras_hub BERT-large pre-training, 8xV100 data parallel, fusion={fusion}: "
                  f"predicted {est.step_time:.3f} s/step, published {self.PUBLISHED:.3f} s/step "
                  f"({(est.step_time - self.PUBLISHED) / self.PUBLISHED:+.1%})")
        self.assertLess(abs(times["xla"] - self.PUBLISHED) / self.PUBLISHED, 0.10)
        # Unfused, the same step's ~18,500 memory-intensive ops, one kernel each, cost far more.
        self.assertGreater(times["none"], 1.2 * times["xla"])

    def test_reference_model_data_parallel_step_time(self):
        graph = reference_models.build_graph_ir("bert_large", batch=256, seq=128)
        params = sum(v.nbytes // 4 for v in graph.trainable_variables())
        self.assertBetween(params, 330e6, 340e6)    # BERT-large
        est = cm.CostModel(graph, planner.get_cluster("8xV100"), "xla").evaluate(
            cm.Config(replicas=8))
        self.assertTrue(est.feasible, est.reason)
        error = (est.step_time - self.PUBLISHED) / self.PUBLISHED
        print(f"\nreference BERT-large 8xV100 data parallel: predicted {est.step_time:.3f} "
              f"s/step, published {self.PUBLISHED:.3f} s/step ({error:+.1%})")
        self.assertLess(abs(error), 0.10)

    def test_weights_larger_than_a_device_are_infeasible_data_parallel(self):
        # 4 layers of hidden 16384: 12.9e9 parameters, 51.5 GB of float32 weights alone,
        # against 32 GB per V100.
        graph = reference_models.build_graph_ir("transformer_block", batch=8, seq=128,
                                                hidden=16384, heads=128, ffn=65536, layers=4)
        weights = sum(v.nbytes for v in graph.trainable_variables())
        cluster = planner.get_cluster("8xV100")
        self.assertGreater(weights, cluster.memory)
        plan = planner.search_graph(graph, cluster, strategy="data", method="exhaustive")
        self.assertFalse(plan.feasible)
        self.assertIn("GB", plan.infeasible_reason)
        self.assertIn("INFEASIBLE", str(plan))
        # Splitting the layers 8 ways over the same devices makes it fit.
        split = planner.search_graph(graph, cluster, strategy="operator", method="exhaustive")
        self.assertTrue(split.feasible, split.infeasible_reason)
        self.assertLess(split.peak_memory_per_device, cluster.memory)


if __name__ == "__main__":
    tf.test.main()
