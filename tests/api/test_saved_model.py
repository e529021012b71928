"""SavedModel in, SavedModel out: a zoo model exported with Keras' `model.export`,
converted (SavedModelConverter and the convert tool), saved and loaded in a fresh
process; a tf.Module holding an optimized function saved directly; SavedModels
whose specs were edited refused at load, naming the node.

One fresh process checks every saved model (a TensorFlow start is seconds), with
no C++ compiler on its PATH where $CXX is unset (a serving host with a warm
cache); the tool's conversion runs beside the in-process one.
"""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

import tf_fusionstitch as fs
from tf_fusionstitch import kernels
from benchmarks import zoo  # the repository root (pyproject.toml's pytest pythonpath)

import repo_paths

BATCHES = (1, 3)
ZOO_MODEL = "mobilenet"   # tiny: alpha 0.25, 64x64 images; its batch norms fuse

# Run in a fresh process: tf_fusionstitch imported first (the op is registered
# once TensorFlow's import has run), then every SavedModel loaded.
_LOAD_AND_RUN = r"""
import json, sys
import numpy as np
import tf_fusionstitch
import tensorflow as tf
work = sys.argv[1]
out = {"outputs": {}, "refused": {}}
for name in ("converted", "converted_by_tool"):
    model = tf.saved_model.load(f"{work}/{name}")
    serve = model.signatures["serving_default"]
    # Keras names the input after a process-wide counter (keras_tensor, keras_tensor_3453)
    (input_name,) = serve.structured_input_signature[1]
    for batch in %(batches)r:
        x = np.load(f"{work}/x{batch}.npy")
        (y,) = serve(**{input_name: x}).values()
        out["outputs"][f"{name}/{batch}"] = y.numpy().tolist()
plain = tf.saved_model.load(f"{work}/plain_converted")
x = np.load(f"{work}/m2.npy")
out["plain"] = plain.signatures["serving_default"](x=x)["y"].numpy().tolist()
out["plain_project"] = plain.signatures["project"](
    x=x, m=np.ones((8, 4), np.float32))["output_0"].numpy().tolist()
out["plain_asset"] = open(plain.vocab.asset_path.numpy().decode()).read()
module = tf.saved_model.load(f"{work}/module")
out["module"] = [module.f(np.load(f"{work}/m{b}.npy")).numpy().tolist() for b in (2, 5)]
for name in ("edited_constant", "injected_name", "injected_constant"):
    try:
        tf.saved_model.load(f"{work}/{name}")
        out["refused"][name] = None
    except Exception as e:
        out["refused"][name] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
"""


class Scaled(tf.Module):
    """A tf.Module holding an optimized function (a softmax of a scaled input)."""

    def __init__(self):
        super().__init__()
        self.w = tf.Variable(np.linspace(0.5, 2.0, 8, dtype=np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def f(x):
            y = tf.nn.relu(x * self.w + 1.0)
            return tf.nn.softmax(y - tf.reduce_mean(y, axis=1, keepdims=True), axis=1)
        self.reference = f
        self.f = fs.optimize(f)


class Plain(tf.Module):
    """A tf.Module as tf.saved_model.save writes it: a variable, an asset, a
    signature that fuses and one that does not (a lone matmul)."""

    def __init__(self, vocab_path):
        super().__init__()
        self.w = tf.Variable(np.linspace(-1.0, 1.0, 8, dtype=np.float32))
        self.vocab = tf.saved_model.Asset(vocab_path)

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def normalize(x):
            y = tf.tanh(x * self.w)
            return {"y": tf.nn.softmax(y - tf.reduce_mean(y, axis=1, keepdims=True), axis=1)}

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32),
                                      tf.TensorSpec([8, 4], tf.float32)])
        def project(x, m):
            return tf.matmul(x, m)
        self.normalize, self.project = normalize, project

    def signatures(self):
        return {"serving_default": self.normalize.get_concrete_function(),
                "project": self.project.get_concrete_function()}


