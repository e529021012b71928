"""The rewrite cache (tf_fusionstitch/rewrite_cache.py): a second rewrite of
the same traced graph comes from disk, gives the same graph and the same
results; a damaged entry, a kernel that cannot be rebuilt, other options or
other variable shapes mean a full rewrite, with correct results.

Each test uses its own cache directory, so entries and kernels of other tests
never answer for it.
"""

import base64
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import textwrap
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import tf_fusionstitch as fs
from conftest import SESSION_CACHE_DIR
from optimize_testlib import assert_same, fusion_stitch_nodes, quiet_call, random, rng
from tf_fusionstitch import rewrite_cache
from tf_fusionstitch.report import ClusterReport, Report
from tf_fusionstitch.runtime import cache, cpu_compiler
import repo_paths

REPO = repo_paths.REPO


def _layer(x, g):
    # softmax with a scale, a residual and a layernorm: a few clusters
    y = tf.nn.softmax(x * g, axis=-1) * 3.0 - 1.0
    z = y + x
    mean = tf.reduce_mean(z, axis=-1, keepdims=True)
    var = tf.reduce_mean(tf.square(z - mean), axis=-1, keepdims=True)
    return (z - mean) * tf.math.rsqrt(var + 1e-5), tf.tanh(x) * 0.5


def _entries(directory):
    return sorted(p for p in os.listdir(directory) if p.endswith(rewrite_cache.SUFFIX))


def _same_graph(case, a, b):
    case.assertEqual(a.SerializeToString(deterministic=True),
                     b.SerializeToString(deterministic=True))


class RewriteCacheTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # The op library is built (or found) in the session cache, once per
        # process; our private directories then hold only kernels and rewrites.
        from tf_fusionstitch.custom_ops import loader
        loader.load()

    def setUp(self):
        super().setUp()
        self.cache = tempfile.mkdtemp(prefix="fs-rewrite-cache-")
        os.chmod(self.cache, 0o700)
        self.addCleanup(shutil.rmtree, self.cache, ignore_errors=True)
        patcher = mock.patch.dict(os.environ, {cache.ENV_CACHE_DIR: self.cache})
        patcher.start()
        self.addCleanup(patcher.stop)
        gen = rng(9500)
        self.x, self.g = random(gen, (4, 37), "float32"), random(gen, (37,), "float32")

    def _run(self, fn=_layer, args=None, **options):
        f = tf.function(fn)
        opt = fs.optimize(f, **options)
        args = args or (self.x, self.g)
        actual, expected = quiet_call(opt, *args), f(*args)
        for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
            assert_same(self, a, e, rtol=1e-5, atol=1e-5)
        return opt, actual

    def test_hit_gives_the_same_graph_and_results(self):
        cold, cold_out = self._run()
        self.assertFalse(cold.report().cache_hit)
        self.assertNotEmpty(cold.report().fused_clusters)
        self.assertLen(_entries(self.cache), 1)
        self.assertNotIn("rewrite cache hit", str(cold.report()))

        warm, warm_out = self._run()
        report = warm.report()
        self.assertTrue(report.cache_hit, str(report))
        self.assertIn("rewrite cache hit", str(report))
        self.assertEqual(report.compilations, 0)
        self.assertGreater(report.rewrite_seconds, 0.0)
        _same_graph(self, warm.graph_def, cold.graph_def)
        self.assertEqual([(c.name, c.tf_ops, c.kernel_key) for c in report.clusters],
                         [(c.name, c.tf_ops, c.kernel_key) for c in cold.report().clusters])
        self.assertEqual((report.kernels_before, report.kernels_after),
                         (cold.report().kernels_before, cold.report().kernels_after))
        for a, b in zip(warm_out, cold_out):
            self.assertAllEqual(a, b)  # the very same kernels
        # and on other random inputs
        gen = rng(9501)
        x, g = random(gen, (4, 37), "float32"), random(gen, (37,), "float32")
        for a, b, e in zip(warm(x, g), cold(x, g), _layer(x, g)):
            self.assertAllEqual(a, b)
            assert_same(self, a, e, rtol=1e-5, atol=1e-5)

    def test_hit_in_a_new_process(self):
        script = textwrap.dedent("""
            import json, sys, numpy as np, tensorflow as tf
            import tf_fusionstitch as fs
            @tf.function
            def f(x):
                # a loop body with fusible ops: the rewrite renames that
                # function, and the new process must learn the new name
                _, y = tf.while_loop(lambda i, a: i < 3,
                                     lambda i, a: (i + 1, tf.tanh(a * 1.1) + 0.1),
                                     [tf.constant(0), x])
                return tf.nn.softmax(y * 2.0, axis=-1) + tf.exp(x) * 0.5
            x = tf.constant(np.random.default_rng(7).normal(size=(3, 29)).astype(np.float32))
            opt = fs.optimize(f)
            out = opt(x)
            np.testing.assert_allclose(out.numpy(), f(x).numpy(), rtol=1e-5, atol=1e-6)
            r = opt.report()
            in_bodies = sum(n.op == "FusionStitch" for fn in opt.graph_def.library.function
                            for n in fn.node_def)
            print("RESULT", json.dumps([r.cache_hit, len(r.fused_clusters), r.compilations,
                                        out.numpy().tobytes().hex(), in_bodies]))
        """)
        # The op library the session built, so the new processes do not build it again.
        from tf_fusionstitch.custom_ops import loader
        with mock.patch.dict(os.environ, {cache.ENV_CACHE_DIR: SESSION_CACHE_DIR}):
            library = loader.library_path()
        for path in (library, pathlib.Path(str(library) + ".sha256")):
            shutil.copy(path, self.cache)
        env = {**os.environ, cache.ENV_CACHE_DIR: self.cache}
        results = []
        for _ in range(2):
            proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=str(REPO),
                                  capture_output=True, text=True, timeout=300)
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1]
            results.append(json.loads(line[len("RESULT "):]))
        (hit0, fused0, _, out0, bodies0), (hit1, fused1, compiled1, out1, bodies1) = results
        self.assertFalse(hit0)
        self.assertTrue(hit1)
        self.assertEqual(compiled1, 0)
        self.assertEqual(fused0, fused1)
        self.assertGreater(fused0, 0)
        self.assertEqual(out0, out1)
        self.assertGreater(bodies0, 0)
        self.assertEqual(bodies0, bodies1)

    def _cold_then_hit(self, step):
        """Two new tf.functions of `step`: the first rewrites, the second hits
        the cache, compiles nothing and gives the first's results."""
        cold, cold_out = self._run(step)
        self.assertFalse(cold.report().cache_hit)
        warm, warm_out = self._run(step)
        self.assertTrue(warm.report().cache_hit, str(warm.report()))
        self.assertEqual(warm.report().compilations, 0)
        for a, b in zip(warm_out, cold_out):
            self.assertAllEqual(a, b)
        return cold, warm

    def test_a_new_tf_function_of_the_same_step_hits(self):
        # tf.custom_gradient and tf.cond / while_loop functions get names
        # numbered process-wide, different in each trace (trace_names.py).
        @tf.custom_gradient
        def clipped(a):
            return tf.tanh(a) * 2.0, lambda dy: tf.clip_by_value(dy, -1.0, 1.0)

        def step(x, g):
            y = tf.cond(tf.reduce_sum(x) > 0.0, lambda: tf.exp(x) * g + 1.0,
                        lambda: tf.sigmoid(x * g) - 1.0)
            _, z = tf.while_loop(lambda i, a: i < 2,
                                 lambda i, a: (i + 1, tf.tanh(a * 1.1) + 0.1), [0, y])
            with tf.GradientTape() as tape:
                tape.watch(x)
                w = tf.reduce_sum(clipped(x * g) * z)
            return tf.nn.softmax(z * 3.0, axis=-1) + 0.5, tape.gradient(w, x)

        cold, warm = self._cold_then_hit(step)
        names = [{f.signature.name for f in opt.graph_def.library.function}
                 for opt in (cold, warm)]
        self.assertNotEmpty(names[0])
        # Each graph calls its own trace's functions, the rewritten body too.
        self.assertFalse(names[0] & names[1], names)
        self.assertTrue(any("_fs" in n for n in names[1]), names[1])
        self.assertEqual(len(fusion_stitch_nodes(warm.graph_def)),
                         len(fusion_stitch_nodes(cold.graph_def)))

    def test_a_step_calling_a_function_that_captures_a_variable_hits(self):
        # The step's trace captures the inner function's variable as a
        # Placeholder named by a process-wide counter, and the tape names the
        # inner call's forward and backward functions in string attributes
        # (Keras' grouped convolution, ConvNeXt's train step, does both).
        scale = tf.Variable(tf.linspace(0.5, 1.5, 37))

        def step(x, g):
            @tf.function   # a new function in each trace, as Keras makes it
            def inner(a):
                return tf.nn.softmax(a * scale, axis=-1) * 2.0

            with tf.GradientTape() as tape:
                tape.watch(x)
                y = tf.reduce_sum(inner(x * g) + tf.tanh(x))
            return y, tape.gradient(y, x)

        cold, warm = self._cold_then_hit(step)
        numbered = [set(_numbered_placeholders(opt.graph_def)) for opt in (cold, warm)]
        self.assertNotEmpty(numbered[0])
        # Each graph reads its own trace's captures.
        self.assertFalse(numbered[0] & numbered[1], numbered)

    def _damage_and_rerun(self, damage):
        cold, cold_out = self._run()
        (entry,) = _entries(self.cache)
        path = pathlib.Path(self.cache) / entry
        damage(path)
        opt, out = self._run()
        self.assertFalse(opt.report().cache_hit, str(opt.report()))
        _same_graph(self, opt.graph_def, cold.graph_def)
        for a, b in zip(out, cold_out):
            self.assertAllEqual(a, b)
        # the full rewrite stored a good entry again
        again, _ = self._run()
        self.assertTrue(again.report().cache_hit)

    @staticmethod
    def _rewrite_entry(path, change):
        """Changes the entry's JSON and re-signs it, as if the content (not the
        file) were wrong: only the entry's own checks can catch it."""
        obj = json.loads(path.read_bytes())
        change(obj)
        data = json.dumps(obj).encode()
        path.write_bytes(data)
        pathlib.Path(str(path) + ".sha256").write_text(
            __import__("hashlib").sha256(data).hexdigest() + "\n")

    def test_altered_entry_is_ignored(self):
        def alter(path):
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 1
            path.write_bytes(bytes(data))
        self._damage_and_rerun(alter)

    def test_truncated_entry_is_ignored(self):
        self._damage_and_rerun(lambda p: p.write_bytes(p.read_bytes()[:100]))

    def test_unparsable_entry_is_ignored(self):
        def garbage(path):
            path.write_bytes(b"{not json")
            pathlib.Path(str(path) + ".sha256").write_text(
                __import__("hashlib").sha256(b"{not json").hexdigest() + "\n")
        self._damage_and_rerun(garbage)

    def test_bad_report_in_entry_is_ignored(self):
        self._damage_and_rerun(lambda p: self._rewrite_entry(
            p, lambda obj: obj["report"].update(kernels_after="many")))

    def test_graph_with_wrong_kernel_key_is_ignored(self):
        def wrong_key(obj):
            gd = tf.compat.v1.GraphDef.FromString(base64.b64decode(obj["graph_def"]))
            (node, *_) = fusion_stitch_nodes(gd)
            node.attr["kernel_key"].s = b"0" * 32
            obj["graph_def"] = base64.b64encode(gd.SerializeToString()).decode()
        self._damage_and_rerun(lambda p: self._rewrite_entry(p, wrong_key))

    def test_graph_with_bad_spec_is_ignored(self):
        def bad_spec(obj):
            gd = tf.compat.v1.GraphDef.FromString(base64.b64decode(obj["graph_def"]))
            (node, *_) = fusion_stitch_nodes(gd)
            node.attr["spec"].s = b'{"version": 1, "inputs": [], "ops": "system()"}'
            obj["graph_def"] = base64.b64encode(gd.SerializeToString()).decode()
        self._damage_and_rerun(lambda p: self._rewrite_entry(p, bad_spec))

    def test_missing_kernel_is_rebuilt_on_a_hit(self):
        cold, cold_out = self._run()
        for so in pathlib.Path(self.cache).glob("*.so"):
            # a new file in its place would be loaded: remove it, this process
            # keeps its mapping of the old one
            so.unlink()
            pathlib.Path(str(so) + ".sha256").unlink()
        compilations = cpu_compiler.compilations
        opt, out = self._run()
        self.assertTrue(opt.report().cache_hit)
        self.assertGreater(cold.report().compilations, 0)
        self.assertEqual(cpu_compiler.compilations - compilations, cold.report().compilations)
        self.assertEqual(opt.report().compilations, cold.report().compilations)
        for a, b in zip(out, cold_out):
            self.assertAllEqual(a, b)

    def test_kernel_that_cannot_be_rebuilt_means_a_full_rewrite(self):
        self._run()
        for so in pathlib.Path(self.cache).glob("*.so"):
            so.unlink()
        f = tf.function(_layer)
        opt = fs.optimize(f)
        with mock.patch.dict(os.environ, {"CXX": "false"}):
            with self.assertWarns(RuntimeWarning):
                out = opt(self.x, self.g)
        report = opt.report()
        self.assertFalse(report.cache_hit)
        self.assertNotEmpty(report.fallbacks)
        self.assertEmpty(report.fused_clusters)
        for a, e in zip(out, f(self.x, self.g)):
            assert_same(self, a, e, "exact")

    def test_other_options_miss(self):
        self._run()
        for options in ({"min_cluster_ops": 3}, {"fusion": "xla_like"}, {"grappler": False},
                        {"compile_timeout": 60}):
            before = _entries(self.cache)
            opt, _ = self._run(**options)
            self.assertFalse(opt.report().cache_hit, options)
            self.assertLen(_entries(self.cache), len(before) + 1, options)
            again, _ = self._run(**options)
            self.assertTrue(again.report().cache_hit, options)

    def test_rewrite_cache_off(self):
        self._run(rewrite_cache=False)
        self.assertEmpty(_entries(self.cache))
        self._run()
        self.assertLen(_entries(self.cache), 1)
        opt, _ = self._run(rewrite_cache=False)
        self.assertFalse(opt.report().cache_hit)
        with self.assertRaises(TypeError):
            fs.optimize(tf.function(_layer), rewrite_cache="yes")

    def test_variable_shapes_are_part_of_the_key(self):
        """Captured variables reach the rewrite as handles whose shapes the
        GraphDef does not hold; two functions alike but for them must not share."""
        gen = rng(9502)
        results = []
        for width in (8, 12):
            v = tf.Variable(random(gen, (width,), "float32"))

            @tf.function(input_signature=[tf.TensorSpec([None, None])])
            def f(x):
                return tf.nn.softmax(tf.nn.relu(x + v) * 2.0, axis=-1)

            opt = fs.optimize(f)
            x = random(gen, (3, width), "float32")
            assert_same(self, quiet_call(opt, x), f(x), rtol=1e-5, atol=1e-6)
            results.append(opt.report())
        self.assertFalse(results[0].cache_hit)
        self.assertFalse(results[1].cache_hit, "shared a plan across variable shapes")

    def test_nothing_stored_when_a_cluster_falls_back(self):
        with mock.patch.dict(os.environ, {"CXX": "false"}):
            with self.assertWarns(RuntimeWarning):
                fs.optimize(tf.function(_layer))(self.x, self.g)
        self.assertEmpty(_entries(self.cache))

    def test_refused_cache_directory_is_a_miss(self):
        os.chmod(self.cache, 0o777)
        try:
            with self.assertWarns(RuntimeWarning):  # kernels cannot be built there either
                f = tf.function(_layer)
                out = fs.optimize(f)(self.x, self.g)
        finally:
            os.chmod(self.cache, 0o700)
        for a, e in zip(out, f(self.x, self.g)):
            assert_same(self, a, e, "exact")
        self.assertEmpty(_entries(self.cache))


