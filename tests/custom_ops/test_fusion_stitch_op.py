"""Tests of the FusionStitch custom op with a hand-written ABI kernel."""

import os
import shutil
import tempfile

import numpy as np
import tensorflow as tf

from tf_fusionstitch.custom_ops import loader
from tf_fusionstitch.runtime import cache, cpu_compiler, cpu_kernel, kernel_library

COLS = 8

# out0[r, c] = x[r, c] * 2 + y[c]; work items are rows. out0 may reuse x's
# buffer (each element is read before it is written, by the same item).
SCALE_ADD_KERNEL = r"""
#include <cstdint>
#include <cstdio>
#define FS_EXPORT extern "C" __attribute__((visibility("default")))
FS_EXPORT const int64_t fs_meta[] = {2, 2, 1, 2, /*in ranks*/ 2, 1, /*out ranks*/ 2,
                                     /*in dtypes: DT_FLOAT*/ 1, 1, /*out dtypes*/ 1,
                                     /*n_fwd*/ 1, /*out 0 <- in 0*/ 0, 0};
FS_EXPORT int fs_shape(const int64_t* in_dims, int64_t* out_dims, int64_t* ext,
                       int64_t* work, char* err, int64_t errlen) {
  const int64_t rows = in_dims[0], cols = in_dims[1], ylen = in_dims[2];
  if (ylen != cols) {
    snprintf(err, errlen, "scale_add: y has %lld elements but x has %lld columns",
             (long long)ylen, (long long)cols);
    return 1;
  }
  out_dims[0] = rows;
  out_dims[1] = cols;
  ext[0] = rows;
  ext[1] = cols;
  work[0] = rows;
  work[1] = 2 * cols;
  return 0;
}
FS_EXPORT void fs_run(int64_t begin, int64_t end, const int64_t* ext, void* const* bufs) {
  const float* x = static_cast<const float*>(bufs[0]);
  const float* y = static_cast<const float*>(bufs[1]);
  float* out = static_cast<float*>(bufs[2]);
  const int64_t cols = ext[1];
  for (int64_t r = begin; r < end; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = x[r * cols + c] * 2.0f + y[c];
}
"""

SPEC = '{"test": "scale_add", "version": 1}'
KEY = cache.content_key(SPEC)


def _reference(x, y):
    return x * np.float32(2) + y


