"""Standard patterns on a GPU: bandwidth against copy, speed against JAX/XLA (TF-free).

One call that, on a machine with a GPU, reports for each standard pattern at
the large sizes of docs/DESIGN.md, "Reference patterns" (and a larger softmax):

- the device's copy bandwidth: a cudaMemcpy device-to-device copy and a
  float4 read+write kernel of a 1 GiB buffer, timed with CUDA events; the
  faster is the ceiling ("copy GB/s"), bytes read + bytes written;
- our CUDA kernel, with the plan the latency evaluator chooses for this GPU
  and row count (gpu/choice.py; the thresholds' plan where gpu_cost.GPUS
  does not know the device), compiled by NVRTC for the device's
  architecture, run on fresh random inputs and checked against the
  pattern's NumPy reference within its tolerance, through the project's
  launcher (CudaKernel.run) and through the timed launches;
- its kernel time: CUDA events around each call, median of --n_timed, with
  the inputs rotated among enough copies that each call misses the L2 and a
  spin kernel queued first so the host enqueues ahead of the GPU (launch
  gaps stay out of the numbers); bytes = inputs read once + outputs written
  once; GB/s and % of the copy bandwidth;
- the same computation in JAX (jax.jit, float32), checked against the same
  reference; XLA's several kernels cannot be timed with our events (its
  stream is its own), so both sides are also timed alike: the host clock
  over --wall_calls back-to-back calls (rotated inputs), then
  block_until_ready / synchronize, median of --wall_batches batches.
  speed-up = JAX per call / ours per call; each side's dispatch is included
  and overlaps the previous call's GPU work.

Exits 1 when any kernel fails its check (or fails to build); JAX columns read
"-" with a note when JAX is missing. --compile_only needs no GPU: every
kernel is built for --arch with the plan chosen for --gpu, its host shape
function compiled and checked, and the C++ emulation of its CUDA schedule
(gpu_build.build_emulation) run against the reference on a few rows; the
JAX functions are checked on the CPU when JAX is installed.

  python benchmarks/gpu_patterns.py --out=$OUT/gpu_patterns.md   # on a GPU
  python benchmarks/gpu_patterns.py --compile_only --quick          # anywhere

Runtime on an H200 (measured 2026-11-29): about 35 s, 100 s with --sweep;
JAX's import and the float64 NumPy references are most of it. Output is
written under $OUT.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import sys
import time
import traceback
from typing import Optional, Sequence

# Run as a file (python benchmarks/gpu_patterns.py) from a copy of the tree
# where the package is not installed: the repository root must be importable.
_ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from tf_fusionstitch import patterns  # noqa: E402
from tf_fusionstitch.codegen.generate import generate_cuda  # noqa: E402
from tf_fusionstitch.codegen.gpu_printer import KERNEL_NAME, NVRTC_OPTIONS  # noqa: E402
from tf_fusionstitch.gpu import build as gpu_build, choice as gpu_choice, cost as gpu_cost  # noqa: E402
from tf_fusionstitch.gpu.choice import plan_gpu  # noqa: E402
from tf_fusionstitch.gpu.mapping import static_cols  # noqa: E402
from tf_fusionstitch.runtime import nvrtc  # noqa: E402
from tf_fusionstitch.runtime.cpu_kernel import CpuKernel  # noqa: E402
from tf_fusionstitch.runtime.cuda_timing import (BoundKernel, Device, HELPERS,  # noqa: E402
                                                  input_sets, wall_per_call)
from tf_fusionstitch.schedule import build_schedule  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_bool("compile_only", False,
                  "No GPU: build every kernel for --arch, check the emulation and host side.")
flags.DEFINE_bool("quick", False, "Small sizes (a smoke test of the plumbing).")
flags.DEFINE_string("arch", "sm_90", "Architecture for --compile_only (on a GPU: the device's).")
flags.DEFINE_enum("gpu", None, sorted(gpu_cost.GPUS),
                  "GPU the plans are chosen for (default: the device's; H200 with "
                  "--compile_only).")
flags.DEFINE_string("out", None, "Markdown table path (JSON beside it, .json); default "
                    "$OUT/gpu_patterns.md where $OUT is set.")
flags.DEFINE_list("patterns", [], "Run only these cases (names as in the table).")
flags.DEFINE_integer("n_timed", 100, "Event-timed calls per kernel (median).")
flags.DEFINE_integer("n_warmup", 10, "Untimed calls before timing.")
flags.DEFINE_integer("wall_calls", 50, "Back-to-back calls per host-clock batch.")
flags.DEFINE_integer("wall_batches", 15, "Host-clock batches (median).")
flags.DEFINE_integer("seed", 0, "Seed of the random inputs.")
flags.DEFINE_bool("sweep", False, "Also time every candidate plan of each case (checked "
                  "against the reference) beside its predicted latency: the latency "
                  "evaluator's calibration data, written to gpu_sweep.md/.json.")
flags.DEFINE_integer("sweep_timed", 30, "Event-timed calls per candidate plan in --sweep.")

EMULATED_ELEMENTS = 1 << 18   # --compile_only: rows emulated on the CPU, about this many elements


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    pattern: patterns.Pattern
    dims: tuple          # the logical shape reported (rows = all but the last dim(s))
    quick_dims: tuple
    jax_fn: str          # key of jax_functions()
    row_dims: int = -1   # dims before this index make the rows (bn: the batch only)

    def rows(self, quick: bool) -> int:
        return math.prod((self.quick_dims if quick else self.dims)[:self.row_dims])

    def plan_rows(self, quick: bool) -> int:
        """Rows as the schedule sees them (all but its column axes): the
        count the latency evaluator chooses the plan for. For NHWC batchnorm
        that is N*H*W rows of C, not the N of make_inputs."""
        dims = self.quick_dims if quick else self.dims
        cols = static_cols(build_schedule(self.pattern.cluster))
        return math.prod(dims) // cols if cols else self.rows(quick)

    def shape(self, quick: bool) -> str:
        return "x".join(map(str, self.quick_dims if quick else self.dims))


def cases() -> list:
    """The sizes of docs/DESIGN.md, "Reference patterns", plus a longer softmax."""
    return [
        Case("layernorm", patterns.layernorm(1024), (16384, 1024), (512, 1024), "layernorm"),
        Case("softmax", patterns.softmax(128), (96, 128, 128), (4, 128, 128), "softmax"),
        Case("softmax_1024", patterns.softmax(1024), (16384, 1024), (512, 1024), "softmax"),
        Case("bias_gelu_erf", patterns.bias_gelu(3072, approximate=False), (4096, 3072),
             (256, 3072), "gelu_erf"),
        Case("bias_gelu_tanh", patterns.bias_gelu(3072, approximate=True), (4096, 3072),
             (256, 3072), "gelu_tanh"),
        Case("residual_layernorm", patterns.residual_layernorm(768), (16384, 768), (512, 768),
             "residual_layernorm"),
        Case("bn_inference_relu", patterns.bn_inference_relu(64, hw=56), (32, 56, 56, 64),
             (2, 56, 56, 64), "bn_relu", row_dims=1),
    ]


def jax_functions(jax) -> dict:
    """Each case's computation in JAX, float32, returning the cluster's outputs."""
    jnp, lax = jax.numpy, jax.lax

    def layernorm(x, g, b):
        mu = jnp.mean(x, axis=1, keepdims=True)
        d = x - mu
        var = jnp.mean(d * d, axis=1, keepdims=True)
        return d * lax.rsqrt(var + 1e-5) * g + b, mu

    def residual_layernorm(x, res, g, b):
        h = x + res
        return layernorm(h, g, b)[0], h

    def bn_relu(x, scale, offset, mean, var):
        f = scale * lax.rsqrt(var + 1e-3)
        return (jnp.maximum(x * f + (offset - mean * f), 0),)

    return {"layernorm": layernorm, "residual_layernorm": residual_layernorm,
            "softmax": lambda x: (jax.nn.softmax(x, axis=-1),),
            "gelu_erf": lambda a, bias: (jax.nn.gelu(a + bias, approximate=False),),
            "gelu_tanh": lambda a, bias: (jax.nn.gelu(a + bias, approximate=True),),
            "bn_relu": bn_relu}


def import_jax(cpu_only: bool):
    """(jax, None) or (None, why not)."""
    # Let CuPy and XLA share the device: XLA would otherwise take 75% of it up front.
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    if cpu_only:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    try:
        import jax
        jax.devices()  # fails here, not mid-table, when no backend initialises
        return jax, None
    except Exception as exc:  # ImportError, or a backend that does not start
        return None, f"JAX unavailable ({type(exc).__name__}: {exc}); JAX columns skipped"


def check_outputs(got: Sequence, want: Sequence, pattern: patterns.Pattern) -> tuple:
    """(largest error over all outputs, all within the pattern's tolerance)."""
    err, ok = 0.0, len(got) == len(want)
    for g, w in zip(got, want):
        e, good = patterns.max_error(np.asarray(g), w, pattern.rtol, pattern.atol)
        err, ok = max(err, e), ok and good
    return err, ok


def nbytes(arrays) -> int:
    return sum(int(a.nbytes) for a in arrays)


# ---------------------------------------------------------------------------
# Without a GPU


def compile_only_row(case: Case, gpu: str, arch: str, quick: bool, jax, rng) -> dict:
    rows = case.rows(quick)
    plan = plan_gpu(build_schedule(case.pattern.cluster), gpu, case.plan_rows(quick))
    row = {"name": case.name, "shape": case.shape(quick), "rows": rows,
           "mapping": gpu_choice.describe(plan)}
    generated = generate_cuda(case.pattern.cluster, plan=plan)
    t0 = time.perf_counter()
    nvrtc.compile_cubin(generated.source, arch, NVRTC_OPTIONS)
    row["compile_s"] = time.perf_counter() - t0
    row.update(ptxas_report(generated.source, arch))
    # The emulation runs every block of the grid on the CPU: a few rows check
    # the index math and the partial last block; the size does not change the code.
    per_row = math.prod(case.dims[case.row_dims:])
    n = min(rows, max(3, EMULATED_ELEMENTS // per_row))
    n -= 1 if n > 1 and n % 2 == 0 else 0
    inputs = case.pattern.make_inputs(rng, n)
    want = case.pattern.reference(inputs)
    host = gpu_build.host_shape(generated)
    out_shapes, _, _ = host([a.shape for a in inputs])
    if [tuple(s) for s in out_shapes] != [w.shape for w in want]:
        raise AssertionError(f"host shape function gives {out_shapes}, the reference "
                             f"{[w.shape for w in want]}")
    emulated = CpuKernel(gpu_build.build_emulation(case.pattern.cluster, gpu=gpu, plan=plan))
    row["emulated_rows"] = n
    row["error"], row["ok"] = check_outputs(emulated.run(inputs, threads=2), want, case.pattern)
    if jax is not None:
        fn = jax.jit(jax_functions(jax)[case.jax_fn])
        row["jax_error"], row["jax_ok"] = check_outputs(
            [np.asarray(o) for o in fn(*inputs)], want, case.pattern)
    return row


def ptxas_report(source: str, arch: str) -> dict:
    """Registers, shared memory and spills where ptxas is installed."""
    if nvrtc.ptxas_path() is None:
        return {}
    ptx = nvrtc.compile_ptx(source, arch, NVRTC_OPTIONS)
    (res,) = [r for r in nvrtc.ptxas_resources(ptx, arch) if r.kernel == KERNEL_NAME]
    return {"registers": res.registers, "smem": res.shared_bytes,
            "spills": res.spill_stores + res.spill_loads}


# ---------------------------------------------------------------------------
# On a GPU

def gpu_row(case: Case, device: Device, gpu: Optional[str], jax, rng) -> dict:
    import cupy as cp
    quick = FLAGS.quick
    rows = case.rows(quick)
    schedule = build_schedule(case.pattern.cluster)
    plan = plan_gpu(schedule, gpu, case.plan_rows(quick))
    row = {"name": case.name, "shape": case.shape(quick), "rows": rows,
           "mapping": gpu_choice.describe(plan)}
    generated = generate_cuda(case.pattern.cluster, plan=plan)
    if gpu is not None:
        n_rows, cols = gpu_choice.extents(schedule, case.plan_rows(quick))
        row["predicted_ms"] = gpu_cost.estimate(plan, gpu, n_rows, cols).latency_s * 1e3
    try:
        row.update(ptxas_report(generated.source, device.arch))
    except Exception as exc:  # resources are informative; the run does not need them
        row["note"] = f"ptxas: {exc}"
    kernel = gpu_build.load_cuda(case.pattern.cluster, plan=plan)

    inputs = case.pattern.make_inputs(rng, rows)
    want = case.pattern.reference(inputs)
    on_device = [cp.asarray(a) for a in inputs]
    err_launcher, ok_launcher = check_outputs([o.get() for o in kernel.run(on_device)], want,
                                              case.pattern)
    first = BoundKernel(kernel, on_device)
    moved = nbytes(inputs) + nbytes(first.outputs)
    n_sets = input_sets(moved, device.l2_bytes)
    bound = [first] + [BoundKernel(kernel, [a.copy() for a in on_device])
                       for _ in range(n_sets - 1)]
    ms, host_ms, spin_ms = device.event_times(bound, FLAGS.n_timed, FLAGS.n_warmup)
    # After timing: the outputs the timed launches wrote.
    err, ok = check_outputs([o.get() for o in first.outputs], want, case.pattern)
    row.update(ours_ms=ms, bytes=moved, input_sets=n_sets, gbps=moved / (ms * 1e-3) / 1e9,
               error=max(err, err_launcher), ok=ok and ok_launcher)
    if host_ms > spin_ms:
        row["note"] = (f"launch-bound: enqueueing took {host_ms:.1f} ms, longer than the "
                       f"{spin_ms:.1f} ms spin ahead of it; kernel times may include gaps")
    row["ours_call_ms"] = wall_per_call(lambda i: bound[i % n_sets](),
                                        lambda _: cp.cuda.Device().synchronize(),
                                        FLAGS.wall_calls, FLAGS.wall_batches)
    if jax is not None:
        try:
            row.update(jax_timing(jax, case, inputs, want, n_sets))
            row["speedup"] = row["jax_call_ms"] / row["ours_call_ms"]
        except Exception as exc:  # XLA's failure is not our kernel's: keep the row
            traceback.print_exc()
            row["note"] = (row.get("note", "") + f" JAX failed: {type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else ''}").strip()
    return row  # the caller frees the buffers' pool blocks


def sweep_rows(case: Case, device: Device, gpu: Optional[str], rng) -> list:
    """Every candidate plan of the case at its size: measured against predicted."""
    import cupy as cp
    rows = case.rows(FLAGS.quick)
    schedule = build_schedule(case.pattern.cluster)
    n_rows, cols = gpu_choice.extents(schedule, case.plan_rows(FLAGS.quick))
    chosen = gpu_choice.describe(plan_gpu(schedule, gpu, case.plan_rows(FLAGS.quick)))
    inputs = case.pattern.make_inputs(rng, rows)
    want = case.pattern.reference(inputs)
    sets = [[cp.asarray(a) for a in inputs]]
    out = []
    for plan in gpu_choice.candidate_plans(schedule):
        row = {"name": case.name, "mapping": gpu_choice.describe(plan)}
        row["chosen"] = row["mapping"] == chosen
        try:
            if gpu is not None:
                row["predicted_ms"] = gpu_cost.estimate(plan, gpu, n_rows, cols).latency_s * 1e3
            kernel = gpu_build.load_cuda(case.pattern.cluster, plan=plan)
            first = BoundKernel(kernel, sets[0])
            n_sets = input_sets(nbytes(inputs) + nbytes(first.outputs), device.l2_bytes)
            while len(sets) < n_sets:
                sets.append([a.copy() for a in sets[0]])
            bound = [first] + [BoundKernel(kernel, s) for s in sets[1:n_sets]]
            row["ms"], _, _ = device.event_times(bound, FLAGS.sweep_timed, 3)
            row["error"], row["ok"] = check_outputs([o.get() for o in first.outputs], want,
                                                    case.pattern)
            row["gbps"] = (nbytes(inputs) + nbytes(first.outputs)) / (row["ms"] * 1e-3) / 1e9
            del bound, first
        except Exception as exc:  # one candidate's failure is data too
            row.update(ok=False, note=f"{type(exc).__name__}: {str(exc)[:200]}")
        device.cp.get_default_memory_pool().free_all_blocks()
        out.append(row)
    best = min((r for r in out if r.get("ok")), key=lambda r: r["ms"], default=None)
    for r in out:
        r["best"] = best is not None and r is best
    return out


def write_sweep(rows: list, copy_gbps: Optional[float], preamble: str) -> None:
    head = ["pattern", "mapping", "chosen", "best", "ms", "GB/s", "% copy", "pred ms", "err", "ok"]
    body = [[r["name"], r["mapping"], "*" if r.get("chosen") else "", "*" if r.get("best") else "",
             _f(r.get("ms"), ".4f"), _f(r.get("gbps"), ".0f"),
             _f(100 * r["gbps"] / copy_gbps if r.get("gbps") and copy_gbps else None, ".1f"),
             _f(r.get("predicted_ms"), ".4f"), _f(r.get("error"), ".1e"),
             "yes" if r.get("ok") else "NO " + r.get("note", "")] for r in rows]
    print()
    print_table(head, body)
    path = out_path()
    if path is not None:
        sweep = path.with_name("gpu_sweep.md")
        sweep.write_text(markdown(head, body, [preamble, "--sweep: every candidate plan"], []))
        sweep.with_suffix(".json").write_text(json.dumps(rows, indent=1, default=str))


def jax_timing(jax, case: Case, inputs, want, n_sets: int) -> dict:
    """JAX's error against the reference and its host-clock ms per call."""
    fn = jax.jit(jax_functions(jax)[case.jax_fn])
    sets = [[jax.device_put(a) for a in inputs] for _ in range(n_sets)]
    err, ok = check_outputs([np.asarray(o) for o in fn(*sets[0])], want, case.pattern)
    ms = wall_per_call(lambda i: fn(*sets[i % n_sets]), jax.block_until_ready,
                       FLAGS.wall_calls, FLAGS.wall_batches)
    return {"jax_error": err, "jax_ok": ok, "jax_call_ms": ms}


# ---------------------------------------------------------------------------
# Tables


def _f(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(rows: list, compile_only: bool, copy_gbps: Optional[float]) -> tuple:
    """(header, lines): one line per case."""
    if compile_only:
        head = ["pattern", "shape", "mapping", "regs", "smem", "spills", "compile s",
                "emulated rows", "max err", "JAX(cpu) err", "ok"]
        body = [[r["name"], r["shape"], r.get("mapping", "-"), _f(r.get("registers"), "d"),
                 _f(r.get("smem"), "d"), _f(r.get("spills"), "d"), _f(r.get("compile_s"), ".2f"),
                 _f(r.get("emulated_rows"), "d"), _f(r.get("error"), ".1e"),
                 _f(r.get("jax_error"), ".1e"), "yes" if r.get("ok") else "NO"]
                for r in rows]
    else:
        head = ["pattern", "shape", "mapping", "ours ms", "GB/s", "% copy", "pred ms",
                "ours/call ms", "JAX/call ms", "speed-up", "max err", "JAX err", "ok"]
        body = []
        for r in rows:
            pct = None if r.get("gbps") is None or not copy_gbps else 100 * r["gbps"] / copy_gbps
            body.append([r["name"], r["shape"], r.get("mapping", "-"),
                         _f(r.get("ours_ms"), ".4f"), _f(r.get("gbps"), ".0f"), _f(pct, ".1f"),
                         _f(r.get("predicted_ms"), ".4f"), _f(r.get("ours_call_ms"), ".4f"),
                         _f(r.get("jax_call_ms"), ".4f"), _f(r.get("speedup"), ".2f"),
                         _f(r.get("error"), ".1e"), _f(r.get("jax_error"), ".1e"),
                         "yes" if r.get("ok") else "NO"])
    return head, body


def print_table(head, body) -> None:
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h)
              for i, h in enumerate(head)]
    line = lambda cells: "  ".join(c.ljust(w) if i < 3 else c.rjust(w)  # noqa: E731
                                   for i, (c, w) in enumerate(zip(cells, widths)))
    print(line(head))
    print("-" * len(line(head)))
    for b in body:
        print(line(b))


def markdown(head, body, preamble: Sequence[str], notes: Sequence[str]) -> str:
    out = list(preamble) + ["", "| " + " | ".join(head) + " |",
                            "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(b) + " |" for b in body]
    return "\n".join(out + [""] + [f"- {n}" for n in notes]) + "\n"


def out_path() -> Optional[pathlib.Path]:
    if FLAGS.out:
        return pathlib.Path(FLAGS.out)
    if os.environ.get("OUT"):
        return pathlib.Path(os.environ["OUT"]) / "gpu_patterns.md"
    return None


def main(argv):
    del argv
    if nvrtc.nvrtc_version() is None:
        sys.exit("gpu_patterns: NVRTC cannot be loaded: pip install cupy-cuda12x "
                 "nvidia-cuda-nvrtc-cu12 (or the cupy/NVRTC wheels of your CUDA)")
    selected = [c for c in cases() if not FLAGS.patterns or c.name in FLAGS.patterns]
    unknown = set(FLAGS.patterns) - {c.name for c in cases()}
    if unknown:
        sys.exit(f"gpu_patterns: unknown --patterns {sorted(unknown)}; known: "
                 f"{', '.join(c.name for c in cases())}")
    rng = np.random.default_rng(FLAGS.seed)
    notes, meta = [], {"quick": FLAGS.quick, "compile_only": FLAGS.compile_only}
    copy_gbps, device = None, None
    if FLAGS.compile_only:
        gpu, arch = FLAGS.gpu or "H200", FLAGS.arch
        meta.update(gpu=gpu, arch=arch)
        nvrtc.compile_cubin(HELPERS, arch, NVRTC_OPTIONS)  # the copy and spin kernels
        preamble = [f"gpu_patterns --compile_only: plans chosen for {gpu}, compiled for {arch}, "
                    "emulated on the CPU against NumPy"]
    else:
        try:
            import cupy as cp
            count = cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # no CuPy, no driver
            sys.exit(f"gpu_patterns: no CUDA GPU visible to CuPy ({exc}); "
                     "run with --compile_only to check the kernels without one")
        if count == 0:
            sys.exit("gpu_patterns: no CUDA GPU visible to CuPy; run with --compile_only "
                     "to check the kernels without one")
        device = Device(cp)
        gpu = FLAGS.gpu or gpu_build.device_gpu()
        if gpu is None:
            notes.append(f"{device.name} is not in gpu_cost.GPUS: the thresholds' plans "
                         "(pass --gpu to choose for a known GPU)")
        copies = device.copy_bandwidth(max(10, FLAGS.n_timed // 5))
        cp.get_default_memory_pool().free_all_blocks()
        copy_gbps = max(copies.values())
        meta.update(device=device.name, arch=device.arch, gpu=gpu, l2_bytes=device.l2_bytes,
                    copy_gbps=copies, cupy=cp.__version__)
        preamble = [f"gpu_patterns on {device.name} ({device.arch}, plans for "
                    f"{gpu or 'thresholds'}): copy {copy_gbps:.0f} GB/s (memcpy {copies['memcpy']:.0f}, float4 kernel "
                    f"{copies['kernel']:.0f}; bytes read + written)"]
    jax, why = import_jax(cpu_only=FLAGS.compile_only)
    if jax is not None and not FLAGS.compile_only and jax.devices()[0].platform != "gpu":
        # JAX falls back to its CPU quietly when its CUDA plugin does not load.
        jax, why = None, (f"JAX {jax.__version__} has no GPU backend here (platform "
                          f"{jax.devices()[0].platform}; is jax[cuda] installed?); "
                          "JAX columns skipped")
    if why:
        notes.append(why)
    else:
        meta["jax"] = f"{jax.__version__} on {jax.devices()[0].platform}"

    rows = []
    for case in selected:
        try:
            if FLAGS.compile_only:
                row = compile_only_row(case, gpu, arch, FLAGS.quick, jax, rng)
            else:
                row = gpu_row(case, device, gpu, jax, rng)
        except Exception as exc:  # report it in the table, run the other cases
            traceback.print_exc()
            row = {"name": case.name, "shape": case.shape(FLAGS.quick), "ok": False,
                   "note": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        if device is not None:  # this case's buffers are garbage now
            device.cp.get_default_memory_pool().free_all_blocks()
        rows.append(row)
        print(f"[{time.strftime('%H:%M:%S')}] {case.name}: {'ok' if row['ok'] else 'FAILED'}",
              flush=True)

    if not FLAGS.compile_only:
        notes.append("ours ms: CUDA events around each call, median, inputs rotated past the "
                     "L2; GB/s and % copy from it (inputs read once + outputs written once)")
        notes.append("ours/call, JAX/call: host clock over back-to-back calls then a sync, "
                     "median of batches (dispatch included); speed-up = JAX/call / ours/call")
        notes.append("pred ms: the latency evaluator's estimate (gpu/cost.py) for the chosen plan")
    for r in rows:
        if r.get("note"):
            notes.append(f"{r['name']}: {r['note']}")
        if r.get("jax_ok") is False:
            notes.append(f"{r['name']}: JAX's result is outside the pattern's tolerance "
                         f"(max err {r['jax_error']:.1e})")
    failed = [r["name"] for r in rows if not r["ok"]]
    meta["tensorflow_imported"] = "tensorflow" in sys.modules

    head, body = table(rows, FLAGS.compile_only, copy_gbps)
    print()
    print(preamble[0])
    print_table(head, body)
    for n in notes:
        print(f"note: {n}")
    summary = f"gpu_patterns: {len(rows)} kernels, {len(rows) - len(failed)} ok, " \
              f"{len(failed)} failed"
    print(summary)
    path = out_path()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(markdown(head, body, preamble + [summary], notes))
        path.with_suffix(".json").write_text(json.dumps(
            {"meta": meta, "rows": rows, "notes": notes}, indent=1, default=str))
        print(f"wrote {path} and {path.with_suffix('.json')}")
    if FLAGS.sweep and device is not None:
        swept = []
        for case in selected:
            swept += sweep_rows(case, device, gpu, rng)
            print(f"[{time.strftime('%H:%M:%S')}] swept {case.name}", flush=True)
        write_sweep(swept, copy_gbps, preamble[0])
        failed += sorted({f"{r['name']} ({r['mapping']})" for r in swept if not r.get("ok")})
    if failed:
        print(f"FAILED: {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
