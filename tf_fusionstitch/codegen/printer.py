"""One printer from kernel IR to source text; targets differ only in tables.

Targets are the `Target` tables `CPP` and `CUDA`: storage types, math
functions, how 16-bit floats load, store and round, streaming stores and the
GPU's sync points; the printers read them and test no target by name. The
CUDA kernel's structure (threads, barriers, shuffles) is printed by
codegen/gpu_printer.py through this printer's statements. Facts about
primitives and dtypes that the cost models share (compute dtypes, NaN flags,
accumulator types) are in codegen/primitives.py.

`print_kernel(kernel, CPP)` gives the C++ block function of docs/KERNEL_ABI.md:
each work item is a row; each column loop is a `#pragma omp simd` loop that GCC
vectorises (reductions through OpenMP reduction clauses, so no -ffast-math is
needed and NaN/Inf semantics stay those of TensorFlow). Sums of float32 and
16-bit floats add blocks of columns in float and the blocks' sums in double
(SUM_BLOCK).

Semantics of every primitive live in `_EXPR` (one row per primitive, a column
per operand class). They follow TensorFlow's CPU kernels, including its NaN
behaviour (checked by the op tests): Maximum/Minimum and max/min reductions
propagate NaN, Relu(-0) is -0, Sign(NaN) is NaN, Round is half-to-even, Elu
and Selu use exp(x) - 1 as TensorFlow does. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir as k
from tf_fusionstitch.codegen import primitives as p
from tf_fusionstitch.codegen.cuda_prelude import CUDA_PRELUDE
from tf_fusionstitch.codegen.vecmath import CPP_PRELUDE, FLOAT32_FUNCTIONS
from tf_fusionstitch.runtime import kernel_library
from tf_fusionstitch.schedule import ELEMENTWISE_TILE as TILE

# C type of each dtype a value computes in (primitives.COMPUTE_DTYPE), the
# same on every target; how 16-bit floats are stored is the target's.
_C_TYPE = {"float32": "float", "float64": "double", "int32": "int32_t", "int64": "int64_t",
           "bool": "bool"}
COMPUTE = {d: _C_TYPE[p.COMPUTE_DTYPE[d]] for d in ir.DTYPES}
# NaN flags (primitives.NAN_REDUCTIONS) and truth-value accumulators.
FLAG_TYPE = "int"


def operand_class(dtype: str) -> str:
    if dtype == "float64":
        return "f64"
    if dtype in ir.FLOAT_DTYPES:
        return "f32"
    return "int" if dtype in ir.INT_DTYPES else "bool"


# Float32 outputs of at least this many bytes per call are streamed by
# default (the prelude's fs_stream_min_bytes; fs_set_stream_min_bytes moves
# it). A kernel whose outputs are statically smaller has no streaming loop:
# it would never run, and it is a third of such a kernel's compile time.
STREAM_MIN_BYTES = 16 << 20


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    prelude: str
    export: str                 # prefix of an exported C function
    simd_pragma: str            # before a vectorisable column loop ({clauses} filled in)
    math: Dict[str, tuple]      # function -> (float32 name, float64 name)
    storage: Dict[str, str]     # dtype -> C type of a tensor's element
    # 16-bit floats (primitives.HALF_DTYPES), per dtype a template of {}:
    load_16bit: Dict[str, str]   # a stored element as float
    store_16bit: Dict[str, str]  # a float as the stored element
    round_16bit: Dict[str, str]  # a float rounded to the dtype, as float (a cast to it)
    limits: str = "std::numeric_limits"  # class template giving infinity(), quiet_NaN(), ...
    # Large float32 outputs are stored with streaming (non-temporal) stores
    # (the prelude's FS_STREAM_LANES, fs_stream_f32 and fs_stream_min_bytes).
    streaming_stores: bool = False
    # GPU targets only (codegen/gpu_printer.py):
    shared: str = ""            # prefix of a block's shared-memory array
    barrier: str = ""           # block-wide barrier statement
    shuffle_xor: str = ""       # warp exchange: {v} value, {off} lane mask
    unroll_pragma: str = ""     # before a loop of static trip count to unroll fully
    pointer_qualifier: str = ""  # after the * of a kernel's tensor parameter
    launch_bounds: str = ""     # before the kernel's name: {threads} per block
    thread_index: str = ""      # the thread's index in its block
    block_index: str = ""       # the block's index in the grid
    guard_exit: str = ""        # a thread leaves the kernel unless {cond}


CPP = Target(
    name="cpp",
    prelude=CPP_PRELUDE + r"""
