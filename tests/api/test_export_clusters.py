"""optimize(...).export_clusters: the fusion specs of a traced function as
files that the TF-free cuda_check tool reads."""

import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

import tf_fusionstitch as fs
from tf_fusionstitch import fusion_ir as ir


class ExportClustersTest(tf.test.TestCase):

    def test_every_kernel_of_every_trace_is_written_once(self):
        @tf.function
        def f(x, g, b):
            mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
            y = (x - mean) * tf.math.rsqrt(var + 1e-5) * g + b
            return tf.nn.softmax(y * 2.0, axis=-1)

        fast = fs.optimize(f)
        rng = np.random.default_rng(0)
        for rows, width in ((3, 96), (5, 96), (4, 40)):  # two signatures, one retrace
            x = rng.standard_normal((rows, width)).astype(np.float32)
            g = rng.standard_normal((width,)).astype(np.float32)
            b = rng.standard_normal((width,)).astype(np.float32)
            self.assertAllClose(fast(x, g, b), f(x, g, b), rtol=2e-5, atol=1e-6)
        out = self.get_temp_dir() + "/clusters"
        paths = fast.export_clusters(out)
        kernels = {n.attr["spec"].s for gd in fast._graph_defs for n in gd.node
                   if n.op == "FusionStitch"}
        self.assertLen(paths, len(kernels))
        self.assertGreaterEqual(len(paths), 2)  # one per traced width at least
        for path in paths:
            self.assertTrue(path.name.startswith("f_") and path.suffix == ".json")
            cluster = ir.Cluster.from_json(path.read_text())
            self.assertIn(path.read_bytes(), kernels)
            self.assertTrue(cluster.ops)
        self.assertEqual(fast.export_clusters(out), paths)  # same names, same files

    def test_cuda_check_reads_the_exported_files(self):
        @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
        def g(x):
            return tf.nn.softmax(x) * 3.0

        fast = fs.optimize(g)
        fast(np.random.default_rng(1).standard_normal((6, 64)).astype(np.float32))
        (path,) = fast.export_clusters(self.get_temp_dir() + "/softmax")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
        res = subprocess.run([sys.executable, "-m", "tf_fusionstitch.tools.cuda_check",
                              "--nopatterns", f"--clusters={path}", "--arch=sm_90",
                              "--rows=0,3", "--on_gpu=no"],
                             capture_output=True, text=True, timeout=600, env=env)
        self.assertEqual(res.returncode, 0, res.stdout + res.stderr)
        self.assertEqual(res.stdout.splitlines()[-1],
                         "cuda_check: 1 kernels, 1 compiled, 1 checked, 0 failed")


if __name__ == "__main__":
    tf.test.main()
