"""`bazel test //:op_library_test`: the op library Bazel built (//:fusion_stitch_op) loads
into the TensorFlow whose headers it was compiled against and registers the FusionStitch op."""

import os
import unittest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import op_def_registry  # noqa: E402


class OpLibraryTest(unittest.TestCase):

    def test_loads_and_registers_the_op(self):
        library = tf.load_op_library(os.path.abspath("fusion_stitch_op.so"))
        self.assertTrue(callable(library.fusion_stitch))
        op_def = op_def_registry.get("FusionStitch")
        self.assertIsNotNone(op_def)
        self.assertIn("kernel_key", [attr.name for attr in op_def.attr])


if __name__ == "__main__":
    unittest.main()
