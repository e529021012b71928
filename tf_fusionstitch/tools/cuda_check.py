"""Check CUDA kernels without a GPU: compile, assemble, emulate, compare.

For the standard patterns (tf_fusionstitch/patterns.py) and any fusion-spec
JSON files given with --clusters, this generates the CUDA kernel, compiles
it with NVRTC for each --arch, reads ptxas' registers, shared memory and
spills (and the occupancy they allow), runs the C++ emulation of the CUDA schedule and prints the largest
error: against NumPy for the patterns, against the CPU kernel for spec
files (random inputs; every dynamic dimension takes each --rows value; the
tolerance relative to each output's largest magnitude, as on the GPU: see
output_checks.compare_outputs; where that fails, the emulation passes if it is at most twice as
far from a float64 interpretation of the spec as the CPU kernel is:
output_checks.as_close_as_cpu); a packed spec (unconnected parts in one CPU launch,
codegen/pack.py) part by part.
Exits with status 1 when a kernel spills or an error exceeds its tolerance.

With --gpu (V100, A100, H100, H200) each kernel is the plan the latency
evaluator chooses for that GPU (tf_fusionstitch/gpu/choice.py), and the
table adds its predicted latency for --gpu_rows rows (default: the static
row count, else gpu_choice.ASSUMED_ROWS), from ptxas' registers where the
GPU's architecture is among --arch, else from the evaluator's estimate.

  python -m tf_fusionstitch.tools.cuda_check --arch=sm_80,sm_90
  python -m tf_fusionstitch.tools.cuda_check --clusters=spec.json --nopatterns
  python -m tf_fusionstitch.tools.cuda_check --gpu=H100 --arch=sm_90

On a machine with a GPU (--on_gpu=auto, the default, when CuPy sees one;
--on_gpu=yes insists) each kernel also runs there, with the plan chosen for
that device, on fresh random inputs with --run_rows rows: its outputs are
checked like the emulation's, it is timed by CUDA events (median, inputs
rotated past the L2), and, where JAX is installed, the same cluster run by
JAX (array_interpreter.py: XLA fuses and compiles it) is checked and both
are timed alike by the host clock over back-to-back calls. The GPU columns
count towards the last line's failures. Only numpy and CuPy are needed.
"""

import math
import os
import pathlib
import sys

from absl import app
from absl import flags
import numpy as np

from tf_fusionstitch import array_interpreter, patterns
from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import pack
from tf_fusionstitch.gpu import build as gpu_build, choice as gpu_choice, cost as gpu_cost
from tf_fusionstitch.gpu.choice import plan_gpu
from tf_fusionstitch.gpu.occupancy import SM_LIMITS, occupancy
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel, as_dtype
from tf_fusionstitch.runtime.cuda_timing import BoundKernel, Device, input_sets, wall_per_call
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule
from tf_fusionstitch.tools.output_checks import ATOL, RTOL, agrees_with_cpu, compare_outputs

FLAGS = flags.FLAGS
flags.DEFINE_list("arch", ["sm_80", "sm_90"], "Architectures to compile for.")
flags.DEFINE_list("clusters", [], "Fusion-spec JSON files (Cluster.to_json) to check too.")
flags.DEFINE_bool("patterns", True, "Check the standard patterns.")
flags.DEFINE_list("rows", ["0", "1", "13", "37"], "Extents of the dynamic dimensions.")
flags.DEFINE_float("rtol", RTOL, "Relative tolerance against the CPU kernel (spec files).")
flags.DEFINE_float("atol", ATOL, "Absolute tolerance against the CPU kernel (spec files).")
flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
flags.DEFINE_enum("gpu", None, sorted(gpu_cost.GPUS),
                  "Choose each plan with the latency evaluator for this GPU and print its "
                  "predicted latency.")
flags.DEFINE_integer("gpu_rows", None, "Rows the --gpu plans are chosen and predicted for.")
flags.DEFINE_enum("on_gpu", "auto", ["auto", "yes", "no"],
                  "Also run, check and time each kernel on the GPU (auto: when CuPy sees one).")
flags.DEFINE_integer("run_rows", 16384, "Rows (dynamic dimensions) of the inputs on the GPU.")
flags.DEFINE_integer("run_timed", 50, "Event-timed calls per kernel on the GPU (median).")


