"""The package's structure: no import cycles, no private name of one module
used by another, and the TF-free core importable with TensorFlow absent."""

import subprocess
import sys

import import_graph

# Modules that may import TensorFlow (and Keras) when imported; every other
# module of the package is TF-free core and must import without it.
TF_FACING = {
    "tf_fusionstitch.api", "tf_fusionstitch.trace_rewrite", "tf_fusionstitch.call_arguments",
    "tf_fusionstitch.call_config",
    "tf_fusionstitch.graph_check", "tf_fusionstitch.custom_ops.loader", "tf_fusionstitch.keras",
    "tf_fusionstitch.saved_model_converter",
    "tf_fusionstitch.tools.demo", "tf_fusionstitch.tensorboard_graph",
    "tf_fusionstitch.planner.graph_import", "tf_fusionstitch.planner.reference_models",
    "tf_fusionstitch.planner.tf_functions", "tf_fusionstitch.planner.static_conds",
    "tf_fusionstitch.planner.more_models", "tf_fusionstitch.planner.model_blocks",
    "tf_fusionstitch.planner.parallel", "tf_fusionstitch.planner.local_workers",
    "tf_fusionstitch.planner.cpu_calibration", "tf_fusionstitch.planner.dtensor_client_main",
    "tf_fusionstitch.planner.timing", "tf_fusionstitch.planner.loopback_calibration",
    # the fuzzer: all but its vocabulary (ops) and shape inference (case_types)
    *(f"tf_fusionstitch.tools.fuzzing.{m}" for m in (
        "np_dtypes", "inputs", "tf_graph", "generator", "intervals", "op_errors",
        "grappler_model", "oracle", "checking", "runner", "shrinking", "regressions",
        "reproducer", "session")),
}
# The rewriters work on GraphDefs and TF's shape functions: TF-facing, except these.
TF_FREE_REWRITERS = {"cpu_cost_model", "cycles", "graph_view", "kernel_count", "op_table",
                     "pattern_key", "recurrences", "trampoline"}
# The core the issue names: always TF-free, whatever the lists above say.
CORE = ("tf_fusionstitch.fusion_ir", "tf_fusionstitch.schedule", "tf_fusionstitch.codegen",
        "tf_fusionstitch.runtime", "tf_fusionstitch.gpu", "tf_fusionstitch.options",
        "tf_fusionstitch.planner.cost_model", "tf_fusionstitch.planner.ir",
        "tf_fusionstitch.planner.search_common")

_BLOCKED_IMPORT = """
import importlib, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "tf_keras"):
            raise ImportError(f"TensorFlow is absent in this test (import of {name})")
sys.meta_path.insert(0, Block())
failed = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except ImportError as e:
        failed.append(f"{name}: {e}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def tf_free_modules():
    out = []
    for name in import_graph.modules():
        if name in TF_FACING:
            continue
        if name.startswith("tf_fusionstitch.rewriters.") and \
                name.rpartition(".")[2] not in TF_FREE_REWRITERS:
            continue
        out.append(name)
    return out


def test_no_import_cycles():
    graph = import_graph.imports(import_graph.modules())
    assert import_graph.cycles(graph) == []


def test_the_cycle_check_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_graph.cycles(graph) == [["a", "b", "c"]]


def test_no_private_name_crosses_modules():
    assert import_graph.private_uses(import_graph.modules()) == []


def test_the_private_name_check_finds_one(tmp_path, monkeypatch):
    monkeypatch.setattr(import_graph, "ROOT", tmp_path)
    (tmp_path / "a.py").write_text("_hidden = 1\nprint(_hidden)\n")
    (tmp_path / "b.py").write_text("from pkg import a\nfrom pkg.a import _hidden\n"
                                   "print(a._hidden, a.__name__)\n")
    known = {"pkg.a": tmp_path / "a.py", "pkg.b": tmp_path / "b.py"}
    assert import_graph.private_uses(known) == ["b.py:2 pkg.a._hidden", "b.py:3 pkg.a._hidden"]


def test_the_core_imports_without_tensorflow():
    names = tf_free_modules()
    for core in CORE:
        assert any(n == core or n.startswith(core + ".") for n in names), core
    # command-line tools define their absl flags on import: one process each
    tools = [n for n in names if n.startswith("tf_fusionstitch.tools.")]
    batches = [[n for n in names if n not in tools]] + [[t] for t in tools]
    for batch in batches:
        result = subprocess.run([sys.executable, "-c", _BLOCKED_IMPORT, *batch],
                                capture_output=True, text=True, cwd=import_graph.ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
