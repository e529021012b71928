"""`python -m tf_fusionstitch.tools.plan`: reference models, SavedModels, errors."""

import io
import json
import os
import subprocess
import sys
import tempfile
from contextlib import redirect_stdout

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
import tensorflow as tf

from tf_fusionstitch import planner
from tf_fusionstitch.tools import plan as tool


def _run_in_process(*args):
    tool.FLAGS.unparse_flags()
    tool.FLAGS(["plan"] + list(args))
    out = io.StringIO()
    with redirect_stdout(out):
        tool.main(["plan"])
    return out.getvalue()


class PlanToolTest(tf.test.TestCase):

    def tearDown(self):
        tool.FLAGS.unparse_flags()
        super().tearDown()

    def test_reference_model_from_the_command_line(self):
        out = os.path.join(self.get_temp_dir(), "plan.json")
        result = subprocess.run(
            [sys.executable, "-m", "tf_fusionstitch.tools.plan", "--model=transformer_block",
             "--batch=8", "--seq=128", "--hidden=512", "--heads=8", "--ffn=2048",
             "--cluster=4xH200", "--strategy=operator", "--search=exhaustive", f"--out={out}"],
            capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        self.assertIn("Plan for 4xH200", result.stdout)
        self.assertIn("4-way tensor parallel", result.stdout)
        with open(out) as f:
            plan = planner.Plan.from_json(f.read())
        self.assertEqual(plan.variable_splits["wq:0"], 1)
        self.assertEqual(plan.variable_splits["w2:0"], 0)

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
        text = _run_in_process(f"--model={path}", "--batch=128", "--cluster=2xA100",
                               "--strategy=data", "--search=exhaustive", f"--out={out}")
        self.assertIn("2 replicas", text)
        with open(out) as f:
            data = json.load(f)
        self.assertEqual(sorted(data["variable_splits"]), ["w1:0", "w2:0"])
        self.assertEqual(data["replicas"], 2)

    def test_errors_are_usage_errors(self):
        with self.assertRaisesRegex(app.UsageError, "neither a reference model"):
            _run_in_process("--model=no_such_model")
        with self.assertRaisesRegex(app.UsageError, "takes no seq"):
            _run_in_process("--model=mlp", "--seq=4")
        with self.assertRaisesRegex(app.UsageError, "cannot parse cluster"):
            _run_in_process("--model=mlp", "--cluster=many")


if __name__ == "__main__":
    tf.test.main()