// Selects through bit masks for floating types: GCC keeps FP exceptions without
// -ffast-math and will not if-convert `c ? a : b` on computed values, which
// leaves the loop scalar (see vecmath.py).
FS_INLINE float fs_select(bool c, float a, float b) { return fs__sel(c, a, b); }
FS_INLINE double fs_select(bool c, double a, double b) { return fs__sel64(c, a, b); }
template <typename T> FS_INLINE T fs_select(bool c, T a, T b) { return c ? a : b; }
FS_INLINE double fs_sigmoid(double x) { return 1.0 / (1.0 + __builtin_exp(-x)); }
// Softplus as TensorFlow computes it: thresholds at log(epsilon) + 2, and
// log1p(exp(x)) in between (log(exp(x) + 1) loses up to ~7% near the threshold).
FS_INLINE float fs_softplusf(float x) {
  const float th = -13.942385f, e = fs_expf(x);
  return fs_select(x > -th, x, fs_select(x < th, e, fs_log1pf(e)));
}
FS_INLINE double fs_softplus(double x) {
  const double th = -34.04365338911715, e = __builtin_exp(x);
  return fs_select(x > -th, x, fs_select(x < th, e, __builtin_log1p(e)));
}
// Streaming (non-temporal) stores of float32 outputs: a large output written
// through the cache is first read into it (write-allocate), a third memory
// pass that streaming stores skip. Lanes per store; 0 where there are none.
#if defined(__AVX512F__)
#define FS_STREAM_LANES 16
#elif defined(__AVX__)
#define FS_STREAM_LANES 8
#elif defined(__SSE__)
#define FS_STREAM_LANES 4
#else
#define FS_STREAM_LANES 0
#endif
#if FS_STREAM_LANES
typedef float fs_vf32 __attribute__((vector_size(FS_STREAM_LANES * 4)));
FS_INLINE void fs_stream_f32(float* p, fs_vf32 v) {
#if defined(__clang__)
  __builtin_nontemporal_store(v, reinterpret_cast<fs_vf32*>(p));
#elif FS_STREAM_LANES == 16
  __builtin_ia32_movntps512(p, v);
#elif FS_STREAM_LANES == 8
  __builtin_ia32_movntps256(p, v);
#else
  __builtin_ia32_movntps(p, v);
#endif
}
static inline bool fs_stream_aligned(const float* p) {
  return (reinterpret_cast<uintptr_t>(p) & (FS_STREAM_LANES * 4 - 1)) == 0;
}
#endif
// Outputs of at least this many bytes per call are streamed (they would not
// stay in cache for the next op anyway); fs_set_stream_min_bytes changes it.
static int64_t fs_stream_min_bytes = """ + str(STREAM_MIN_BYTES) + r""";
extern "C" __attribute__((visibility("default"))) void fs_set_stream_min_bytes(int64_t n) {
  fs_stream_min_bytes = n;
}
static inline int fs_fail(char* err, int64_t n, const char* msg) {
  if (n > 0) { std::strncpy(err, msg, (size_t)(n - 1)); err[n - 1] = 0; }
  return 1;
}
// "[d0, d1, ...]" of `rank` dimensions into `out` (truncated to `size`).
static void fs__dims_text(const int64_t* dims, int rank, char* out, size_t size) {
  size_t used = (size_t)std::snprintf(out, size, "[");
  for (int d = 0; d < rank && used < size; ++d)
    used += (size_t)std::snprintf(out + used, size - used, d ? ", %lld" : "%lld",
                                  (long long)dims[d]);
  if (used < size) std::snprintf(out + used, size - used, "]");
}
// The shape functions' one error, TF's "Incompatible shapes": input `number`
// (`name`) has dimensions `got` where `want` is required, for `reason`. One
// out-of-line copy per library rather than a formatted message per input of
// every kernel (shape functions with those were a sixth of the compile time).
static __attribute__((noinline, cold)) int fs_shape_mismatch(
    const int64_t* got, const int64_t* want, int rank, long long number, const char* name,
    const char* reason, char* err, int64_t errlen) {
  char got_text[256], want_text[256], msg[768];
  fs__dims_text(got, rank, got_text, sizeof got_text);
  fs__dims_text(want, rank, want_text, sizeof want_text);
  std::snprintf(msg, sizeof msg, "Incompatible shapes: FusionStitch input %lld (%s) has shape "
                "%s where %s is required (%s)", number, name, got_text, want_text, reason);
  return fs_fail(err, errlen, msg);
}
""",
    export='extern "C" __attribute__((visibility("default")))',
    simd_pragma="#pragma omp simd{clauses}",
    # GCC/Clang builtins rather than <cmath>: parsing <cmath> was 40% of a
    # kernel's compile time, and the builtins compile to the same code.
    # float32: vecmath.py's vectorisable functions where it has one.
    math={
        **{fn: (f32, f"__builtin_{fn}") for fn, f32 in FLOAT32_FUNCTIONS.items()
           if fn != "sigmoid"},
        "sigmoid": ("fs_sigmoidf", "fs_sigmoid"), "softplus": ("fs_softplusf", "fs_softplus"),
        **{fn: (f"__builtin_{fn}f", f"__builtin_{fn}")
           for fn in ("sin", "cos", "sqrt", "floor", "ceil", "pow", "fabs")},
        "round": ("__builtin_nearbyintf", "__builtin_nearbyint"),
    },
    # float16 is GCC's _Float16, whose conversions round to nearest even;
    # bfloat16 is its bits, converted by vecmath.py's helpers. A bool tensor
    # is read as bytes (TF's bool is one byte, 0 or 1): GCC 12 vectorises no
    # loop that loads C++ bools, and in an omp simd float reduction that kept
    # ESM-2's masked softmax scalar (9.5 ms a call; 3.3 ms read as bytes).
    storage={"float32": "float", "float64": "double", "float16": "_Float16",
             "bfloat16": "uint16_t", "int32": "int32_t", "int64": "int64_t",
             "bool": "uint8_t"},
    load_16bit={"float16": "static_cast<float>({})", "bfloat16": "fs_bf16_to_f32({})"},
    store_16bit={"float16": "static_cast<_Float16>({})", "bfloat16": "fs_f32_to_bf16({})"},
    round_16bit={"float16": "static_cast<float>(static_cast<_Float16>({}))",
                 "bfloat16": "fs_bf16_to_f32(fs_f32_to_bf16(static_cast<float>({})))"},
    streaming_stores=True,
)

# Accurate CUDA math functions only (no __expf-style intrinsics): their
# errors are within a few ulps, the tolerance the numerics contract allows.
CUDA = Target(
    name="cuda",
    prelude=CUDA_PRELUDE,
    export='extern "C" __global__',
    simd_pragma="",
    math={
        **{fn: (f"{fn}f", fn) for fn in ("exp", "log", "log1p", "expm1", "tanh", "erf",
                                         "erfc", "sin", "cos", "sqrt", "floor", "ceil",
                                         "pow", "fabs")},
        "sigmoid": ("fs_sigmoidf", "fs_sigmoid"), "softplus": ("fs_softplusf", "fs_softplus"),
        "round": ("rintf", "rint"),  # half to even, as TensorFlow's Round
    },
    # Device code has no _Float16: float16 is its bits too, converted by the
    # prelude's helpers (cuda_prelude.py); bfloat16 as on the C++ target.
    storage={**CPP.storage, "float16": "uint16_t", "bool": "bool"},
    load_16bit={**CPP.load_16bit, "float16": "fs_f16_to_f32({})"},
    store_16bit={**CPP.store_16bit, "float16": "fs_f32_to_f16({})"},
    round_16bit={**CPP.round_16bit,
                 "float16": "fs_f16_to_f32(fs_f32_to_f16(static_cast<float>({})))"},
    limits="fs_limits",
    shared="__shared__ ",
    barrier="__syncthreads();",
    shuffle_xor="__shfl_xor_sync(0xffffffffu, {v}, {off})",
    unroll_pragma="#pragma unroll",
    # Tensors never alias (CudaKernel allocates every output; nothing forwards
    # an input buffer on the GPU): read-only loads may then go through the
    # non-coherent cache and be reordered past the stores.
    pointer_qualifier="__restrict__ ",
    launch_bounds="__launch_bounds__({threads}) ",
    thread_index="threadIdx.x",
    block_index="blockIdx.x",
    guard_exit="if (!({cond})) return;",
)

# SELU constants as TensorFlow defines them.
_SELU_SCALE = 1.0507009873554804934193349852946
_SELU_SCALE_ALPHA = 1.0507009873554804934193349852946 * 1.6732632423543772848170429916717

# prim -> template. {0} {1} {2} are operands, {T} the compute type, {m:fn} a
# math function of the target for the operand class. Float rows serve f32/f64.
_EXPR = {
    "neg": "(-{0})",
    "abs": {"float": "{m:fabs}({0})", "int": "fs_select({0} < 0, ({T})-{0}, {0})"},
    "exp": "{m:exp}({0})", "log": "{m:log}({0})", "log1p": "{m:log1p}({0})",
    "expm1": "{m:expm1}({0})", "sqrt": "{m:sqrt}({0})",
    "rsqrt": "(({T})1 / {m:sqrt}({0}))", "square": "({0} * {0})",
    "reciprocal": "(({T})1 / {0})", "tanh": "{m:tanh}({0})", "sigmoid": "{m:sigmoid}({0})", "softplus": "{m:softplus}({0})",
    # TF computes these four with max/min instructions, which under its
    # threads' denormals-are-zero return a zero for a denormal operand; a
    # mask select would pass the denormal's bits through, so float results
    # add +0 (flushed there, and exact everywhere else).
    "relu": {"float": "(fs_select({0} < ({T})0, ({T})0, {0}) + ({T})0)",
             "int": "fs_select({0} < ({T})0, ({T})0, {0})"},
    "relu6": {"float": "(fs_select({0} < ({T})0, ({T})0, "
                       "fs_select({0} > ({T})6, ({T})6, {0})) + ({T})0)",
              "int": "fs_select({0} < ({T})0, ({T})0, fs_select({0} > ({T})6, ({T})6, {0}))"},
    "elu": "fs_select({0} < ({T})0, {m:exp}({0}) - ({T})1, {0})",
    "selu": "fs_select({0} < ({T})0, ({T})%r * ({m:exp}({0}) - ({T})1), ({T})%r * {0})"
            % (_SELU_SCALE_ALPHA, _SELU_SCALE),
    "erf": "{m:erf}({0})", "erfc": "{m:erfc}({0})",
    "sin": "{m:sin}({0})", "cos": "{m:cos}({0})",
    "floor": "{m:floor}({0})", "ceil": "{m:ceil}({0})", "round": "{m:round}({0})",
    "sign": {"float": "fs_select({0} > 0, ({T})1, fs_select({0} < 0, ({T})-1, "
                      "fs_select({0} == {0}, ({T})0, {0})))",
             "int": "(({T})({0} > 0) - ({T})({0} < 0))"},
    "isfinite": "({0} - {0} == {0} - {0})", "isnan": "({0} != {0})",
    "logical_not": "(!{0})",
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "div_no_nan": "fs_select({1} == ({T})0, ({T})0, {0} / {1})",
    "maximum": {"float": "(fs_select({0} != {0}, {0}, fs_select({1} != {1}, {1}, "
                         "fs_select({0} > {1}, {0}, {1}))) + ({T})0)",
                "int": "fs_select({0} > {1}, {0}, {1})"},
    "minimum": {"float": "(fs_select({0} != {0}, {0}, fs_select({1} != {1}, {1}, "
                         "fs_select({0} < {1}, {0}, {1}))) + ({T})0)",
                "int": "fs_select({0} < {1}, {0}, {1})"},
    "pow": "{m:pow}({0}, {1})",
    "squared_difference": "(({0} - {1}) * ({0} - {1}))",
    "floor_div": "{m:floor}({0} / {1})",
    "floor_mod": "fs_floor_mod({0}, {1})",
    "less": "({0} < {1})", "greater": "({0} > {1})", "equal": "({0} == {1})",
    "not_equal": "({0} != {1})", "less_equal": "({0} <= {1})", "greater_equal": "({0} >= {1})",
    "logical_and": "({0} && {1})", "logical_or": "({0} || {1})",
    "select": "fs_select({0}, {1}, {2})",
}

_FLOOR_MOD = r"""
FS_INLINE float fs__fmod(float x, float y) { return __builtin_fmodf(x, y); }
FS_INLINE double fs__fmod(double x, double y) { return __builtin_fmod(x, y); }
template <typename T> FS_INLINE T fs_floor_mod(T x, T y) {
  const T r = fs__fmod(x, y);
  return fs_select(r != T(0) && ((y < T(0)) != (r < T(0))), r + y, r);
}
"""

# Sums and means of float32 and 16-bit floats: each block of SUM_BLOCK
# columns accumulates in float as before (per lane of a lane-blocked kernel;
# in the vector loop's own partial sums along a row), and each block's sum is
# added to a double total. One float accumulator over n terms loses up to ~n
# ulp (an NHWC batchnorm's statistics over N*H*W = 100k terms erred 3-6x more
# than TF's, whose Eigen reductions keep several partial sums); blocks bound
# that by the block's length, and the double total adds nothing over any
# practical n. The vector loop stays what it was, so kernels keep their speed
# (summing every term in double cost 5% on layernorm, 15-25% on NHWC moments,
# 40% on a column sum). 64 columns: a softmax's sum of exponentials over
# 8192 rows of 768 then errs 4.3e-5 rms against float64 where TF's errs 5.8e-5
# (the float32 rounding of the result alone is 3.6e-5); at 256 it erred 5.9e-5
# on an AVX-512 machine, more than TF's. Timed in one run there, the softmax
# at 256 and 8192 rows and NHWC moments over 32x28x28x96 ran no slower at 64
# than at 256 (0.93-0.99x).
SUM_BLOCK = 64
_BLOCKED_SUMS = ("reduce_sum", "reduce_mean")
_BLOCKED_DTYPES = ("float32", "float16", "bfloat16")

# Reductions: identity, in-loop update, OpenMP clause operator.
REDUCTIONS = {
    "reduce_sum": ("0", "{a} += {x};", "+"),
    "reduce_mean": ("0", "{a} += {x};", "+"),
    "reduce_prod": ("1", "{a} *= {x};", "*"),
    "reduce_max": ("lowest", "{a} = {a} > {x} ? {a} : {x};", "max"),
    "reduce_min": ("highest", "{a} = {a} < {x} ? {a} : {x};", "min"),
    "reduce_any": ("0", "{a} |= (int){x};", "|"),
    "reduce_all": ("1", "{a} &= (int){x};", "&"),
}


def _literal(value, dtype: str, limits: str = "std::numeric_limits") -> str:
    t = COMPUTE[dtype]
    if isinstance(value, str):
        value = ir.NONFINITE[value]
    if dtype == "bool":
        return "true" if value else "false"
    if dtype in ir.INT_DTYPES:
        return f"({t}){int(value)}LL" if dtype == "int64" else f"({t}){int(value)}"
    value = float(value)
    if math.isnan(value):
        return f"{limits}<{t}>::quiet_NaN()"
    if math.isinf(value):
        return f"({'-' if value < 0 else ''}{limits}<{t}>::infinity())"
    return f"({t}){value!r}"


def expression(st: k.Compute, target: Target) -> str:
    """The expression of one compute statement for `target`."""
    cls = operand_class(st.arg_dtype)
    if st.prim == "const":
        return _literal(dict(st.attrs)["value"], st.dtype, target.limits)
    if st.prim == "cast":
        return cast(st.args[0], st.arg_dtype, st.dtype, target)
    if st.prim in ir.REDUCE or st.prim in p.FREE:
        return st.args[0]  # reduce over size-1 dims, reshape, broadcast, transpose: the
        # tensors' strides do the indexing
    tmpl = _EXPR[st.prim]
    if isinstance(tmpl, dict):
        tmpl = tmpl["float" if cls in ("f32", "f64") else "int"]
    fn_col = 1 if cls == "f64" else 0
    out = tmpl
    for name, pair in target.math.items():
        out = out.replace("{m:%s}" % name, pair[fn_col])
    out = out.replace("{T}", COMPUTE[st.arg_dtype])
    return out.format(*st.args)


def cast(src: str, frm: str, to: str, target: Target) -> str:
    """`src`, computed as `frm`, cast to `to` (both compute-type values)."""
    if frm in p.HALF_DTYPES and frm != to:
        # A 16-bit value computed here is a float32; TF would have stored
        # (rounded) it in its type before the cast: round it first.
        src = target.round_16bit[frm].format(src)
    if to == "bool":
        return f"({src} != 0)"
    if to in p.HALF_DTYPES:  # round as TensorFlow would, then compute in float
        return target.round_16bit[to].format(src)
    return f"static_cast<{COMPUTE[to]}>({src})"


def load_value(raw: str, dtype: str, target: Target) -> str:
    """A stored element (`raw`, e.g. t0[i]) as its compute type."""
    return target.load_16bit[dtype].format(raw) if dtype in p.HALF_DTYPES else raw


def store_value(src: str, dtype: str, target: Target) -> str:
    """A computed value in its storage type."""
    return target.store_16bit[dtype].format(src) if dtype in p.HALF_DTYPES else src


class KernelPrinter:
    """Prints one kernel-IR kernel as the C++ loop nest over work items (the
    CUDA printer, gpu_printer.py, extends it with the GPU thread structure)."""
    # Whether static extents are printed as constants (the GPU printer's
    # unrolled loops need them) or read from `ext` like dynamic ones (the
    # shape function has checked them). On the CPU, reading them lets the
    # kernels of layers that differ only in their sizes share one compiled
    # function (print_kernel); the loops measured no faster with known counts.
    constant_extents = False

    def __init__(self, kernel: k.Kernel, target: Target, symbol: str = "fs_run",
                 linkage: str = ""):
        self.k = kernel
        self.t = target
        self.symbol = symbol
        self.linkage = linkage or target.export
        # Lane-blocked kernels (Kernel.lanes): row values are arrays over the
        # item's lanes, read as v[l]; the lanes' group is the last row group.
        self.lanes = kernel.lanes
        self.lane_group = kernel.row_groups[-1] if kernel.lanes else None
        self.row_arrays = {st.dst for seg in kernel.segments for st in seg
                           if isinstance(st, (k.Load, k.Compute, k.Finish))} if kernel.lanes \
            else set()
        self.lines: List[str] = []
        self.streaming = False   # set per kernel: does any loop stream its stores?
        self.totals: set = set()  # accumulators with a double total d_<acc> (SUM_BLOCK)

    def ref(self, name: str) -> str:
        return f"{name}[l]" if name in self.row_arrays else name

    def emit(self, line: str, indent: int) -> None:
        self.lines.append("  " * indent + line)

    # -- expressions -------------------------------------------------------
    def expr(self, st: k.Compute) -> str:
        return expression(st, self.t)

    def load(self, tensor: int, dtype: str, index: str) -> str:
        return load_value(f"t{tensor}[{index}]", dtype, self.t)

    def store_value(self, src: str, dtype: str) -> str:
        return store_value(src, dtype, self.t)

    # -- indexing ----------------------------------------------------------
    def index(self, tensor: int, in_loop: bool) -> str:
        """Element offset of a tensor at the current row (and column)."""
        parts = [f"o{tensor}"]
        if self.lanes and self.lane_group in self.k.tensors[tensor].groups:
            parts.append(f"(l0 + l) * s{tensor}_{self.lane_group}")
        if in_loop:
            spans = self.k.tensors[tensor].groups
            for g in self.k.col_groups:
                if g in spans:
                    parts.append(self.col_term(tensor, g))
        return " + ".join(parts)

    def col_term(self, tensor: int, g: int) -> str:
        var = f"c{g}"
        tn = self.k.tensors[tensor]
        inner = tn.inner_groups(g)
        return var if not inner and g not in tn.bcast else f"{var} * s{tensor}_{g}"

    # -- statements --------------------------------------------------------
    def stmt(self, st, indent: int, in_loop: bool) -> None:
        """One statement. In a lane-blocked kernel it sits inside the lane
        loop, and row values (defined in the row segments) are arrays."""
        if isinstance(st, k.Load):
            self.define(st.dst, st.dtype,
                        self.load(st.tensor, st.dtype, self.index(st.tensor, in_loop)), indent)
        elif isinstance(st, k.Compute):
            if self.lanes:
                st = dataclasses.replace(st, args=tuple(self.ref(a) for a in st.args))
            self.define(st.dst, st.dtype, self.expr(st), indent)
        elif isinstance(st, k.Store):
            self.emit(f"t{st.tensor}[{self.index(st.tensor, in_loop)}] = "
                      f"{self.store_value(self.ref(st.src), st.dtype)};", indent)
        elif isinstance(st, k.BufStore):
            self.emit(f"{st.pool}_{st.src}[{self.buffer_index(st.pool)}] = {st.src};", indent)
        elif isinstance(st, k.BufLoad):
            self.emit(f"const {COMPUTE[st.dtype]} {st.dst} = "
                      f"{st.pool}_{st.src}[{self.buffer_index(st.pool)}];", indent)
        elif isinstance(st, k.Finish):
            lane = "[l]" if st.dst in self.row_arrays else ""
            self.define(st.dst, st.dtype, self.finished_value(st, lane), indent)
        else:
            raise TypeError(f"unknown statement {st!r}")

    def define(self, dst: str, dtype: str, value: str, indent: int) -> None:
        if dst in self.row_arrays:
            self.emit(f"{dst}[l] = {value};", indent)
        else:
            self.emit(definition(dst, dtype, value), indent)

    def buffer_index(self, pool: str) -> str:
        # a row's buffer holds every lane's column (the hoisted pool does not vary by row)
        return f"cl * {self.lanes} + l" if self.lanes and pool == "b" else "cl"

    # Float sums in blocks (SUM_BLOCK); the GPU printer (gpu_printer.py) keeps
    # one float accumulator per thread.
    blocked_sums = True

    def blocks(self, accs: list) -> list:
        """The accumulators of a column loop that sum in blocks (SUM_BLOCK):
        none where the loop's static column count fits in one block."""
        kr = self.k
        extents = [kr.static_extents[a] for g in kr.col_groups for a in kr.group_extents[g]]
        if not self.blocked_sums or not extents:
            return []
        if None not in extents and math.prod(extents) <= SUM_BLOCK:
            return []
        return [a for a in accs if a.kind in _BLOCKED_SUMS and a.dtype in _BLOCKED_DTYPES]

    @staticmethod
    def acc_type(dtype: str, kind: str) -> str:
        if kind in p.FLAG_REDUCTIONS:
            return FLAG_TYPE
        return COMPUTE[p.accumulator_dtype(kind, dtype)]

    def init_acc(self, acc: k.Accumulate, indent: int) -> None:
        ident, _, _ = REDUCTIONS[acc.kind]
        t = self.acc_type(acc.dtype, acc.kind)
        flag = p.tracks_nan(acc)
        if flag:
            ident = ("-" if ident == "lowest" else "") + f"{self.t.limits}<{t}>::infinity()"
        elif ident in ("lowest", "highest"):
            ident = f"{self.t.limits}<{t}>::{'lowest' if ident == 'lowest' else 'max'}()"
        if self.lanes:  # one accumulator (and NaN flag) per lane
            if flag:
                self.emit(f"{FLAG_TYPE} n_{acc.acc}[{self.lanes}];", indent)
            self.emit(f"{t} a_{acc.acc}[{self.lanes}];", indent)
            self.emit(f"for (int64_t l = 0; l < {self.lanes}; ++l) {{ a_{acc.acc}[l] = {ident};"
                      + (f" n_{acc.acc}[l] = 0;" if flag else "") + " }", indent)
            return
        if flag:
            self.emit(f"{FLAG_TYPE} n_{acc.acc} = 0;", indent)
        self.emit(f"{t} a_{acc.acc} = {ident};", indent)

    def finished_value(self, st: k.Finish, lane: str) -> str:
        """The reduction's row value from its accumulator (`lane`: "[l]" in
        a lane-blocked kernel)."""
        t = COMPUTE[st.dtype]
        value = f"a_{st.dst}{lane}"
        if st.dst in self.totals:   # rounded once from the double total
            count = " / (double)count_r" if st.kind == "reduce_mean" else ""
            return f"static_cast<{t}>(d_{st.dst}{lane}{count})"
        if p.tracks_nan(st):
            value = f"(n_{st.dst}{lane} ? {self.t.limits}<{t}>::quiet_NaN() : {value})"
        elif st.kind == "reduce_mean":
            if st.dtype in ir.INT_DTYPES:
                value = f"(count_r ? ({t})({value} / ({t})count_r) : ({t})0)"
            else:
                value = f"({value} / ({t})count_r)"
        elif st.kind in p.FLAG_REDUCTIONS:
            value = f"({value} != 0)"
        return value

    def declare_extents(self, indent: int) -> None:
        """Block-uniform sizes: group extents g*, strides s*_*, count_r, n_cols
        (and n_tiles when tiled), from `ext` and the static extents."""
        kr = self.k
        e = self.emit
        for g, axes in enumerate(kr.group_extents):
            factors = [str(kr.static_extents[a])
                       if self.constant_extents and kr.static_extents[a] is not None
                       else f"ext[{a}]" for a in axes]
            e(f"const int64_t g{g} = " + " * ".join(factors) + ";", indent)
        for i, tn in enumerate(kr.tensors):
            for g in tn.groups:
                inner = tn.inner_groups(g)
                if g in kr.row_groups or inner or g in tn.bcast:  # unit stride prints as c{g}
                    # A dimension broadcast at run time has stride 0 and extent 1.
                    factors = [f"(ext[{tn.bcast[h]}] ? 1 : g{h})" if h in tn.bcast else f"g{h}"
                               for h in inner]
                    if g in tn.bcast:
                        factors.insert(0, f"(ext[{tn.bcast[g]}] ? 0 : 1)")
                    e(f"const int64_t s{i}_{g} = " + (" * ".join(factors) or "1") + ";", indent)
        if kr.reduce_axes:
            e("const int64_t count_r = " + " * ".join(f"ext[{a}]" for a in kr.reduce_axes)
              + ";", indent)
        e("(void)ext;", indent)
        cols = " * ".join(f"g{g}" for g in kr.col_groups) or "1"
        e(f"const int64_t n_cols = {cols}; (void)n_cols;", indent)
        if kr.tiled and kr.col_groups:
            e(f"const int64_t n_tiles = (n_cols + {TILE} - 1) / {TILE};", indent)

    # -- a work item's row (the C++ loop nest and the GPU body) --------------
    @staticmethod
    def row_indices(rows, whole_outermost: bool) -> List[tuple]:
        """(group, definition) of the row index i<g> of each of the groups
        `rows`, innermost first, taken from the item's number r; with
        `whole_outermost` the outermost takes all that is left of r."""
        return [(g, f"const int64_t i{g} = r;" if whole_outermost and g == rows[0] else
                 f"const int64_t i{g} = r % g{g}; r /= g{g};") for g in reversed(rows)]

    def row_offset(self, tensor: int, rows) -> str:
        """Element offset of a tensor at the row indices i<g> of the groups `rows`."""
        return " + ".join(f"i{g} * s{tensor}_{g}" for g in self.k.tensors[tensor].groups
                          if g in rows) or "0"

    def zero_offsets(self, indent: int) -> None:
        """Row offsets of the hoisted prelude, which does not vary by row."""
        for i in range(len(self.k.tensors)):
            self.emit(f"const int64_t o{i} = 0;", indent)

    # -- kernel ------------------------------------------------------------
    def kernel(self) -> str:
        kr = self.k
        e = self.emit
        e(block_function(self.linkage, self.symbol), 0)
        for line in tensor_pointers([(tn.dtype, tn.is_output) for tn in kr.tensors], self.t):
            e(line, 1)
        self.declare_extents(1)
        self.streaming = self.t.streaming_stores and not self.statically_small() and any(
            self.streamed(kr.loops[k], kr.accumulators[k]) for k in range(len(kr.loops)))
        if self.streaming:
            sizes = [" * ".join(f"g{g}" for g in tn.groups) or "1"
                     for tn in self.float32_outputs()]
            e("const bool fs_big = (" + " + ".join(f"({z})" for z in sizes)
              + ") * 4 >= fs_stream_min_bytes; (void)fs_big;", 1)
        for pool, bufs in (("b", kr.buffers), ("h", kr.hoisted)):
            per_col = f" * {self.lanes}" if self.lanes and pool == "b" else ""
            for b, dtype in bufs.items():
                e(f"{COMPUTE[dtype]}* {pool}_{b} = new {COMPUTE[dtype]}"
                  f"[n_cols > 0 ? n_cols{per_col} : 1];", 1)
        if kr.prelude:  # hoisted values: once per call, not per row; no row offsets
            self.zero_offsets(1)
            lanes, self.lanes = self.lanes, 0  # the prelude does not vary by row
            self.loop(kr.prelude, [], 1, False)
            self.lanes = lanes
        rows = kr.row_groups
        if self.lanes:
            rows = rows[:-1]
            e(f"const int64_t n_blocks = (g{self.lane_group} + {self.lanes - 1}) / {self.lanes};",
              1)
        e("for (int64_t item = begin; item < end; ++item) {", 1)
        e("int64_t r = item;", 2)
        if kr.tiled and kr.col_groups:
            e(ITEM_TILE, 2)
        if self.lanes:
            gl, n = self.lane_group, self.lanes
            e(f"const int64_t l0 = (r % n_blocks) * {n}; r /= n_blocks;", 2)
            e(f"const int64_t nl = g{gl} - l0 < {n} ? g{gl} - l0 : {n};", 2)
            for name in sorted(self.row_arrays, key=lambda v: v):
                e(f"{self.row_array_type(name)} {name}[{n}];", 2)
        # The outermost group needs no division: item < work, so r < g there.
        for _, line in self.row_indices(rows, whole_outermost=True):
            e(line, 2)
        e("(void)r;", 2)
        for i in range(len(kr.tensors)):
            e(f"const int64_t o{i} = {self.row_offset(i, rows)}; (void)o{i};", 2)
        for seg in range(len(kr.segments)):
            if self.lanes and kr.segments[seg]:
                e("for (int64_t l = 0; l < nl; ++l) {", 2)
                for st in kr.segments[seg]:
                    self.stmt(st, 3, False)
                e("}", 2)
            else:
                for st in kr.segments[seg]:
                    self.stmt(st, 2, False)
            if seg < len(kr.loops):
                self.loop(kr.loops[seg], kr.accumulators[seg], 2, kr.tiled)
        e("}", 1)
        for pool, bufs in (("b", kr.buffers), ("h", kr.hoisted)):
            for b in bufs:
                e(f"delete[] {pool}_{b};", 1)
        if self.streaming:
            # streaming stores are weakly ordered: visible before the op returns
            e("#if FS_STREAM_LANES", 0)
            e("if (fs_big) __builtin_ia32_sfence();", 1)
            e("#endif", 0)
        e("}", 0)
        return "\n".join(self.lines)

    def loop(self, stmts: list, accs: list, indent: int, tiled: bool) -> None:
        """One column loop over `stmts`; `tiled` limits it to the item's tile."""
        kr = self.k
        e = self.emit
        for a in accs:  # outside the loop's scope: the row segment after it reads them
            self.init_acc(a, indent)
        blocked = self.blocks(accs)
        for a in blocked:
            self.totals.add(a.acc)
            if self.lanes:
                e(f"double d_{a.acc}[{self.lanes}];", indent)
                e(f"for (int64_t l = 0; l < {self.lanes}; ++l) d_{a.acc}[l] = 0;", indent)
            else:
                e(f"double d_{a.acc} = 0;", indent)
        e("{", indent)
        indent += 1
        if blocked:
            e(f"int64_t fs_left = {SUM_BLOCK};  // columns left in the block", indent)
        groups = kr.col_groups
        if not groups:  # a single column: the body runs once
            e("const int64_t cl = 0; (void)cl;", indent)
            self.body(stmts, accs, indent)
            e("}", indent - 1)
            return
        if self.lanes:
            self.lane_loop(stmts, accs, indent)
            e("}", indent - 1)
            return
        # cl: the column's linear index within the row (buffers are indexed by it).
        prev = "0"
        for n, g in enumerate(groups):
            innermost = n == len(groups) - 1
            lo, hi = "0", f"g{g}"
            if innermost and tiled:
                lo = f"tile * {TILE}"
                hi = f"({bounded_end(lo, TILE, f'g{g}')})"
            if innermost:
                streamed = self.streamed(stmts, accs) if self.streaming else []
                if streamed:
                    lo = self.streamed_loop(stmts, streamed, g, lo, hi, prev, indent)
                if blocked:
                    lo, hi = self.open_block(g, lo, hi, indent)
                    indent += 1
                clauses = "".join(self.clause(a) for a in accs)
                e(self.t.simd_pragma.format(clauses=clauses), indent)
            e(f"for (int64_t c{g} = {lo}; c{g} < {hi}; ++c{g}) {{", indent)
            indent += 1
            if not innermost:
                e(f"const int64_t q{g} = ({prev} + c{g}) * g{groups[n + 1]};", indent)
                prev = f"q{g}"
        e(f"const int64_t cl = {prev} + c{groups[-1]}; (void)cl;", indent)
        self.body(stmts, accs, indent)
        indent = self.close_columns(groups, blocked, indent)
        e("}", indent - 1)

    def open_block(self, g: int, lo: str, hi: str, indent: int) -> tuple:
        """Cuts the innermost column loop [lo, hi) at the ends of blocks
        (SUM_BLOCK columns of the row, counted over the outer column loops
        too); returns the bounds of the piece the loop runs."""
        e = self.emit
        e(f"for (int64_t cb{g} = {lo}; cb{g} < {hi};) {{", indent)
        e(f"const int64_t ce{g} = {bounded_end(f'cb{g}', 'fs_left', hi)};", indent + 1)
        return f"cb{g}", f"ce{g}"

    def close_block(self, g: int, blocked: list, indent: int) -> int:
        """After a piece: where the block is full, its float partials go to
        the double totals and restart from 0. Returns the indent outside."""
        e = self.emit
        e(f"fs_left -= ce{g} - cb{g}; cb{g} = ce{g};", indent)
        e("if (fs_left == 0) {", indent)
        self.fold(blocked, indent + 1, restart=True)
        e(f"fs_left = {SUM_BLOCK};", indent + 1)
        e("}", indent)
        e("}", indent - 1)
        return indent - 1

    def fold(self, blocked: list, indent: int, restart: bool = False) -> None:
        """Adds each float partial a_<acc> to its double total d_<acc> (and
        with `restart` sets it back to 0), per lane in a lane-blocked kernel."""
        if not blocked:
            return
        lane = "[l]" if self.lanes else ""
        steps = " ".join(f"d_{a.acc}{lane} += a_{a.acc}{lane};"
                         + (f" a_{a.acc}{lane} = 0;" if restart else "") for a in blocked)
        if self.lanes:  # (without the pragma GCC moved the lanes one by one)
            self.emit(self.t.simd_pragma.format(clauses=""), indent)
            self.emit(f"for (int64_t l = 0; l < {self.lanes}; ++l) {{ {steps} }}", indent)
        else:
            self.emit(steps, indent)

    def lane_loop(self, stmts: list, accs: list, indent: int) -> None:
        """The columns in order, and inside each the item's lanes: adjacent
        elements, so the inner loop reads and writes contiguously and
        vectorises; each lane accumulates on its own (no reduction clause)."""
        e = self.emit
        groups = self.k.col_groups
        blocked = self.blocks(accs)
        prev = "0"
        for n, g in enumerate(groups):
            lo, hi = "0", f"g{g}"
            if blocked and n == len(groups) - 1:
                lo, hi = self.open_block(g, lo, hi, indent)
                indent += 1
            e(f"for (int64_t c{g} = {lo}; c{g} < {hi}; ++c{g}) {{", indent)
            indent += 1
            if n < len(groups) - 1:
                e(f"const int64_t q{g} = ({prev} + c{g}) * g{groups[n + 1]};", indent)
                prev = f"q{g}"
        e(f"const int64_t cl = {prev} + c{groups[-1]}; (void)cl;", indent)
        e(self.t.simd_pragma.format(clauses=""), indent)
        e("for (int64_t l = 0; l < nl; ++l) {", indent)
        self.body(stmts, accs, indent + 1)
        e("}", indent)
        self.close_columns(groups, blocked, indent)

    def close_columns(self, groups: list, blocked: list, indent: int) -> int:
        """Closes the column loops opened at `indent` (the innermost, its
        block's piece loop, the outer ones) and folds the last block's
        partials. Returns the indent outside them."""
        e = self.emit
        indent -= 1
        e("}", indent)
        if blocked:
            indent = self.close_block(groups[-1], blocked, indent)
        for _ in groups[:-1]:
            indent -= 1
            e("}", indent)
        self.fold(blocked, indent)
        return indent

    def row_array_type(self, name: str) -> str:
        for seg in self.k.segments:
            for st in seg:
                if getattr(st, "dst", None) == name:
                    return COMPUTE[st.dtype]
        raise KeyError(name)

    def float32_outputs(self) -> list:
        """The outputs whose bytes decide streaming, at run time (fs_big) and
        at generation time (statically_small): the same list for both."""
        return [tn for tn in self.k.tensors if tn.is_output and tn.dtype == "float32"]

    def statically_small(self) -> bool:
        """Whether the float32 outputs' sizes are all known and together
        below STREAM_MIN_BYTES, so that they never stream at the default
        threshold."""
        kr = self.k
        total = 0
        for tn in self.float32_outputs():
            extents = [kr.static_extents[a] for g in tn.groups for a in kr.group_extents[g]]
            if None in extents:
                return False
            total += math.prod(extents)
        return total * 4 < STREAM_MIN_BYTES

    def streamed(self, stmts: list, accs: list) -> list:
        """Stores of a loop that can stream: float32, unit stride in the
        innermost column, in a loop without reductions (a short vector loop
        per store would split them)."""
        if accs or not self.k.col_groups or self.lanes:
            return []
        g = self.k.col_groups[-1]
        return [st for st in stmts if isinstance(st, k.Store) and st.dtype == "float32"
                and g in self.k.tensors[st.tensor].groups
                and self.col_term(st.tensor, g) == f"c{g}"]

    def streamed_loop(self, stmts, streamed, g, lo, hi, prev, indent) -> str:
        """Whole vectors of columns from `lo`, each streamed output gathered in
        a register and stored with one streaming store; returns the first
        column left for the ordinary loop."""
        e = self.emit
        e(f"int64_t cs{g} = {lo};", indent)
        e("#if FS_STREAM_LANES", 0)
        first = [f"fs_stream_aligned(&t{st.tensor}[{self.index(st.tensor, True)}])"
                 for st in streamed]
        e("if (fs_big) {", indent)
        e(f"const int64_t c{g} = cs{g};", indent + 1)
        e("const bool aligned = " + " && ".join(first) + ";", indent + 1)
        e(f"for (; aligned && cs{g} + FS_STREAM_LANES <= {hi}; cs{g} += FS_STREAM_LANES) {{",
          indent + 1)
        e("fs_vf32 " + ", ".join(f"s{st.tensor}" for st in streamed) + ";", indent + 2)
        e(self.t.simd_pragma.format(clauses=""), indent + 2)
        e("for (int64_t v = 0; v < FS_STREAM_LANES; ++v) {", indent + 2)
        e(f"const int64_t c{g} = cs{g} + v;", indent + 3)
        e(f"const int64_t cl = {prev} + c{g}; (void)cl;", indent + 3)
        targets = {st.tensor for st in streamed}
        for st in stmts:
            if isinstance(st, k.Store) and st.tensor in targets:
                e(f"s{st.tensor}[v] = {st.src};", indent + 3)
            else:
                self.stmt(st, indent + 3, True)
        e("}", indent + 2)
        e("{", indent + 2)
        e(f"const int64_t c{g} = cs{g};", indent + 3)
        for st in streamed:
            e(f"fs_stream_f32(&t{st.tensor}[{self.index(st.tensor, True)}], s{st.tensor});",
              indent + 3)
        e("}", indent + 2)
        e("}", indent + 1)
        e("}", indent)
        e("#endif", 0)
        return f"cs{g}"

    def body(self, stmts: list, accs, indent: int) -> None:
        for st in stmts:
            self.stmt(st, indent, True)
        lane = "[l]" if self.lanes else ""
        for a in accs:
            src = self.ref(a.src)
            for step in fold_into(a, src, f"({src} != {src})", lane):
                self.emit(step, indent)

    @staticmethod
    def clause(a: k.Accumulate) -> str:
        _, _, op = REDUCTIONS[a.kind]
        out = f" reduction({op}:a_{a.acc})"
        if p.tracks_nan(a):
            out += f" reduction(|:n_{a.acc})"
        return out