def test_report_json_round_trip():
    r = Report("f", "(float32(4,))",
               [ClusterReport("fs1", [("a", "Add"), ("b", "Mul")], True, kernel_key="k",
                              loops=2, buffered=("t1",)),
                ClusterReport("c", [("c", "Exp")], False, reason="no compiler")],
               5, 3, 1.5, 2, 3.25, [("n", "Relu", "why")], "explore", "k=3", True)
    assert Report.from_json(r.to_json()) == r
    for bad in ('[]', '{"function": "f"}',
                r.to_json().replace('"loops": 2', '"loops": "2"'),
                r.to_json().replace('["a", "Add"]', '["a", "Add", "x"]'),
                r.to_json().replace('"fused": true', '"fused": 1'),
                r.to_json()[:-1] + ', "extra": 1}'):
        with pytest.raises(ValueError):
            Report.from_json(bad)


def test_read_and_write_verified(tmp_path, monkeypatch):
    directory = tmp_path / "c"
    monkeypatch.setenv(cache.ENV_CACHE_DIR, str(directory))
    assert cache.read_verified("k1", ".bin") is None
    cache.write_verified("k1", ".bin", b"hello")
    assert cache.read_verified("k1", ".bin") == b"hello"
    cache.write_verified("k1", ".bin", b"again")
    assert cache.read_verified("k1", ".bin") == b"again"
    (directory / "k1.bin").write_bytes(b"agaim")
    assert cache.read_verified("k1", ".bin") is None
    (directory / "k1.bin.sha256").unlink()
    assert cache.read_verified("k1", ".bin") is None
    assert not [p for p in os.listdir(directory) if p.startswith(".tmp")]
    with pytest.raises(ValueError):
        cache.read_verified("../k", ".bin")
    with pytest.raises(ValueError):
        cache.write_verified("k", "/x", b"")


