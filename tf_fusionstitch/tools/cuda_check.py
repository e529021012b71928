"""Check CUDA kernels without a GPU: compile, assemble, emulate, compare.

For the standard patterns (tf_fusionstitch/patterns.py) and any fusion-spec
JSON files given with --clusters, this generates the CUDA kernel, compiles
it with NVRTC for each --arch, reads ptxas' registers, shared memory and
spills (and the occupancy they allow), runs the C++ emulation of the CUDA schedule and prints the largest
error: against NumPy for the patterns, against the CPU kernel for spec
files (random inputs; every dynamic dimension takes each --rows value).
Exits with status 1 when a kernel spills or an error exceeds its tolerance.

With --gpu (V100, A100, H100, H200) each kernel is the plan the latency
evaluator chooses for that GPU (tf_fusionstitch/gpu_choice.py), and the
table adds its predicted latency for --gpu_rows rows (default: the static
row count, else gpu_choice.ASSUMED_ROWS), from ptxas' registers where the
GPU's architecture is among --arch, else from the evaluator's estimate.

  python -m tf_fusionstitch.tools.cuda_check --arch=sm_80,sm_90
  python -m tf_fusionstitch.tools.cuda_check --clusters=spec.json --nopatterns
  python -m tf_fusionstitch.tools.cuda_check --gpu=H100 --arch=sm_90
"""

import pathlib
import sys

from absl import app
from absl import flags
import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import gpu_choice, gpu_cost, gpu_kernels, patterns
from tf_fusionstitch.gpu_occupancy import SM_LIMITS, occupancy
from tf_fusionstitch.gpu_schedule import plan_gpu
from tf_fusionstitch.kernels import build_cpu_kernel
from tf_fusionstitch.runtime import nvrtc
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel
from tf_fusionstitch.schedule import UnsupportedCluster, build_schedule

FLAGS = flags.FLAGS
flags.DEFINE_list("arch", ["sm_80", "sm_90"], "Architectures to compile for.")
flags.DEFINE_list("clusters", [], "Fusion-spec JSON files (Cluster.to_json) to check too.")
flags.DEFINE_bool("patterns", True, "Check the standard patterns.")
flags.DEFINE_list("rows", ["0", "1", "13", "37"], "Extents of the dynamic dimensions.")
flags.DEFINE_float("rtol", 1e-4, "Relative tolerance against the CPU kernel (spec files).")
flags.DEFINE_float("atol", 1e-5, "Absolute tolerance against the CPU kernel (spec files).")
flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
flags.DEFINE_enum("gpu", None, sorted(gpu_cost.GPUS),
                  "Choose each plan with the latency evaluator for this GPU and print its "
                  "predicted latency.")
flags.DEFINE_integer("gpu_rows", None, "Rows the --gpu plans are chosen and predicted for.")


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
        _, builds = gpu_kernels.compile_cuda(cluster, archs, gpu=gpu)
        row["arch"] = {a: b.resources for a, b in builds.items()}
    except nvrtc.NvrtcUnavailable as exc:
        row["note"] = str(exc)
    if gpu is not None:
        row["predicted"] = predicted_latency(plan, gpu, gpu_rows, row["arch"])
    emulated = CpuKernel(gpu_kernels.build_emulation(cluster, gpu=gpu, plan=plan))
    cpu = None if reference is not None else CpuKernel(build_cpu_kernel(cluster).path)
    for n in rows:
        if reference is not None:
            inputs = reference.make_inputs(rng, n)
            wanted = reference.reference(inputs)
        else:
            inputs = patterns.random_inputs(cluster, n, rng)
            wanted = cpu.run(inputs)
        for got, want in zip(emulated.run(inputs, threads=2, forward=True), wanted):
            err, good = patterns.max_error(got, want, rtol, atol)
            row["error"], row["ok"] = max(row["error"], err), row["ok"] and good
    return row


def predicted_latency(plan, gpu, rows, resources) -> tuple:
    """(seconds, registers' source) on `gpu` for `rows` rows (None: as chosen)."""
    spec = gpu_cost.spec(gpu)
    n_rows, cols = gpu_choice._extents(plan.schedule, rows)
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
        print(f"{gpu} us: predicted latency (gpu_cost.py) for {n} rows where the row count "
              "is not static; registers from ptxas where its architecture was compiled")
    for r in rows:
        if r.get("note"):
            print(f"{r['name']}: {r['note']}")


def main(argv):
    del argv
    archs = FLAGS.arch
    rows_values = [int(r) for r in FLAGS.rows]
    rng = np.random.default_rng(FLAGS.seed)
    if nvrtc.ptxas_path() is None:
        print("note: ptxas not on PATH; registers and spills are not reported")
    results = []
    if FLAGS.patterns:
        for name, p in patterns.standard_patterns().items():
            results.append(check(name, p.cluster, p, p.rtol, p.atol, rows_values, archs, rng,
                                 FLAGS.gpu, FLAGS.gpu_rows))
    for path in FLAGS.clusters:
        cluster = ir.Cluster.from_json(pathlib.Path(path).read_text())
        results.append(check(pathlib.Path(path).stem, cluster, None, FLAGS.rtol, FLAGS.atol,
                             rows_values, archs, rng, FLAGS.gpu, FLAGS.gpu_rows))
    print_table(results, archs, FLAGS.gpu)
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