def fusion_nodes(saved_model_dir):
    """(function, node) of every FusionStitch node of a SavedModel, and its proto."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(saved_model_dir, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    nodes = [(fn, n) for fn in proto.meta_graphs[0].graph_def.library.function
             for n in fn.node_def if n.op == "FusionStitch"]
    return nodes, proto


def edited_copy(source, target, edit):
    """A copy of SavedModel `source` whose first FusionStitch node with a
    constant has its spec changed by `edit(spec dict) -> new key or None`
    (None: the key stays). Returns that node's name."""
    shutil.copytree(source, target)
    nodes, proto = fusion_nodes(target)
    for _, node in nodes:
        spec = json.loads(node.attr["spec"].s)
        if any(op["prim"] == "const" for op in spec["ops"]):
            recompute_key = edit(spec)
            text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
            node.attr["spec"].s = text.encode()
            if recompute_key:   # as an attacker would: the key is a checksum
                node.attr["kernel_key"].s = kernels.kernel_key(text).encode()
            with open(os.path.join(target, "saved_model.pb"), "wb") as f:
                f.write(proto.SerializeToString())
            return node.name
    raise AssertionError("no FusionStitch node with a constant")


def first_const(spec):
    return next(op for op in spec["ops"] if op["prim"] == "const")


def edit_constant(spec):
    first_const(spec)["attrs"]["value"] = 0.25
    return False


def inject_name(spec):
    spec["ops"][0]["name"] = 'x; system("id"); float y'
    return True


def inject_constant(spec):
    first_const(spec)["attrs"]["value"] = '1.0f; system("id"); //'
    return True


