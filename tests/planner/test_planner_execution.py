"""A planned pipeline placement runs on 4 logical CPU devices and matches one device.

Logical devices must be configured before TensorFlow initialises its devices, so this is
done when the module is imported (pytest imports every test module before running any).
If something initialised TF's devices earlier, the test is skipped with that reason.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

_DEVICES = 4
_SETUP_ERROR = None
try:
    _cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(_DEVICES)])
except RuntimeError as e:  # devices were initialised before this module was imported
    _SETUP_ERROR = str(e)

from tf_fusionstitch import planner  # noqa: E402
from tf_fusionstitch.planner import graph_import, reference_models  # noqa: E402


def _run_graph_def(graph_def, handle_map, input_names, output_name, inputs):
    """Runs a (placed) GraphDef once inside a tf.function; captured handles are remapped."""

    @tf.function
    def run(*args):
        feed = {name: tf.identity(v.handle) for name, v in handle_map.items()}
        feed.update({name: arg for name, arg in zip(input_names, args)})
        out, = tf.graph_util.import_graph_def(graph_def, input_map=feed,
                                              return_elements=[output_name], name="")
        return out

    result = run(*inputs)
    devices = {op.device for op in run.get_concrete_function(*inputs).graph.get_operations()}
    return result, devices


class PipelineExecutionTest(tf.test.TestCase):

    def setUp(self):
        super().setUp()
        if _SETUP_ERROR is not None or len(tf.config.list_logical_devices("CPU")) < _DEVICES:
            self.skipTest("TensorFlow's devices were initialised before this module could "
                          f"configure {_DEVICES} logical CPUs ({_SETUP_ERROR}); run this file "
                          "on its own: pytest tests/planner/test_planner_execution.py")

    def test_pipeline_plan_matches_single_device_step(self):
        sizes = dict(batch=16, sizes=(32, 64, 64, 64, 16))
        step, inputs, variables = reference_models.build_eager("mlp", seed=3, **sizes)
        graph, graph_def, concrete = graph_import.from_function(
            step, inputs, variables=variables.values())
        plan = planner.search_graph(graph, cluster="cpu-localhost", strategy="pipeline",
                                    method="dp")
        self.assertEqual(plan.num_stages, _DEVICES)
        placed = plan.apply(graph_def)
        placed_devices = {n.device for n in placed.node if n.device}
        self.assertLen(placed_devices, _DEVICES)

        # Reference: the original step on one device.
        loss_ref = step(*inputs).numpy()
        after_ref = {n: v.numpy() for n, v in variables.items()}

        # The placed graph on a fresh copy of the same initial weights, each variable on the
        # device of the stage that reads it first.
        consumer_device = {}
        for node in placed.node:
            for src in node.input:
                consumer_device.setdefault(src.split(":")[0].lstrip("^"), node.device)
        handle_map = {}
        _, _, fresh = reference_models.build_eager("mlp", seed=3, **sizes)
        for handle, tensor in graph.tensors.items():
            if tensor.variable and graph.ops[tensor.producer].type == "Placeholder":
                device = consumer_device.get(handle.split(":")[0]) or "/device:CPU:0"
                with tf.device(device):
                    copy = tf.Variable(fresh[tensor.variable].numpy(),
                                       name=tensor.variable.split(":")[0])
                handle_map[handle] = copy
        loss, ran_on = _run_graph_def(placed, handle_map, graph.inputs, graph.outputs[0],
                                      inputs)
        used = {d.split("device:")[-1] for d in ran_on if d}
        self.assertLen(used, _DEVICES, f"ops ran on {sorted(used)}")
        self.assertAllClose(loss.numpy(), loss_ref, rtol=1e-6, atol=0)
        by_name = {v.name: v for v in handle_map.values()}
        self.assertNotAllClose(by_name["layer0/w:0"].numpy(), fresh["layer0/w:0"].numpy())
        for name, value in after_ref.items():
            self.assertAllClose(by_name[name].numpy(), value, rtol=1e-6, atol=1e-7,
                                msg=f"variable {name} after the update")


if __name__ == "__main__":
    tf.test.main()