def check(name, cluster, reference, rtol, atol, rows, archs, rng, gpu=None, gpu_rows=None):
    """One table row; `reference` is a Pattern, or None to compare with the CPU kernel."""
    row = {"name": name, "arch": {}, "error": 0.0, "ok": True}
    try:
        plan = plan_gpu(build_schedule(cluster), gpu, gpu_rows)
    except UnsupportedCluster as exc:  # stays TensorFlow ops on the GPU: not a failure
        row.update(mapping="-", note=f"not fused for CUDA: {exc}")
        return row
    row["mapping"] = gpu_choice.describe(plan)
    row["threads"] = plan.mapping.block_threads
    try:
        _, builds = gpu_build.compile_cuda(cluster, archs, gpu=gpu)
        row["arch"] = {a: b.resources for a, b in builds.items()}
    except nvrtc.NvrtcUnavailable as exc:
        row["note"] = str(exc)
    if gpu is not None:
        row["predicted"] = predicted_latency(plan, gpu, gpu_rows, row["arch"])
    emulated = CpuKernel(gpu_build.build_emulation(cluster, gpu=gpu, plan=plan))
    if reference is None:
        cpu = build_cpu_kernel(cluster).runner()
        row["error"], row["ok"] = agrees_with_cpu(emulated, cpu, cluster, rows, rng, rtol, atol)
        return row
    for n in rows:
        inputs = reference.make_inputs(rng, n)
        got = emulated.run(inputs, threads=2, forward=True)
        err, good = compare_outputs(got, reference.reference(inputs), rtol, atol)
        row["error"], row["ok"] = max(row["error"], err), row["ok"] and good
    return row


def run_on_gpu(row, cluster, reference, rtol, atol, device, jax, rng) -> None:
    """Adds the GPU columns to `row`: the kernel of the plan chosen for this
    device on --run_rows rows, checked, event-timed, and against JAX."""
    import cupy as cp
    rows = FLAGS.run_rows
    if reference is not None:
        inputs = reference.make_inputs(rng, rows)
        wanted = reference.reference(inputs)
    else:
        inputs = patterns.random_inputs(cluster, rows, rng)
        wanted = build_cpu_kernel(cluster).runner().run(inputs)
    schedule = build_schedule(cluster)
    plan = plan_gpu(schedule, gpu_build.device_gpu(), _schedule_rows(schedule, cluster, inputs))
    row["gpu_mapping"] = gpu_choice.describe(plan)
    kernel = gpu_build.load_cuda(cluster, plan=plan)
    on_device = [cp.asarray(a.view(np.uint16) if a.dtype.name == "bfloat16" else a)
                 for a in inputs]
    bound = BoundKernel(kernel, on_device)
    moved = sum(a.nbytes for a in inputs) + sum(o.nbytes for o in bound.outputs)
    sets = [bound] + [BoundKernel(kernel, [a.copy() for a in on_device])
                      for _ in range(input_sets(moved, device.l2_bytes) - 1)]
    ms, _, _ = device.event_times(sets, FLAGS.run_timed, 5)
    got = [_host(o, d) for o, d in zip(bound.outputs, _out_dtypes(cluster))]
    err, ok = compare_outputs(got, wanted, rtol, atol, normwise=reference is None)
    row.update(gpu_us=ms * 1e3, gpu_gbps=moved / (ms * 1e-3) / 1e9, gpu_error=err, gpu_ok=ok)
    row["ok"] = row["ok"] and ok
    if jax is None:
        return
    fn = jax.jit(array_interpreter.interpret(cluster, jax.numpy))
    jax_sets = [[jax.device_put(a) for a in inputs] for _ in range(len(sets))]
    jax_err, jax_ok = compare_outputs([np.asarray(o) for o in fn(*jax_sets[0])], wanted, rtol, atol,
                               normwise=reference is None)
    calls, batches = 50, 9
    ours = wall_per_call(lambda i: sets[i % len(sets)](),
                         lambda _: cp.cuda.Device().synchronize(), calls, batches)
    theirs = wall_per_call(lambda i: fn(*jax_sets[i % len(jax_sets)]),
                           jax.block_until_ready, calls, batches)
    row.update(jax_error=jax_err, jax_ok=jax_ok, ours_call_us=ours * 1e3,
               jax_call_us=theirs * 1e3, speedup=theirs / ours)