def definition(dst: str, dtype: str, value: str) -> str:
    """A value's definition in its compute type."""
    return f"const {COMPUTE[dtype]} {dst} = {value};"


def bounded_end(lo: str, step, n: str) -> str:
    """The end of the range of `step` from `lo`, or `n` where that comes first
    (a tile, a block of a sum, a split row's slice)."""
    return f"{n} - {lo} < {step} ? {n} : {lo} + {step}"


# The tile of the row's columns that a tiled kernel's item runs.
ITEM_TILE = "const int64_t tile = r % n_tiles; r /= n_tiles;"


def fold_into(a: k.Accumulate, value: str, nan: str, lane: str = "") -> List[str]:
    """Statements that fold `value` into the accumulator a_<acc> of reduction
    `a` and, where it tracks NaN, the truth value `nan` into its flag n_<acc>
    (`lane`: "[l]" in a lane-blocked kernel). Columns into a row's
    accumulator, and on the GPU other threads' or slices' partials."""
    steps = [REDUCTIONS[a.kind][1].format(a=f"a_{a.acc}{lane}", x=value)]
    if p.tracks_nan(a):
        steps.append(f"n_{a.acc}{lane} |= {nan};")
    return steps


def block_function(linkage: str, symbol: str = "fs_run") -> str:
    """The first line of a block function (docs/KERNEL_ABI.md, fs_run)."""
    return (f"{linkage} void {symbol}(int64_t begin, int64_t end, const int64_t* ext, "
            "void* const* bufs) {")


