"""Cluster specs: presets, strings, dicts and JSON; impossible specs name the field. TF-free."""

import json
import subprocess
import sys

from absl.testing import absltest

from tf_fusionstitch import planner
from tf_fusionstitch.planner import cluster as cluster_lib


class ClusterSpecTest(absltest.TestCase):

    def test_presets(self):
        for name in planner.PRESETS:
            spec = planner.get_cluster(name)
            self.assertEqual(spec.name, name)
        v100 = planner.get_cluster("8xV100")
        self.assertEqual((v100.devices_per_node, v100.nodes, v100.num_devices), (8, 1, 8))
        self.assertEqual(v100.flops, 15.7e12)
        self.assertEqual(v100.memory, 32e9)
        big = planner.get_cluster("4x8xH200")
        self.assertEqual((big.devices_per_node, big.nodes, big.num_devices), (8, 4, 32))
        self.assertEqual(planner.get_cluster("cpu-localhost").device_type, "CPU")

    def test_logical_cpu_devices(self):
        spec = planner.get_cluster("2xCPU")
        self.assertEqual((spec.name, spec.device_type, spec.num_devices), ("2xCPU", "CPU", 2))
        self.assertEqual(spec.flops, planner.get_cluster("cpu-localhost").flops)
        self.assertEqual(spec.device_name(1), "/job:localhost/replica:0/task:0/device:CPU:1")
        with self.assertRaisesRegex(ValueError, "only 'NxCPU'"):
            planner.get_cluster("2x4xCPU")
        # Worker processes (planner.local_cluster) are nodes named as TF's workers.
        workers = cluster_lib.cpu_cluster(2, nodes=2, name="local-2x2xCPU")
        self.assertEqual(workers.device_name(3), "/job:worker/replica:0/task:1/device:CPU:1")
        self.assertGreater(workers.inter_bandwidth, 0)
        # Logical devices and localhost workers share the machine's cores; GPUs do not.
        self.assertTrue(spec.shared_cores and workers.shared_cores)
        self.assertFalse(planner.get_cluster("8xV100").shared_cores)
        with self.assertRaisesRegex(ValueError, "'shared_cores' must be true or false"):
            planner.get_cluster({"base": "2xCPU", "shared_cores": 1})

    def test_links_inside_and_across_nodes(self):
        spec = planner.get_cluster("2x8xH200")
        # No send figures: a pipeline's send takes the ring's link.
        self.assertEqual(spec.send_link(1), spec.link(2, 1))
        self.assertEqual(spec.send_link(8), spec.link(2, 8))
        # Logical CPUs hand tensors over in memory: the send figures, within the node only.
        cpus = planner.get_cluster({"base": "cpu-localhost", "send_bandwidth": 1e11,
                                    "send_latency": 1e-6})
        self.assertEqual(cpus.send_link(3), (1e11, 1e-6))
        self.assertEqual(cpus.link(2, 1), (cpus.intra_bandwidth, cpus.intra_latency))
        with self.assertRaisesRegex(ValueError, "'send_bandwidth' must be a finite number"):
            planner.get_cluster({"base": "cpu-localhost", "send_bandwidth": -1.0})
        self.assertEqual(spec.link(8, 1), (spec.intra_bandwidth, spec.intra_latency))
        self.assertEqual(spec.link(2, 8), (spec.inter_bandwidth, spec.inter_latency))
        self.assertEqual(spec.link(16, 1), (spec.inter_bandwidth, spec.inter_latency))
        self.assertEqual(spec.device_name(9), "/job:worker/replica:0/task:1/device:GPU:1")
        self.assertEqual(planner.get_cluster("cpu-localhost").device_name(3),
                         "/job:localhost/replica:0/task:0/device:CPU:3")

    def test_dict_and_json(self):
        spec = planner.get_cluster({"base": "8xA100", "memory": 40e9})
        self.assertEqual(spec.memory, 40e9)
        self.assertEqual(spec.flops, planner.get_cluster("8xA100").flops)
        full = planner.get_cluster("8xV100").to_dict()
        self.assertEqual(planner.get_cluster(json.dumps(full)), planner.get_cluster("8xV100"))

    def test_impossible_specs_name_the_field(self):
        cases = [("0xH200", "devices_per_node"), ("0x8xH200", "nodes"),
                 ({"base": "8xV100", "flops": -1}, "flops"),
                 ({"base": "8xV100", "memory": 0}, "memory"),
                 ({"base": "8xV100", "devices_per_node": 2.5}, "devices_per_node"),
                 ({"base": "2x8xV100", "inter_bandwidth": 0}, "inter_bandwidth"),
                 ({"base": "8xV100", "intra_latency": -1e-6}, "intra_latency"),
                 ({"base": "8xV100", "device_type": "TPU"}, "device_type"),
                 ({"base": "8xV100", "bandwidth": 1}, "bandwidth"),
                 ({"name": "x", "nodes": 1}, "missing"),
                 ("8xP100", "unknown device"), ("eight GPUs", "cannot parse"),
                 ("{not json", "JSON"), (8, "str or dict")]
        for spec, field in cases:
            with self.assertRaisesRegex(ValueError, field, msg=repr(spec)):
                planner.get_cluster(spec)

    def test_planner_core_does_not_import_tensorflow(self):
        code = ("import sys\n"
                "import tf_fusionstitch.planner as p\n"
                "from tf_fusionstitch.planner import ir, op_rules, linkage, cost_model, "
                "strategies, searches, plan, cluster\n"
                "print('tensorflow' in sys.modules)\n")
        out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True,
                             text=True, timeout=120, cwd="/")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.strip(), "False")


if __name__ == "__main__":
    absltest.main()