def _schedule_rows(schedule, cluster, inputs) -> int:
    """Rows as the schedule counts them (all but its column axes) for these
    inputs: N*H*W for an NHWC batchnorm whose inputs have batch N."""
    extent = {}
    for (name, _), a in zip(cluster.inputs, inputs):
        for axis, n in zip(schedule.dim_axes[name], a.shape):
            if axis is not None:
                extent[axis] = n
    return math.prod(extent.get(a, 1) for a in range(schedule.num_axes)
                     if a not in schedule.col_axes)


def _out_dtypes(cluster) -> list:
    types = cluster.types()
    return [types[o].dtype for o in cluster.outputs]


def _host(array, dtype: str) -> np.ndarray:
    """A device output as NumPy; bfloat16 comes back as its uint16 bits."""
    out = array.get()
    return out.view(as_dtype("bfloat16")) if dtype == "bfloat16" else out


def gpu_session(mode: str) -> tuple:
    """(timing Device or None, jax or None, notes) for --on_gpu."""
    if mode == "no":
        return None, None, []
    try:
        import cupy as cp
        count = cp.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no CuPy, no driver
        count, why = 0, f"{type(exc).__name__}: {exc}"
    else:
        why = "CuPy sees no CUDA device"
    if count == 0:
        if mode == "yes":
            sys.exit(f"cuda_check: --on_gpu=yes but no GPU is usable ({why})")
        return None, None, []
    device = Device(cp)
    notes = [f"on {device.name} ({device.arch}): plans chosen for "
             f"{gpu_build.device_gpu() or 'the thresholds'}, {FLAGS.run_rows} rows"]
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # share the GPU with CuPy
    try:
        import jax
        if jax.devices()[0].platform != "gpu":
            raise RuntimeError(f"JAX runs on {jax.devices()[0].platform}, not the GPU")
    except Exception as exc:  # ImportError, or a backend that does not start
        jax = None
        notes.append(f"JAX columns skipped ({type(exc).__name__}: {exc})")
    return device, jax, notes


def predicted_latency(plan, gpu, rows, resources) -> tuple:
    """(seconds, registers' source) on `gpu` for `rows` rows (None: as chosen)."""
    spec = gpu_cost.spec(gpu)
    n_rows, cols = gpu_choice.extents(plan.schedule, rows)
    counted = resources.get(spec.arch)
    regs = counted.registers if counted is not None else None
    e = gpu_cost.estimate(plan, spec, n_rows, cols, registers=regs)
    return e.latency_s, "ptxas" if counted is not None else "est."


def print_table(rows, archs, gpu=None):
    head = f"{'kernel':28} {'mapping':16}"
    for a in archs:
        head += f" {a + ' regs':>12} {'smem':>6} {'spill st/ld':>11} {'occ':>5}"
    if gpu is not None:
        head += f" {gpu + ' us':>14}"
    head += f" {'max error':>10}  ok"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = f"{r['name']:28} {r['mapping']:16}"
        for a in archs:
            res = r["arch"].get(a)
            if res is None:
                line += f" {'-':>12} {'-':>6} {'-':>11} {'-':>5}"
            else:
                occ = occupancy(a, r["threads"], res.registers, res.shared_bytes) \
                    if a in SM_LIMITS else float("nan")
                line += (f" {res.registers:>12} {res.shared_bytes:>6} "
                         f"{f'{res.spill_stores}/{res.spill_loads}':>11} {occ:>5.0%}")
        if gpu is not None:
            seconds, source = r.get("predicted", (float("nan"), "-"))
            line += f" {f'{seconds * 1e6:.1f} ({source})':>14}"
        line += f" {r['error']:>10.2e}  {'yes' if r['ok'] else 'NO'}"
        print(line)
    if gpu is not None:
        n = FLAGS.gpu_rows or gpu_choice.ASSUMED_ROWS
        print(f"{gpu} us: predicted latency (gpu/cost.py) for {n} rows where the row count "
              "is not static; registers from ptxas where its architecture was compiled")
    for r in rows:
        if r.get("note"):
            print(f"{r['name']}: {r['note']}")


