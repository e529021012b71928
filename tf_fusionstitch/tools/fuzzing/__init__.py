"""Differential fuzzing of `tf_fusionstitch.optimize` with random graphs.

A *case* is a small random DAG of op-table ops (3-12 ops) over a few inputs,
described by plain JSON so that it can be replayed, shrunk and checked in:

    {"version": 1, "seed": 123,
     "inputs": [{"name": "x0", "dtype": "float32", "shape": [3, 1, 4],
                 "static": [null, 1, 4], "domain": "normal", "edges": 0.1}],
     "nodes": [{"name": "n0", "op": "AddV2", "inputs": ["x0", {"const": 0.5}],
                "attrs": {}}],
     "outputs": ["n0"]}

`shape` is the run-time shape, `static` the input signature (None = dynamic),
`domain` and `edges` say how input values are drawn (`make_inputs`: seeded by
`seed`, the draw and the input's name; mostly valid-domain values, never all
zeros; `edges` is the fraction of elements replaced by NaN, +-Inf, -0.0,
denormals, huge values, or for integers extreme values). A node's inputs are
value names or scalar constants. Extreme integers overflow only where TF's
kernels wrap (two's complement add, sub, mul, neg, abs, square, sums and
products, int64 means; ours build with -fwrapv); TF's int32 Mean does not wrap
(it is exact, measured), and the oracle says so. Integer division gets divisors
in +-[2, 20] (no division by zero, no INT_MIN / -1); float-to-int casts of
NaN, Inf or out-of-range values are undetermined (undefined behaviour in C++).

The runner (`run_cases`) puts several independent cases into ONE tf.function
(one trace, one Grappler run, the kernels of all cases compiled in parallel),
optimizes it with min_cluster_ops=1, calls both on fresh random inputs and
checks every output of every case, so a mismatch is attributed to its case.

Modules, in the order a case flows through them: `ops` (the vocabulary),
`case_types` (shape and dtype inference), `inputs` (input values), `generator`,
`tf_graph` (the case as TF ops), `runner` (optimized vs TensorFlow), the oracle
(`intervals`, `op_errors`, `grappler_model`, `oracle`, `checking`: how results
are judged), `shrinking`, `regressions` (files under tests/fuzz_regressions/),
`reproducer` (standalone scripts) and `session` (`fuzz`: a whole run).

On a mismatch, `shrink` removes outputs and ops, lowers ranks and extents and
drops edge values while the mismatch persists, and `save_regression` writes the
minimal case under tests/fuzz_regressions/. `python -m tf_fusionstitch.tools.fuzz`
is the command-line driver.
"""
