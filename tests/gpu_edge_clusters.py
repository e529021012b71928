"""Clusters that reach the corners of the GPU mapping, shared by the CUDA
compile checks and the emulation tests: run-time row lengths (recompute
instead of shared buffers), two column groups, float64/int/bool reductions,
elementwise rows split into several items."""

import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.gpu import build as gpu_build
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel

T, op = ir.TensorType, ir.make_op
N = None


def emulate_plan(cluster, plan, inputs, reverse_threads=False):
    """Outputs of `cluster` under GPU `plan`, by the C++ emulation of the CUDA kernel."""
    path = gpu_build.build_emulation(cluster, reverse_threads, plan=plan)
    return CpuKernel(path).run(inputs, threads=2, forward=True)


def softmax_reference(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def softmax(shape, dtype="float32"):
    kept = shape[:-1] + (1,)
    return ir.Cluster((("x", T(dtype, shape)),), (
        op("m", "reduce_max", ["x"], T(dtype, kept), axes=[-1], keep_dims=True),
        op("d", "sub", ["x", "m"], T(dtype, shape)),
        op("e", "exp", ["d"], T(dtype, shape)),
        op("z", "reduce_sum", ["e"], T(dtype, kept), axes=[-1], keep_dims=True),
        op("y", "div", ["e", "z"], T(dtype, shape))), ("y",))


def two_column_groups_f64():
    """Reduces axes 0 and 2 of [4, rows, 300]: 1200 columns in two groups."""
    f = T("float64", (4, N, 300))
    kept = T("float64", (1, N, 1))
    return ir.Cluster((("x", f),), (
        op("mx", "reduce_max", ["x"], kept, axes=[0, 2], keep_dims=True),
        op("d", "sub", ["x", "mx"], f),
        op("sq", "mul", ["d", "d"], f),
        op("ss", "reduce_sum", ["sq"], kept, axes=[0, 2], keep_dims=True),
        op("y", "mul", ["d", "ss"], f)), ("y", "ss"))


def int_bool_reductions(width=45):
    row = T("int32", (N,))
    return ir.Cluster((("x", T("int32", (N, width))),), (
        op("mean", "reduce_mean", ["x"], row, axes=[1], keep_dims=False),
        op("mn", "reduce_min", ["x"], row, axes=[1], keep_dims=False),
        op("z", "const", [], T("int32", ()), value=0),
        op("pos", "greater", ["x", "z"], T("bool", (N, width))),
        op("all", "reduce_all", ["pos"], T("bool", (N,)), axes=[1], keep_dims=False),
        op("any", "reduce_any", ["pos"], T("bool", (N,)), axes=[1], keep_dims=False)),
        ("mean", "mn", "all", "any"))


def long_elementwise(width=10000):
    """No reduction: each row of `width` columns is several 4096-column items."""
    return ir.Cluster((("a", T("float32", (N, width))), ("b", T("float32", (width,)))), (
        op("p", "mul", ["a", "b"], T("float32", (N, width))),
        op("t", "tanh", ["p"], T("float32", (N, width)))), ("t", "p"))


def half_layernorm(dtype, width=768):
    """Loads and stores 16-bit floats, computes and reduces in float32."""
    full, row = T(dtype, (N, width)), T(dtype, (N, 1))
    return ir.Cluster((("x", full), ("g", T(dtype, (width,)))), (
        op("mean", "reduce_mean", ["x"], row, axes=[1], keep_dims=True),
        op("d", "sub", ["x", "mean"], full),
        op("sq", "square", ["d"], full),
        op("var", "reduce_mean", ["sq"], row, axes=[1], keep_dims=True),
        op("eps", "const", [], T(dtype, ()), value=1e-3),
        op("ve", "add", ["var", "eps"], row),
        op("rs", "rsqrt", ["ve"], row),
        op("n", "mul", ["d", "rs"], full),
        op("y", "mul", ["n", "g"], full),
        op("y32", "cast", ["y"], T("float32", (N, width)))), ("y", "y32"))


EDGE_CLUSTERS = {
    "softmax_dynamic": softmax((N, N)),
    "softmax_0": softmax((N, 0)),
    "softmax_1": softmax((N, 1)),
    "softmax_8": softmax((N, 8)),
    "softmax_70": softmax((N, 70)),
    "softmax_f64_2000": softmax((N, 2000), "float64"),
    "two_column_groups_f64": two_column_groups_f64(),
    "int_bool_reductions": int_bool_reductions(),
    "long_elementwise": long_elementwise(),
    "layernorm_float16": half_layernorm("float16"),
    "layernorm_bfloat16": half_layernorm("bfloat16"),
}
