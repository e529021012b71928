"""The array interpreter of the fusion IR (tf_fusionstitch/array_interpreter.py)
with NumPy: it must compute what the patterns' references and the generated
CPU kernels compute, since cuda_check times the CUDA kernels against the same
interpreter run by JAX. TF-free; the CPU kernels need g++."""

import json

import numpy as np
import pytest

from tf_fusionstitch import array_interpreter, patterns
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.kernels import build_cpu_kernel
import repo_paths

PATTERNS = patterns.standard_patterns()
CLUSTER_FILES = sorted((repo_paths.TESTS / "gpu_clusters").glob("*.json"))


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_standard_pattern_matches_its_reference(name):
    p = PATTERNS[name]
    inputs = p.make_inputs(np.random.default_rng(7), 37)
    got = array_interpreter.interpret(p.cluster, np)(*inputs)
    want = p.reference(inputs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        err, ok = patterns.max_error(g, w, p.rtol, p.atol)
        assert ok, (name, err)


@pytest.mark.parametrize("path", CLUSTER_FILES[:12], ids=lambda p: p.stem)
def test_bert_cluster_matches_the_cpu_kernel(path):
    """Clusters optimize() cut from a BERT encoder (reshapes, broadcasts,
    several outputs), on random inputs with 13 rows."""
    cluster = ir.Cluster.from_json(path.read_text())
    inputs = patterns.random_inputs(cluster, 13, np.random.default_rng(3))
    got = array_interpreter.interpret(cluster, np)(*inputs)
    want = build_cpu_kernel(cluster).runner().run(inputs)
    for g, w in zip(got, want):
        err, ok = patterns.max_error(g, w, 1e-4, 1e-5)
        assert ok, (path.stem, err)


def test_wrong_number_of_inputs_is_named():
    p = PATTERNS["softmax_128"]
    with pytest.raises(ValueError, match="takes 1 inputs, got 2"):
        array_interpreter.interpret(p.cluster, np)(np.ones((2, 128)), np.ones((2, 128)))


def test_sixteen_bit_inputs_compute_in_float32_and_store_their_type():
    c = ir.Cluster.from_json(json.dumps({
        "version": 1,
        "inputs": [{"name": "x", "type": {"dtype": "float16", "shape": [None, 8]}}],
        "ops": [{"name": "y", "prim": "exp", "inputs": ["x"],
                 "type": {"dtype": "float16", "shape": [None, 8]}, "attrs": {}}],
        "outputs": ["y"]}))
    x = np.linspace(-3, 3, 16, dtype=np.float16).reshape(2, 8)
    (y,) = array_interpreter.interpret(c, np)(x)
    assert y.dtype == np.float16
    np.testing.assert_array_equal(y, np.exp(x.astype(np.float32)).astype(np.float16))


def test_sum_order_shuffles_the_terms_of_each_float32_sum():
    """A sum in another order: the same value to float32 rounding, and
    another rounding of it (tools/output_checks.float32_spread)."""
    p = PATTERNS["softmax_128"]
    x = np.random.default_rng(0).standard_normal((64, 128)).astype(np.float32) * 100
    plain = array_interpreter.interpret(p.cluster, np)(x)[0]
    run = array_interpreter.interpret(p.cluster, np, sum_order=np.random.default_rng(1))
    first, second = run(x)[0], run(x)[0]
    for got in (first, second):
        assert patterns.max_error(got, plain, 1e-5, 1e-7)[1]
    assert not np.array_equal(first, second)   # each call draws another order
