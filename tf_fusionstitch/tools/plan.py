"""Search a distributed execution plan for a reference model or a SavedModel.

  python -m tf_fusionstitch.tools.plan --model=bert_large --cluster=8xV100 --strategy=data
  python -m tf_fusionstitch.tools.plan --model=transformer_block --cluster=8xH200 \\
      --strategy=operator --search=exhaustive --out=plan.json
  python -m tf_fusionstitch.tools.plan --model=/path/to/saved_model --function=train_step \\
      --batch=64 --cluster=4xA100 --strategy=pipeline --search=dp

Reference models (--model=mlp, transformer_block, bert, bert_base, bert_large) are training
steps (forward, backward, Adam) built from sizes in graph mode, so no weights are allocated.
Prints the plan and writes its JSON to --out.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "transformer_block",
                    "A reference model (mlp, transformer_block, bert, bert_base, bert_large) or "
                    "the path of a SavedModel.")
flags.DEFINE_string("cluster", "8xH200", "A preset (8xV100, 8xA100, 8xH200, 4x8xH200, "
                    "cpu-localhost), 'NxDEVICE', 'MxNxDEVICE' or a JSON object.")
flags.DEFINE_enum("strategy", "auto", ["auto", "data", "operator", "pipeline"],
                  "Which parallelism to search: one kind over all devices, or every product.")
flags.DEFINE_enum("search", "greedy", ["exhaustive", "dp", "greedy", "random"],
                  "Search method.")
flags.DEFINE_integer("budget", None, "Cost-model calls the search may use (default per "
                     "method).")
flags.DEFINE_integer("seed", 0, "Seed of the random search.")
flags.DEFINE_enum("schedule", "1f1b", ["1f1b", "gpipe"], "Pipeline schedule.")
flags.DEFINE_string("out", None, "Write the plan's JSON here.")
flags.DEFINE_integer("batch", None, "Global batch size (reference models; for a SavedModel, "
                     "the extent given to unknown dimensions).")
flags.DEFINE_integer("seq", None, "Sequence length (transformer and BERT models).")
flags.DEFINE_integer("hidden", None, "Hidden size (transformer and BERT models).")
flags.DEFINE_integer("heads", None, "Attention heads (transformer and BERT models).")
flags.DEFINE_integer("ffn", None, "Feed-forward size (transformer and BERT models).")
flags.DEFINE_integer("layers", None, "Layers (transformer and BERT models).")
flags.DEFINE_string("function", None, "SavedModel: the attribute holding the tf.function to "
                    "plan (e.g. train_step); default: the first signature.")


def _load_graph():
    from tf_fusionstitch.planner import reference_models
    if FLAGS.model in reference_models.MODELS:
        sizes = {k: getattr(FLAGS, k) for k in ("batch", "seq", "hidden", "heads", "ffn",
                                                "layers")}
        known = reference_models.DEFAULT_SIZES[FLAGS.model]
        unused = [k for k, v in sizes.items() if v is not None and k not in known]
        if unused:
            raise app.UsageError(f"--model={FLAGS.model} takes no {', '.join(unused)}")
        sizes = {k: v for k, v in sizes.items() if k in known}
        return reference_models.build_graph_ir(FLAGS.model, **sizes)
    if not os.path.isdir(FLAGS.model):
        raise app.UsageError(f"--model={FLAGS.model!r} is neither a reference model "
                             f"({', '.join(reference_models.MODELS)}) nor a SavedModel "
                             "directory")
    from tf_fusionstitch.planner import graph_import
    return graph_import.from_saved_model(FLAGS.model, FLAGS.function, FLAGS.batch)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from tf_fusionstitch import planner
    try:
        cluster = planner.get_cluster(FLAGS.cluster)
        graph = _load_graph()
        print(graph.summary())
        plan = planner.search_graph(graph, cluster, FLAGS.strategy, FLAGS.search,
                                    FLAGS.budget, FLAGS.seed, FLAGS.schedule)
    except ValueError as e:
        raise app.UsageError(str(e)) from None
    print(plan)
    if FLAGS.out:
        with open(FLAGS.out, "w") as f:
            f.write(plan.to_json())
        print(f"wrote {FLAGS.out}")


if __name__ == "__main__":
    app.run(main)