class FusionStitchOpTest(tf.test.TestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._saved_env = os.environ.get(cache.ENV_CACHE_DIR)
        # The op library (~10 s to build) goes to one dir for the whole run.
        cls._session_cache = tempfile.mkdtemp(prefix="fs-op-lib-")
        os.environ[cache.ENV_CACHE_DIR] = cls._session_cache
        cls.ops = loader.load()

    @classmethod
    def tearDownClass(cls):
        if cls._saved_env is None:
            os.environ.pop(cache.ENV_CACHE_DIR, None)
        else:
            os.environ[cache.ENV_CACHE_DIR] = cls._saved_env
        shutil.rmtree(cls._session_cache, ignore_errors=True)
        super().tearDownClass()

    def setUp(self):
        super().setUp()
        # Kernels go to a fresh cache per test.
        self._test_cache = tempfile.mkdtemp(prefix="fs-kernels-")
        os.environ[cache.ENV_CACHE_DIR] = self._test_cache
        self.rng = np.random.default_rng(1234)
        self.so_path = cpu_compiler.compile_shared_object(SCALE_ADD_KERNEL)
        loader.register_kernel(KEY, self.so_path, SPEC)

    def tearDown(self):
        os.environ[cache.ENV_CACHE_DIR] = self._session_cache
        shutil.rmtree(self._test_cache, ignore_errors=True)
        super().tearDown()

    def _inputs(self, rows, cols=COLS):
        x = self.rng.standard_normal((rows, cols)).astype(np.float32)
        y = self.rng.standard_normal(cols).astype(np.float32)
        return x, y

    def _op(self, x, y, key=KEY, spec=SPEC, output_shapes=((None, COLS),)):
        return self.ops.fusion_stitch([x, y], Tout=[tf.float32],
                                      output_shapes=list(output_shapes),
                                      spec=spec, kernel_key=key)

    def test_eager_matches_numpy_for_two_batch_sizes(self):
        for rows in (3, 17):
            x, y = self._inputs(rows)
            (out,) = self._op(x, y)
            self.assertEqual(out.shape, (rows, COLS))
            self.assertAllEqual(out, _reference(x, y))  # same roundings: exact

    def test_tf_function_traces_once_for_two_batch_sizes(self):
        @tf.function(input_signature=[tf.TensorSpec([None, COLS], tf.float32),
                                      tf.TensorSpec([COLS], tf.float32)])
        def fn(x, y):
            # abs(x) dies at the op, so TF may hand its buffer to the output.
            (out,) = self._op(tf.abs(x), y)
            self.assertEqual(out.shape.as_list(), [None, COLS])  # from output_shapes
            return out

        for rows in (5, 64):
            x, y = self._inputs(rows)
            self.assertAllEqual(fn(x, y), _reference(np.abs(x), y))
        self.assertEqual(fn.experimental_get_tracing_count(), 1)

    def test_large_input_is_sharded_over_the_pool(self):
        x, y = self._inputs(20000, 64)
        (out,) = self.ops.fusion_stitch([x, y], Tout=[tf.float32], output_shapes=[[None, 64]],
                                        spec=SPEC, kernel_key=KEY)
        self.assertAllEqual(out, _reference(x, y))

    def test_empty_batch(self):
        x, y = self._inputs(0)
        (out,) = self._op(x, y)
        self.assertEqual(out.shape, (0, COLS))

    def test_shape_function_error_is_reported(self):
        x, _ = self._inputs(4)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "y has 3 elements but x has 8 columns"):
            self._op(x, np.zeros(3, np.float32))

    def test_wrong_input_rank_is_reported(self):
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    "input 0 has shape .* but the kernel takes rank 2"):
            self._op(np.zeros(COLS, np.float32), np.zeros(COLS, np.float32))

    def test_unregistered_key_fails_with_advice(self):
        x, y = self._inputs(2)
        with self.assertRaisesRegex(tf.errors.FailedPreconditionError,
                                    "not loaded in this process.*tf_fusionstitch.optimize"):
            self._op(x, y, key=cache.content_key("never registered"))

    def test_mismatching_spec_is_refused(self):
        x, y = self._inputs(2)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "spec differs"):
            self._op(x, y, spec=SPEC.replace("scale_add", "something_else"))

    def test_wrong_arity_and_rank_attrs_are_refused(self):
        x, y = self._inputs(2)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "has 1 inputs"):
            self.ops.fusion_stitch([x], Tout=[tf.float32], output_shapes=[[None, COLS]],
                                   spec=SPEC, kernel_key=KEY)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, "produces rank 2"):
            self._op(x, y, output_shapes=[[None]])
        with self.assertRaisesRegex(tf.errors.InternalError, "incompatible with the declared"):
            self._op(x, y, output_shapes=[[None, COLS + 1]])

    def test_attr_dtypes_must_match_the_kernel(self):
        # Right spec and key, wrong dtypes: the float kernel would read past the
        # end of half buffers, so such a node is refused before it runs.
        x, y = self._inputs(2)
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"Tin\[0\] is double but kernel '.*' was generated "
                                    r"for float"):
            self._op(x.astype(np.float64), y.astype(np.float64))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"Tin\[1\] is half but kernel '.*' was generated "
                                    r"for float"):
            self._op(x, y.astype(np.float16))
        with self.assertRaisesRegex(tf.errors.InvalidArgumentError,
                                    r"Tout\[0\] is double but kernel '.*' was generated "
                                    r"for float"):
            self.ops.fusion_stitch([x, y], Tout=[tf.float64], output_shapes=[[None, COLS]],
                                   spec=SPEC, kernel_key=KEY)

        @tf.function(input_signature=[tf.TensorSpec([None, COLS], tf.float16),
                                      tf.TensorSpec([COLS], tf.float16)])
        def in_graph(a, b):
            return self._op(a, b)

        with self.assertRaisesRegex(tf.errors.InvalidArgumentError, r"Tin\[0\] is half"):
            in_graph(x.astype(np.float16), y.astype(np.float16))

    def test_registration_errors(self):
        with self.assertRaisesRegex(RuntimeError, "different spec"):
            loader.register_kernel(KEY, self.so_path, SPEC + " ")
        with self.assertRaisesRegex(RuntimeError, "cannot load kernel"):
            loader.register_kernel("missing", "/nonexistent/kernel.so", SPEC)
        no_symbols = cpu_compiler.compile_shared_object("int unrelated() { return 0; }\n")
        with self.assertRaisesRegex(RuntimeError, "does not export fs_meta"):
            loader.register_kernel("no-symbols", no_symbols, SPEC)
        wrong_abi = cpu_compiler.compile_shared_object(
            SCALE_ADD_KERNEL.replace("fs_meta[] = {2,", "fs_meta[] = {1,"))
        with self.assertRaisesRegex(RuntimeError, "ABI version 1, this op supports version 2"):
            loader.register_kernel("wrong-abi", wrong_abi, SPEC)
        bad_dtype = cpu_compiler.compile_shared_object(  # 7 is DT_STRING
            SCALE_ADD_KERNEL.replace("/*in dtypes: DT_FLOAT*/ 1, 1", "/*in dtypes*/ 1, 7"))
        with self.assertRaisesRegex(RuntimeError, "unsupported dtype code 7 for input 1"):
            loader.register_kernel("bad-dtype", bad_dtype, SPEC)
        loader.register_kernel(KEY, self.so_path, SPEC)  # idempotent

    def test_kernels_of_one_library_run_under_their_own_symbols(self):
        # Two kernels in one shared object (runtime/kernel_library.py): the
        # second scales by 3, so each node must reach its own fs_run.
        prelude = SCALE_ADD_KERNEL[:SCALE_ADD_KERNEL.index("FS_EXPORT const int64_t fs_meta")]
        triple = SCALE_ADD_KERNEL.replace("* 2.0f + y[c]", "* 3.0f + y[c]")
        library = cpu_compiler.compile_shared_object(kernel_library.library_source(
            prelude, [("ktwo", SCALE_ADD_KERNEL), ("kthree", triple)]))
        spec3 = SPEC.replace("scale_add", "scale_add_3")
        loader.register_kernel("lib-two", library, SPEC, "ktwo")
        loader.register_kernel("lib-three", library, spec3, "kthree")
        x, y = self._inputs(5)
        (two,) = self._op(x, y, key="lib-two")
        (three,) = self._op(x, y, key="lib-three", spec=spec3)
        self.assertAllEqual(two, _reference(x, y))
        self.assertAllEqual(three, x * np.float32(3) + y)
        with self.assertRaisesRegex(RuntimeError, "does not export fs_meta_kfour"):
            loader.register_kernel("lib-four", library, SPEC, "kfour")
        with self.assertRaisesRegex(RuntimeError, "does not export fs_meta,"):
            loader.register_kernel("lib-plain", library, SPEC)

    def test_cpu_kernel_gives_the_same_result(self):
        kernel = cpu_kernel.CpuKernel(self.so_path)  # dtypes from fs_meta
        self.assertEqual(kernel.meta.forward, ((0, 0),))
        self.assertEqual(kernel.meta.in_dtypes, ("float32", "float32"))
        self.assertEqual(kernel.out_dtypes, (np.dtype(np.float32),))
        for rows in (3, 17):
            x, y = self._inputs(rows)
            (op_out,) = self._op(x, y)
            for threads in (1, 2):
                (np_out,) = kernel.run([x, y], threads=threads)
                self.assertAllEqual(np_out, op_out)
        with self.assertRaisesRegex(cpu_kernel.KernelShapeError, "y has 3 elements"):
            kernel.run([x, np.zeros(3, np.float32)])


if __name__ == "__main__":
    tf.test.main()