def print_gpu_table(rows, notes) -> None:
    head = (f"{'kernel':28} {'mapping':16} {'us':>9} {'GB/s':>6} {'error':>9} {'ok':>3} "
            f"{'ours/call us':>12} {'JAX/call us':>11} {'speed-up':>8} {'JAX err':>9}")
    print()
    print(head)
    print("-" * len(head))
    f = lambda r, k, fmt: format(r[k], fmt) if k in r else "-"  # noqa: E731
    for r in rows:
        if "gpu_ok" not in r:
            continue
        print(f"{r['name']:28} {r.get('gpu_mapping', '-'):16} {f(r, 'gpu_us', '.1f'):>9} "
              f"{f(r, 'gpu_gbps', '.0f'):>6} {f(r, 'gpu_error', '.1e'):>9} "
              f"{'yes' if r['gpu_ok'] else 'NO':>3} {f(r, 'ours_call_us', '.1f'):>12} "
              f"{f(r, 'jax_call_us', '.1f'):>11} {f(r, 'speedup', '.2f'):>8} "
              f"{f(r, 'jax_error', '.1e'):>9}")
    for n in notes + ["us: CUDA events, median, inputs rotated past the L2; GB/s: inputs "
                      "read once + outputs written once", "ours/call, JAX/call: host clock "
                      "over back-to-back calls then a sync; speed-up = JAX / ours"]:
        print(f"note: {n}")


def main(argv):
    del argv
    archs = FLAGS.arch
    rows_values = [int(r) for r in FLAGS.rows]
    rng = np.random.default_rng(FLAGS.seed)
    if nvrtc.ptxas_path() is None:
        print("note: ptxas not on PATH; registers and spills are not reported")
    device, jax, gpu_notes = gpu_session(FLAGS.on_gpu)
    work = []
    if FLAGS.patterns:
        work += [(name, p.cluster, p, p.rtol, p.atol)
                 for name, p in patterns.standard_patterns().items()]
    for path in FLAGS.clusters:
        cluster = ir.Cluster.from_json(pathlib.Path(path).read_text())
        stem = pathlib.Path(path).stem
        parts = ir.connected_parts(cluster)
        if len(parts) > 1:  # a packed CPU kernel: each part is a CUDA kernel of its own
            try:
                parts, _ = pack.schedulable_parts(cluster, parts)
            except UnsupportedCluster:
                pass  # check() reports the parts it cannot schedule
            work += [(f"{stem}.part{i}", p.cluster, None, FLAGS.rtol, FLAGS.atol)
                     for i, p in enumerate(parts) if p.cluster.outputs]
        else:
            work.append((stem, cluster, None, FLAGS.rtol, FLAGS.atol))
    results = []
    for name, cluster, reference, rtol, atol in work:
        row = check(name, cluster, reference, rtol, atol, rows_values, archs, rng,
                    FLAGS.gpu, FLAGS.gpu_rows)
        if device is not None and row["mapping"] != "-":
            try:
                run_on_gpu(row, cluster, reference, rtol, atol, device, jax, rng)
            except Exception as exc:  # a kernel that fails there fails the check
                row.update(gpu_ok=False, ok=False,
                           note=f"on the GPU: {type(exc).__name__}: {str(exc)[:300]}")
            device.cp.get_default_memory_pool().free_all_blocks()
        results.append(row)
    print_table(results, archs, FLAGS.gpu)
    if device is not None:
        print_gpu_table(results, gpu_notes)
    spilled = {r["name"] for r in results for res in r["arch"].values()
               if res is not None and (res.spill_stores or res.spill_loads)}
    spills = bool(spilled)
    failed = not all(r["ok"] for r in results)
    fused = [r for r in results if r["mapping"] != "-"]
    compiled = sum(1 for r in fused if r["arch"] and all(v is not None for v in r["arch"].values()))
    bad = sum(1 for r in results if not r["ok"] or r["name"] in spilled)
    print(f"cuda_check: {len(fused)} kernels, {compiled} compiled, {len(fused)} checked, "
          f"{bad} failed")
    if spills or failed:
        print("FAILED: " + ", ".join(w for w, bad in (("spills", spills),
                                                      ("errors beyond tolerance", failed)) if bad))
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
