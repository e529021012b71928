"""Fingerprints of the plans optimize() makes, to show a refactoring changed none.

  python benchmarks/plan_fingerprints.py --out=/tmp/before.json
  (change the code)
  python benchmarks/plan_fingerprints.py --out=/tmp/after.json --compare=/tmp/before.json

For every model (the reference models and some zoo models, tiny sizes), function
(inference, train step) and fusion strategy, it records the kernel counts before
and after and, per cluster, the TF ops it replaced, whether it fused, its kernel
key, parts and fallback reason, plus a hash of the C++ and CUDA source generated
from each kernel's spec. The rewrite cache is off, so the checked-out code plans.
Explore runs with costs='builtin': calibrated costs are timed on this machine
and differ from run to run. --compare prints every entry that differs and exits
1 when any does.
"""

import hashlib
import json
import os
import pathlib
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from benchmarks import models as reference_models  # noqa: E402
from benchmarks import zoo  # noqa: E402

import tf_fusionstitch as fs  # noqa: E402
from tf_fusionstitch import fusion_ir as ir  # noqa: E402
from tf_fusionstitch.codegen.generate import generate_cpp, generate_cuda  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("models", list(reference_models.MODELS) +
                  ["mobilenet_v2", "efficientnet_b0", "bert", "gpt2"],
                  "Reference models and zoo models to plan (tiny sizes).")
flags.DEFINE_list("functions", ["inference", "train_step"], "Functions of each model.")
flags.DEFINE_list("fusions", ["stitch", "xla_like", "explore"], "Fusion strategies.")
flags.DEFINE_string("out", None, "Where to write the fingerprints (JSON).")
flags.DEFINE_string("compare", None, "Fingerprints to compare with; exit 1 on a difference.")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _source_digests(spec: str) -> dict:
    """Hashes of the source each printer makes from `spec` (or the error it raises)."""
    out = {}
    for target, generate in (("cpp", generate_cpp), ("cuda", generate_cuda)):
        try:
            out[target] = _digest(generate(ir.Cluster.from_json(spec)).source)
        except Exception as e:  # noqa: BLE001  (an unsupported target is part of the print)
            out[target] = f"{type(e).__name__}: {e}"[:200]
    return out


def _model(name):
    if name in reference_models.MODELS:
        model = reference_models.build(name, "tiny", seed=0)
        return model, model.make_batch(0, reference_models.default_batch(name, "tiny"))
    model = zoo.build(name, "tiny", seed=0)
    return model, model.make_batch(0, 4)


def fingerprint(model, batch, function: str, fusion: str) -> dict:
    fn = getattr(model, function)
    args = batch.inputs if function == "inference" else (*batch.inputs, batch.labels)
    options = {"rewrite_cache": False}
    if fusion == "explore":
        options["costs"] = "builtin"
    fast = fs.optimize(fn, fusion=fusion, **options)
    report = fast.prepare(*args)
    specs = [n.attr["spec"].s.decode() for n in fast.graph_def.node
             if n.op == "FusionStitch"]
    return {
        "kernels": [report.kernels_before, report.kernels_after],
        "failure": report.failure,
        "clusters": sorted(json.dumps([c.fused, sorted(op for _, op in c.tf_ops),
                                       len(c.tf_ops), c.kernel_key, c.parts, c.split,
                                       c.reason.split(":")[0]])
                           for c in report.clusters),
        "sources": sorted(json.dumps(_source_digests(s), sort_keys=True) for s in specs),
    }


def main(argv):
    del argv
    results = {}
    for name in FLAGS.models:
        model, batch = _model(name)
        for function in FLAGS.functions:
            for fusion in FLAGS.fusions:
                key = f"{name}/{function}/{fusion}"
                results[key] = fingerprint(model, batch, function, fusion)
                print(key, results[key]["kernels"], flush=True)
    if FLAGS.out:
        pathlib.Path(FLAGS.out).write_text(json.dumps(results, indent=1, sort_keys=True))
    if FLAGS.compare:
        before = json.loads(pathlib.Path(FLAGS.compare).read_text())
        differ = [k for k in sorted(set(before) | set(results)) if before.get(k) != results.get(k)]
        for key in differ:
            print(f"DIFFERS {key}")
        print(f"{len(results) - len(differ)} of {len(results)} identical")
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    app.run(main)
