"""Import coverage: the zoo's tiny train steps (keras_hub backbones and keras.applications
CNNs built from their constructors with random weights, benchmarks/zoo) import into the
planner's IR with an axis rule for every op that binds an axis, so no split is gathered for
want of a rule. Here the models that exercise each of the importer's features; every zoo
model is checked by tests/models/test_zoo.py, which builds them anyway."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from benchmarks import zoo
from tf_fusionstitch.planner import op_rules
from tf_fusionstitch.tools import plan as plan_tool
import planner_zoo


def zoo_graph(name, batch=2):
    """The IR of tiny zoo model `name`'s train step."""
    return planner_zoo.train_step_graph(zoo.build(name, "tiny"), batch)


class ImportCoverageTest(tf.test.TestCase):

    def _check(self, name):
        graph = zoo_graph(name)
        fallen = op_rules.conservative_ops(graph)
        self.assertEqual(fallen, {}, name)
        self.assertIn("every op that binds an axis has an axis rule",
                      plan_tool.coverage_report(graph))

    def test_bert(self):        # Adam, dropout (stateless random masks), segment embeddings
        self._check("bert")

    def test_gpt2(self):        # AdamW, causal mask
        self._check("gpt2")

    def test_llama(self):       # rotary embeddings (Pack/Split), grouped-query attention
        self._check("llama")

    def test_deberta_v3(self):  # relative-position gathers with batch dims, their gradients
        self._check("deberta_v3")

    def test_mobilenet(self):   # keras.applications: depthwise convolutions, SGD momentum
        self._check("mobilenet")

    def test_convnext_tiny(self):   # grouped convolutions Keras compiles as called functions
        self._check("convnext_tiny")

    # Adagrad, RMSprop and Adafactor divide an embedding's sparse gradient under a cond whose
    # row count depends on data (planner/static_conds.py).
    def test_albert(self):
        self._check("albert")

    def test_distilbert(self):
        self._check("distilbert")

    def test_qwen2(self):
        self._check("qwen2")

    def test_report_names_the_fallbacks_with_counts(self):
        g = zoo_graph("gpt2")
        op = next(op for op in g.ops.values() if op.type == "Softmax")
        op.type = "UnknownToThePlanner"
        self.assertEqual(op_rules.conservative_ops(g), {"UnknownToThePlanner": 1})
        self.assertIn("1 ops on the conservative rule (inputs needed whole): "
                      "UnknownToThePlanner x1", plan_tool.coverage_report(g))


if __name__ == "__main__":
    tf.test.main()
