"""Check CUDA kernels without a GPU: compile, assemble, emulate, compare.

For the standard patterns (tf_fusionstitch/patterns.py) and any fusion-spec
JSON files given with --clusters, this generates the CUDA kernel, compiles
it with NVRTC for each --arch, reads ptxas' registers, shared memory and
spills (and the occupancy they allow), runs the C++ emulation of the CUDA schedule and prints the largest
error: against NumPy for the patterns, against the CPU kernel for spec
files (random inputs; every dynamic dimension takes each --rows value).
Exits with status 1 when a kernel spills or an error exceeds its tolerance.

  python -m tf_fusionstitch.tools.cuda_check --arch=sm_80,sm_90
  python -m tf_fusionstitch.tools.cuda_check --clusters=spec.json --nopatterns
"""

import pathlib
import sys

from absl import app
from absl import flags
import numpy as np

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch import gpu_kernels, patterns
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


def check(name, cluster, reference, rtol, atol, rows, archs, rng):
    """One table row; `reference` is a Pattern, or None to compare with the CPU kernel."""
    row = {"name": name, "arch": {}, "error": 0.0, "ok": True}
    try:
        plan = plan_gpu(build_schedule(cluster))
    except UnsupportedCluster as exc:  # stays TensorFlow ops on the GPU: not a failure
        row.update(mapping="-", note=f"not fused for CUDA: {exc}")
        return row
    m = plan.mapping
    row["mapping"] = {"thread": f"thread x{m.rows_per_block}", "warp": f"warp x{m.rows_per_block}",
                      "block": f"block {m.block_threads}"}[m.kind]
    row["threads"] = m.block_threads
    try:
        _, builds = gpu_kernels.compile_cuda(cluster, archs)
        row["arch"] = {a: b.resources for a, b in builds.items()}
    except nvrtc.NvrtcUnavailable as exc:
        row["note"] = str(exc)
    emulated = CpuKernel(gpu_kernels.build_emulation(cluster))
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


def print_table(rows, archs):
    head = f"{'kernel':28} {'mapping':12}"
    for a in archs:
        head += f" {a + ' regs':>12} {'smem':>6} {'spill st/ld':>11} {'occ':>5}"
    head += f" {'max error':>10}  ok"
    print(head)
    print("-" * len(head))
    for r in rows:
        line = f"{r['name']:28} {r['mapping']:12}"
        for a in archs:
            res = r["arch"].get(a)
            if res is None:
                line += f" {'-':>12} {'-':>6} {'-':>11} {'-':>5}"
            else:
                occ = occupancy(a, r["threads"], res.registers, res.shared_bytes) \
                    if a in SM_LIMITS else float("nan")
                line += (f" {res.registers:>12} {res.shared_bytes:>6} "
                         f"{f'{res.spill_stores}/{res.spill_loads}':>11} {occ:>5.0%}")
        line += f" {r['error']:>10.2e}  {'yes' if r['ok'] else 'NO'}"
        print(line)
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
            results.append(check(name, p.cluster, p, p.rtol, p.atol, rows_values, archs, rng))
    for path in FLAGS.clusters:
        cluster = ir.Cluster.from_json(pathlib.Path(path).read_text())
        results.append(check(pathlib.Path(path).stem, cluster, None, FLAGS.rtol, FLAGS.atol,
                             rows_values, archs, rng))
    print_table(results, archs)
    spills = any(res is not None and (res.spill_stores or res.spill_loads)
                 for r in results for res in r["arch"].values())
    failed = not all(r["ok"] for r in results)
    if spills or failed:
        print("FAILED: " + ", ".join(w for w, bad in (("spills", spills),
                                                      ("errors beyond tolerance", failed)) if bad))
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