def _traced_with_made_up_names():
    @tf.custom_gradient
    def doubled(a):
        return a * 2.0, lambda dy: dy * 2.0

    return _gradient_trace(
        lambda x: doubled(tf.cond(x[0] > 0.0, lambda: x + 1.0, lambda: x - 1.0)))


def _gradient_trace(forward):
    """The GraphDef of a new trace of the gradient of sum(forward(x)), x of shape [3]."""
    def fn(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = tf.reduce_sum(forward(x))
        return tape.gradient(y, x)
    return tf.function(fn).get_concrete_function(tf.TensorSpec([3])).graph.as_graph_def()


def _library_names(graph_def):
    return sorted(f.signature.name for f in graph_def.library.function)


def _canonical_round_trip(a, b):
    """Two traces' TraceNames, their common canonical form, and that form in
    b's names again, which is b (its library in name order)."""
    from tf_fusionstitch.trace_names import TraceNames
    names_a, names_b = TraceNames(a), TraceNames(b)
    canonical = names_a.canonical(a)
    assert canonical.SerializeToString(deterministic=True) == \
        names_b.canonical(b).SerializeToString(deterministic=True)
    restored = names_b.specific(canonical)
    assert restored.SerializeToString(deterministic=True) == \
        names_b.specific(names_b.canonical(b)).SerializeToString(deterministic=True)
    return names_a, names_b, canonical, restored


def test_trace_names_canonical_form_is_the_same_for_two_traces():
    a, b = _traced_with_made_up_names(), _traced_with_made_up_names()
    assert _library_names(a) != _library_names(b)
    _, _, canonical, restored = _canonical_round_trip(a, b)
    assert "CustomGradient" not in str(canonical)
    assert _library_names(restored) == _library_names(b)
    assert "CustomGradient" in str(restored)


def _traced_with_numbered_captures():
    scale = tf.Variable([1.0, 2.0, 3.0])

    def forward(x):
        @tf.function   # a new function in each trace
        def inner(a):
            return a * scale
        return inner(x)
    return _gradient_trace(forward)


def _numbered_placeholders(graph_def):
    return sorted(n.name for n in graph_def.node
                  if n.op == "Placeholder" and n.name.rpartition("/")[2].isdigit())


def test_trace_names_number_captures_and_call_names_by_first_use():
    from tf_fusionstitch.trace_names import CALL_NAME_ATTRS
    a, b = _traced_with_numbered_captures(), _traced_with_numbered_captures()
    assert _numbered_placeholders(a) and _numbered_placeholders(a) != _numbered_placeholders(b)
    names_a, names_b, canonical, restored = _canonical_round_trip(a, b)
    assert _numbered_placeholders(canonical) == []
    call_names = [f.attr[k].s for f in canonical.library.function for k in CALL_NAME_ATTRS
                  if k in f.attr]
    assert call_names and all(n.startswith(b"fs_traced_call_") for n in call_names)
    # b's own names back, and the tensors' canonical names agree
    (capture,) = _numbered_placeholders(b)
    assert _numbered_placeholders(restored) == [capture]
    assert names_b.canonical_tensor(capture + ":0") == \
        names_a.canonical_tensor(_numbered_placeholders(a)[0] + ":0")
    assert names_b.canonical_tensor("x:0") == "x:0"


def test_trace_names_portable_only_when_every_function_derives_from_a_traced_one():
    from tf_fusionstitch.trace_names import TraceNames
    traced = _traced_with_made_up_names()
    names = TraceNames(traced)
    assert names.portable(traced)
    derived = type(traced)()
    derived.CopyFrom(traced)
    derived.library.function[0].signature.name += "_tfg_region_specialized_0"
    assert names.portable(derived)
    foreign = type(traced)()
    foreign.CopyFrom(traced)
    foreign.library.function[0].signature.name = "some_other_function_12"
    assert not names.portable(foreign)
