"""`python -m tf_fusionstitch.tools.plan`: reference models, SavedModels, errors."""

import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.tools import plan as tool


class PlanToolTest(tf.test.TestCase):

    def test_reference_model_from_the_command_line(self):
        out = os.path.join(self.get_temp_dir(), "plan.json")
        result = subprocess.run(
            [sys.executable, "-m", "tf_fusionstitch.tools.plan", "--model=transformer_block",
             "--batch=8", "--seq=128", "--hidden=512", "--heads=8", "--ffn=2048",
             "--cluster=4xH200", "--strategy=operator", "--search=exhaustive", f"--out={out}",
             "--coverage"],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertIn("Plan for 4xH200", result.stdout)
        self.assertIn("4-way tensor parallel", result.stdout)
        self.assertIn("import coverage: every op that binds an axis has an axis rule",
                      result.stdout)
        with open(out) as f:
            plan = planner.Plan.from_json(f.read())
        self.assertEqual(plan.variable_splits["wq:0"], 1)
        self.assertEqual(plan.variable_splits["w2:0"], 0)

    def test_execute_on_logical_cpus(self):
        result = subprocess.run(
            [sys.executable, "-m", "tf_fusionstitch.tools.plan", "--model=transformer_block",
             "--batch=4", "--seq=8", "--hidden=16", "--heads=2", "--ffn=32",
             "--cluster=4xCPU", "--strategy=data", "--execute", "--steps=2"],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertIn("4 replicas", result.stdout)
        self.assertRegex(result.stdout, r"predicted step time [0-9.]+ ms, measured [0-9.]+ ms "
                                        r"\(mean of 2 steps on 4xCPU\)")
        with self.assertRaisesRegex(ValueError, "cannot run on cluster '8xH200'"):
            tool.run("mlp", cluster="8xH200", run_steps=2)

    def test_workers_are_checked_before_anything_starts(self):
        with self.assertRaisesRegex(ValueError, "give --execute too"):
            tool.run("mlp", cluster="2xCPU", workers=2)
        with self.assertRaisesRegex(ValueError, "give one of the two"):
            tool.run("mlp", cluster="2xCPU", run_steps=2, workers=2, measured_spec=True)
        with self.assertRaisesRegex(ValueError, "divide the cluster's 3 devices"):
            tool.run("mlp", cluster="3xCPU", run_steps=2, workers=2)

    def test_measured_spec_of_logical_cpus(self):
        result = subprocess.run(
            [sys.executable, "-m", "tf_fusionstitch.tools.plan", "--model=transformer_block",
             "--batch=4", "--seq=8", "--hidden=16", "--heads=2", "--ffn=32",
             "--cluster=2xCPU", "--strategy=data", "--measured_spec"],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertIn("Plan for 2xCPU-measured (2 devices)", result.stdout)
        with self.assertRaisesRegex(ValueError, "give an NxCPU cluster, not '8xH200'"):
            tool.run("mlp", cluster="8xH200", measured_spec=True)

    def test_saved_model(self):
        class Mlp(tf.Module):
            def __init__(self):
                super().__init__()
                self.w1 = tf.Variable(tf.random.normal([64, 256]), name="w1")
                self.w2 = tf.Variable(tf.random.normal([256, 8]), name="w2")

            @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32)])
            def __call__(self, x):
                return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)

        path = tempfile.mkdtemp(dir=self.get_temp_dir())
        tf.saved_model.save(Mlp(), path)
        out = os.path.join(self.get_temp_dir(), "saved.json")
        text, _ = tool.run(path, batch=128, cluster="2xA100", strategy="data",
                           search="exhaustive", out=out)
        self.assertIn("2 replicas", text)
        with open(out) as f:
            data = json.load(f)
        self.assertEqual(sorted(data["variable_splits"]), ["w1:0", "w2:0"])
        self.assertEqual(data["replicas"], 2)

    def test_errors(self):
        with self.assertRaisesRegex(ValueError, "neither a reference model"):
            tool.run("no_such_model")
        with self.assertRaisesRegex(ValueError, "takes no seq"):
            tool.run("mlp", seq=4)
        with self.assertRaisesRegex(ValueError, "cannot parse cluster"):
            tool.run("mlp", cluster="many")
        with self.assertRaisesRegex(ValueError, "unknown size"):
            tool.run("mlp", width=3)
        result = subprocess.run([sys.executable, "-m", "tf_fusionstitch.tools.plan",
                                 "--model=mlp", "--strategy=sideways"],
                                capture_output=True, text=True, timeout=300)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("strategy", result.stderr)


if __name__ == "__main__":
    tf.test.main()
