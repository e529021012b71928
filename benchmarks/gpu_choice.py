"""The latency evaluator's plan choices, measured on the GPU (TF-free; CuPy).

For clusters where the evaluator (tf_fusionstitch/gpu/choice.py) picks a plan
other than the column-count thresholds' for this device, it times both
kernels on the same inputs, checks both against NumPy, and prints one line
each: the two mappings, the predicted and the measured times, and whether the
evaluator's choice was the faster one. Times are cupyx.profiler.benchmark's
median GPU time per call; a call includes the host shape function and, for a
split row, its several launches, so kernels of a few microseconds measure
launch overhead more than the kernel.

  python benchmarks/gpu_choice.py                  # needs a GPU gpu_cost.GPUS knows
  python benchmarks/gpu_choice.py --compile_only   # builds every cubin, no GPU needed
"""

import sys

from absl import app
from absl import flags
import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import patterns
from tf_fusionstitch.codegen.generate import generate_cuda
from tf_fusionstitch.codegen.gpu_printer import NVRTC_OPTIONS
from tf_fusionstitch.gpu import build as gpu_build, choice as gpu_choice, cost as gpu_cost
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.schedule import build_schedule

FLAGS = flags.FLAGS
flags.DEFINE_string("gpu", None, "GPU to choose plans for (default: the device's).")
flags.DEFINE_bool("compile_only", False, "Build both cubins per case for --gpu; no GPU needed.")
flags.DEFINE_integer("n_repeat", 200, "Timed calls per kernel.")


def _softmax(rows, width):
    shape, kept = (rows, width), (rows, 1)
    f = lambda s: ir.TensorType("float32", s)  # noqa: E731
    c = ir.Cluster((("x", f(shape)),), (
        ir.make_op("m", "reduce_max", ["x"], f(kept), axes=[-1], keep_dims=True),
        ir.make_op("d", "sub", ["x", "m"], f(shape)),
        ir.make_op("e", "exp", ["d"], f(shape)),
        ir.make_op("z", "reduce_sum", ["e"], f(kept), axes=[-1], keep_dims=True),
        ir.make_op("y", "div", ["e", "z"], f(shape))), ("y",))

    def ref(ins):
        x = ins[0].astype(np.float64)
        e = np.exp(x - x.max(-1, keepdims=True))
        return [e / e.sum(-1, keepdims=True)]
    make = lambda rng, _: [(rng.standard_normal(shape) * 4).astype(np.float32)]  # noqa: E731
    return patterns.Pattern(f"softmax_{rows}x{width}", c, make, ref, 2e-5, 1e-6)


def cases():
    """(pattern, rows to choose and run for)."""
    return [(_softmax(4, 1 << 20), 4), (_softmax(8, 1 << 18), 8), (_softmax(64, 30000), 64),
            (patterns.layernorm(768), 64), (patterns.layernorm(768), 256),
            (patterns.softmax(16), 1 << 20)]


def main(argv):
    del argv
    gpu = FLAGS.gpu
    if not FLAGS.compile_only:
        import cupy
        from cupyx.profiler import benchmark
        gpu = gpu or gpu_build.device_gpu()
        if gpu is None:
            sys.exit("this device is not in gpu_cost.GPUS; pass --gpu to compare anyway")
    gpu = gpu or "H100"
    arch = gpu_cost.GPUS[gpu].arch
    print(f"{'case':22} {'rows':>8} {'thresholds':>16} {'chosen':>16} "
          f"{'pred us':>15} {'measured us':>15}  chosen faster")
    for pat, rows in cases():
        s = build_schedule(pat.cluster)
        default, chosen = plan_gpu(s), plan_gpu(s, gpu, rows)
        n_rows, cols = gpu_choice.extents(s, rows)
        pred = [gpu_cost.estimate(p, gpu, n_rows, cols).latency_s * 1e6 for p in (default, chosen)]
        names = [gpu_choice.describe(p) for p in (default, chosen)]
        line = f"{pat.name:22} {rows:>8} {names[0]:>16} {names[1]:>16} " \
               f"{f'{pred[0]:.1f}/{pred[1]:.1f}':>15}"
        if FLAGS.compile_only:
            for p in (default, chosen):
                nvrtc.compile_cubin(generate_cuda(pat.cluster, plan=p).source, arch, NVRTC_OPTIONS)
            print(line + f" {'compiled':>15}")
            continue
        inputs = pat.make_inputs(np.random.default_rng(0), rows)
        on_device = [cupy.asarray(a) for a in inputs]
        times = []
        for p in (default, chosen):
            kernel = gpu_build.load_cuda(pat.cluster, plan=p)
            outs = [o.get() for o in kernel.run(on_device)]
            for got, want in zip(outs, pat.reference(inputs)):
                np.testing.assert_allclose(got, want, rtol=pat.rtol, atol=pat.atol)
            t = benchmark(kernel.run, (on_device,), n_repeat=FLAGS.n_repeat, n_warmup=10)
            times.append(float(np.median(t.gpu_times)) * 1e6)
        print(line + f" {f'{times[0]:.1f}/{times[1]:.1f}':>15}  "
              + ("yes" if times[1] <= times[0] else "NO"))


if __name__ == "__main__":
    app.run(main)
