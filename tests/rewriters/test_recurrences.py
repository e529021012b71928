"""rewriters/recurrences.py: which ops of a loop body lie on a recurrence
(a cycle through loop variables), and which recurrence."""

import tensorflow as tf

from tf_fusionstitch.rewriters.graph_view import GraphView
from tf_fusionstitch.rewriters.recurrences import recurrence_ids


def _body(build):
    """The GraphView of the graph `build` makes from named placeholders."""
    graph = tf.Graph()
    with graph.as_default():
        build()
    return GraphView(graph.as_graph_def(), {})


def _placeholder(name, dtype=tf.float32, shape=(4, 8)):
    return tf.compat.v1.placeholder(dtype, shape, name=name)


class RecurrenceIdsTest(tf.test.TestCase):

    def test_masked_cell_state_output_and_counter_are_three_recurrences(self):
        """h_next = select(m, cell(h, x), h) is h's recurrence; y_next =
        select(m, cell, y) is y's (y feeds only itself); the counter is its
        own; the input's projection lies on none."""
        def build():
            h, y, x = _placeholder("h"), _placeholder("y"), _placeholder("x")
            m = _placeholder("m", tf.bool)
            i = _placeholder("i", tf.int32, ())
            projected = tf.tanh(x, name="projected")
            cell = tf.sigmoid(tf.add(h, projected, name="mix"), name="cell")
            tf.where(m, cell, h, name="h_next")
            tf.where(m, cell, y, name="y_next")
            tf.add(i, 1, name="i_next")

        view = _body(build)
        ids = recurrence_ids(view, [("i", ("i_next", 0)), ("h", ("h_next", 0)),
                                    ("y", ("y_next", 0))])
        self.assertEqual(ids["mix"], ids["cell"])
        self.assertEqual(ids["cell"], ids["h_next"])
        self.assertLen({ids["i_next"], ids["h_next"], ids["y_next"]}, 3)
        self.assertNotIn("projected", ids)
        self.assertNotIn("x", ids)

    def test_variables_that_feed_each_other_are_one_recurrence(self):
        """An LSTM-like pair: c_next reads h, h_next reads c_next."""
        def build():
            h, c, x = _placeholder("h"), _placeholder("c"), _placeholder("x")
            c_next = tf.add(c, tf.sigmoid(h + x, name="gate"), name="c_next")
            tf.multiply(tf.tanh(c_next, name="squash"), 0.5, name="h_next")

        view = _body(build)
        ids = recurrence_ids(view, [("h", ("h_next", 0)), ("c", ("c_next", 0))])
        self.assertLen({ids[n] for n in ("gate", "c_next", "squash", "h_next")}, 1)

    def test_a_variable_that_only_feeds_another_is_no_recurrence(self):
        """a_next = a's argument through nothing but b: b feeds a, a feeds
        nothing it comes back from, so a's update lies on no cycle."""
        def build():
            a, b = _placeholder("a"), _placeholder("b")
            tf.exp(b, name="a_next")           # a's next value reads b only
            tf.negative(b, name="b_next")      # b feeds itself
            tf.identity(a, name="unused")

        view = _body(build)
        ids = recurrence_ids(view, [("a", ("a_next", 0)), ("b", ("b_next", 0))])
        self.assertIn("b_next", ids)
        self.assertNotIn("a_next", ids)

    def test_outside_a_loop_nothing_is_on_a_recurrence(self):
        view = _body(lambda: tf.exp(_placeholder("x"), name="y"))
        self.assertEqual(recurrence_ids(view, []), {})
        # a loop variable whose nodes are gone (another pass removed them)
        self.assertEqual(recurrence_ids(view, [("gone", ("y", 0))]), {})


if __name__ == "__main__":
    tf.test.main()
