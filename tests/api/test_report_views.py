"""An optimized function's report as pictures: save_html's page and
write_tensorboard's graph, checked by parsing what they wrote."""

import pathlib
import tempfile
import warnings

import tensorflow as tf

import tf_fusionstitch as fs
from html_testlib import Page


class ReportViewsTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        w = tf.Variable(tf.random.stateless_normal([16, 16], seed=(1, 2)))

        @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32)])
        def step(x):
            with tf.name_scope("norm"):
                h = tf.nn.relu(tf.matmul(x, w) * 2.0 + 1.0)
                m = tf.reduce_mean(h, -1, keepdims=True)
                h = (h - m) * tf.math.rsqrt(tf.reduce_mean(tf.square(h - m), -1,
                                                           keepdims=True) + 1e-5)
            with tf.name_scope("head"):
                return tf.nn.softmax(tf.matmul(h, w)) * 3.0 + tf.exp(x) * x

        cls.fast = fs.optimize(step)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cls.fast(tf.random.stateless_normal([4, 16], seed=(3, 4)))
        cls.report = cls.fast.report()
        cls.tmp = pathlib.Path(tempfile.mkdtemp(prefix="fs-report-views-"))

    def test_the_report_has_kernels_and_the_graph(self):
        self.assertLen(self.report.fused_clusters, 2, str(self.report))
        names = {name for name, _ in self.report.graph.nodes}
        for c in self.report.fused_clusters:
            self.assertIn(c.name, names)
            self.assertGreater(c.bytes_out[1], 0)   # the batch is dynamic
        summary = str(self.report).splitlines()
        self.assertLen([l for l in summary if l.startswith("  [fused]")], 2)
        self.assertTrue(summary[-2].startswith("  total: 2 kernels of "
                                               f"{sum(len(c.tf_ops) for c in self.report.fused_clusters)} ops"))

    def test_save_html_writes_a_self_contained_page_with_every_kernel_and_op(self):
        path = self.tmp / "report.html"
        self.report.save_html(path)
        page = Page(path)
        self.assertEqual(page.fetches(), [])     # self-contained: nothing to load
        rows = [int(attrs["data-kernel"]) for tag, attrs in page.tags if "data-kernel" in attrs]
        self.assertEqual(rows, list(range(len(self.report.fused_clusters))))
        data = page.data
        self.assertEqual([u[:2] for u in data["units"]],
                         [list(n) for n in self.report.graph.nodes])
        self.assertEqual(data["edges"], [list(e) for e in self.report.graph.edges])
        for k, c in enumerate(self.report.fused_clusters):
            self.assertEqual(data["kernels"][k]["ops"], [list(o) for o in c.tf_ops])
            (unit,) = [u for u in data["units"] if u[0] == c.name]
            self.assertEqual(unit[2], k)
        self.assertIn("cytoscape", path.read_text(encoding="utf-8")[:2_000_000])

    def test_write_tensorboard_writes_the_graph_with_kernels_as_name_scopes(self):
        files = self.fast.write_tensorboard(self.tmp / "tb")
        self.assertLen(files, 1)
        graphs = []
        for event in tf.compat.v1.train.summary_iterator(str(files[0])):
            if event.graph_def:
                graph = tf.compat.v1.GraphDef()
                graph.ParseFromString(event.graph_def)
                graphs.append(graph)
        (graph,) = graphs
        nodes = {n.name: n for n in graph.node}
        for k, c in enumerate(self.report.fused_clusters):
            (kernel,) = [n for n in nodes if n.endswith(f"fused_kernel_{k}/FusionStitch")]
            self.assertEqual(nodes[kernel].op, "FusionStitch")
            scope = kernel.rpartition("/")[0]
            inside = sorted(nodes[n].op for n in nodes if n.startswith(scope + "/")
                            and n != kernel)
            self.assertEqual(inside, sorted(op for _, op in c.tf_ops))
        for node in graph.node:                 # every edge names a node of the graph
            for name in node.input:
                self.assertIn(name.lstrip("^").split(":")[0], nodes)


if __name__ == "__main__":
    tf.test.main()