@pytest.fixture(scope="module")
def round_trip(tmp_path_factory):
    work = tmp_path_factory.mktemp("saved_model")
    model = zoo.build(ZOO_MODEL, "tiny", seed=0)
    model.backbone.export(str(work / "exported"), verbose=False)
    tool = subprocess.Popen(
        [sys.executable, "-m", "tf_fusionstitch.tools.convert",
         f"--input_saved_model_dir={work / 'exported'}",
         f"--output_saved_model_dir={work / 'converted_by_tool'}"],
        cwd=repo_paths.REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        rng = np.random.default_rng(0)
        side = model.input_specs[0].shape[1:]
        inputs = {b: rng.random((b, *side), dtype=np.float32) for b in BATCHES}
        for b, x in inputs.items():
            np.save(work / f"x{b}.npy", x)
        converter = fs.SavedModelConverter(str(work / "exported"))
        converter.convert()
        converter.build(lambda: [inputs[b] for b in BATCHES])
        converter.save(str(work / "converted"))

        module = Scaled()
        module_inputs = [rng.standard_normal((b, 8)).astype(np.float32) for b in (2, 5)]
        for b, x in zip((2, 5), module_inputs):
            np.save(work / f"m{b}.npy", x)
        module.f(module_inputs[0])
        tf.saved_model.save(module, str(work / "module"))

        (work / "vocab.txt").write_text("alpha\nbeta\n")
        plain = Plain(str(work / "vocab.txt"))
        tf.saved_model.save(plain, str(work / "plain"), signatures=plain.signatures())
        plain_converter = fs.SavedModelConverter(str(work / "plain"))
        plain_converter.convert()
        plain_converter.save(str(work / "plain_converted"))

        # The zoo model's spec edited; code injected into the small module's.
        edited = {name: edited_copy(work / source, work / name, edit)
                  for name, source, edit in (("edited_constant", "converted", edit_constant),
                                             ("injected_name", "module", inject_name),
                                             ("injected_constant", "module", inject_constant))}
        tool_output, _ = tool.communicate(timeout=300)
    finally:
        tool.kill()
    assert tool.returncode == 0, tool_output
    env = dict(os.environ)
    if not env.get("CXX"):
        # A serving host without a compiler: the warm cache (this session's,
        # filled by the default compiler) serves the op library and every kernel.
        env["PATH"] = str(work / "no_compiler_here")
    loaded = subprocess.run([sys.executable, "-c", _LOAD_AND_RUN % {"batches": BATCHES},
                             str(work)], cwd=repo_paths.REPO, capture_output=True, text=True,
                            timeout=300, env=env)
    results = [line for line in loaded.stdout.splitlines() if line.startswith("RESULT ")]
    assert loaded.returncode == 0 and results, loaded.stdout + loaded.stderr
    return dict(
        work=work, converter=converter, tool_output=tool_output, edited=edited,
        plain_summary=plain_converter.summary(),
        plain_expected=plain.normalize(module_inputs[0])["y"].numpy(),
        expected={b: model.inference(x).numpy() for b, x in inputs.items()},
        module_expected=[module.reference(x).numpy() for x in module_inputs],
        fresh=json.loads(results[-1][len("RESULT "):]))


def test_the_converted_model_gives_the_same_outputs_in_a_fresh_process(round_trip):
    for name in ("converted", "converted_by_tool"):
        for b in BATCHES:
            got = np.array(round_trip["fresh"]["outputs"][f"{name}/{b}"], np.float32)
            np.testing.assert_allclose(got, round_trip["expected"][b], rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name} at batch {b}")


def test_every_signature_is_converted_and_holds_fusion_stitch_nodes(round_trip):
    summary = round_trip["converter"].summary()
    for key in ("serve", "serving_default"):
        assert f"{key}: converted" in summary, summary
    # The input's name is Keras' (keras_tensor, or keras_tensor_N after other models).
    ((input_name, spec),) = tf.saved_model.load(str(round_trip["work"] / "converted")) \
        .signatures["serving_default"].structured_input_signature[1].items()
    assert f"{input_name}[1, 64, 64, 3], {input_name}[3, 64, 64, 3]" in summary, summary
    for name in ("converted", "converted_by_tool"):
        nodes, _ = fusion_nodes(round_trip["work"] / name)
        assert len({n.attr["kernel_key"].s for _, n in nodes}) >= 10, name
    assert "serving_default: converted" in round_trip["tool_output"]
    # the batch dimension stays dynamic
    assert spec.shape.as_list() == [None, 64, 64, 3]


def test_a_module_with_an_optimized_function_saves_directly(round_trip):
    nodes, _ = fusion_nodes(round_trip["work"] / "module")
    assert nodes
    for got, want in zip(round_trip["fresh"]["module"], round_trip["module_expected"]):
        np.testing.assert_allclose(np.array(got, np.float32), want, rtol=1e-5, atol=1e-6)


def test_a_module_s_saved_model_converts_keeping_variables_assets_and_unfused_signatures(
        round_trip):
    summary = round_trip["plain_summary"]
    assert "serving_default: converted" in summary, summary
    assert "project: kept as it was: nothing in it fuses" in summary, summary
    fresh = round_trip["fresh"]
    np.testing.assert_allclose(np.array(fresh["plain"], np.float32),
                               round_trip["plain_expected"], rtol=1e-5, atol=1e-6)
    x = np.load(round_trip["work"] / "m2.npy")
    np.testing.assert_allclose(np.array(fresh["plain_project"], np.float32),
                               x @ np.ones((8, 4), np.float32), rtol=1e-5, atol=1e-5)
    assert fresh["plain_asset"] == "alpha\nbeta\n"


def test_an_edited_spec_is_refused_at_load_naming_the_node(round_trip):
    refused = round_trip["fresh"]["refused"]
    for name, node in round_trip["edited"].items():
        message = refused[name]
        assert message is not None, f"{name} loaded"
        assert node in message and "is refused" in message, message
    assert "kernel_key" in refused["edited_constant"] and \
        "is not the hash of the spec" in refused["edited_constant"]
    assert "is not an identifier" in refused["injected_name"]
    assert "constant value must be a number" in refused["injected_constant"]


def test_the_converter_says_what_it_needs():
    with pytest.raises(ValueError, match="is not one of"):
        fs.SavedModelConverter("unused", fusion="fastest")
    converter = fs.SavedModelConverter("unused")
    with pytest.raises(RuntimeError, match=r"call convert\(\) before save\(\)"):
        converter.save("unused_out")
