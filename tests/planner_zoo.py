"""The planner's view of a zoo model (benchmarks/zoo): its train step imported into the
planner's IR, for the import-coverage checks (tests/planner/test_planner_import_coverage.py
on chosen models, tests/models/test_zoo.py on every model it builds anyway)."""

from tf_fusionstitch.planner import graph_import


def train_step_graph(model, batch=2):
    """The IR of zoo model `model`'s train step. Its tf.function declares a dynamic batch
    (and sequence); the import traces it again at a batch's static shapes."""
    data = model.make_batch(0, batch)
    graph = graph_import.from_function(model.train_step, tuple(data.inputs) + (data.labels,))[0]
    assert graph.batch_size == batch
    return graph
