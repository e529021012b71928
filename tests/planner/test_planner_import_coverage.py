"""Import coverage: the zoo's tiny train steps (keras_hub backbones and keras.applications
CNNs built from their constructors with random weights, benchmarks/zoo) import into the
planner's IR with an axis rule for every op that binds an axis, so no split is gathered for
want of a rule."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from benchmarks import zoo
from tf_fusionstitch.planner import graph_import, op_rules
from tf_fusionstitch.tools import plan as plan_tool


def zoo_graph(name, batch=2):
    """The IR of a tiny zoo model's train step. Its tf.function declares a dynamic batch
    and sequence; the import traces it again at the batch's static shapes."""
    model = zoo.build(name, "tiny")
    data = model.make_batch(0, batch)
    graph = graph_import.from_function(model.train_step, tuple(data.inputs) + (data.labels,))[0]
    assert graph.batch_size == batch
    return graph


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

    def test_report_names_the_fallbacks_with_counts(self):
        g = zoo_graph("gpt2")
        op = next(op for op in g.ops.values() if op.type == "Softmax")
        op.type = "UnknownToThePlanner"
        self.assertEqual(op_rules.conservative_ops(g), {"UnknownToThePlanner": 1})
        self.assertIn("1 ops on the conservative rule (inputs needed whole): "
                      "UnknownToThePlanner x1", plan_tool.coverage_report(g))


if __name__ == "__main__":
    tf.test.main()