def tensor_pointers(tensors, target: Target) -> List[str]:
    """A block function's typed pointers t<i> into `bufs`; `tensors`: (dtype,
    is an output) per buffer, in ABI order (inputs read-only)."""
    out = []
    for i, (dtype, is_output) in enumerate(tensors):
        st = target.storage[dtype]
        const = "" if is_output else "const "
        out.append(f"{const}{st}* t{i} = static_cast<{const}{st}*>(bufs[{i}]);")
    return out


def print_kernel(kernel: k.Kernel, target: Target = CPP, symbol: str = "fs_run",
                 linkage: str = "") -> str:
    """The block function, exported as `symbol` (fs_run); a packed kernel
    (codegen/pack.py) prints its parts with `linkage="static"` under names
    of their own. The loop nest is a function named by a hash of its text,
    marked for a library to compile once for every kernel that holds it
    (runtime/kernel_library.py); `symbol` calls it."""
    name, body = kernel_library.mark_shared(
        KernelPrinter(kernel, target, "fs_body", "static").kernel(), "fs_body")
    return "\n".join([body, block_function(linkage or target.export, symbol),
                      f"  {name}(begin, end, ext, bufs);", "}"])


def headers(target: Target = CPP) -> str:
    return ("#include <cstdint>\n#include <cstdio>\n#include <cstring>\n#include <limits>\n"
            + target.prelude + _FLOOR_MOD)
