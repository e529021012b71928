"""Host-side C++ of a kernel: `fs_meta` and `fs_shape` (docs/KERNEL_ABI.md).

The shape function reads the run-time extents of the inputs, checks them
against the schedule's alignment (size-1 dimensions stay size 1; dimensions
tied to one iteration axis agree), and derives the iteration extents, the
output shapes and the number of work items. Nothing is recompiled when a
dynamic extent such as the batch size changes. No TensorFlow import here.
"""

from __future__ import annotations

from typing import List

from tf_fusionstitch.codegen import kernel_ir as k
from tf_fusionstitch.codegen.primitives import FREE
from tf_fusionstitch.fusion_ir import DTYPE_BYTES, DTYPE_CODES, EXPENSIVE, MAX_META_COUNT
from tf_fusionstitch.runtime import kernel_library
from tf_fusionstitch.schedule import ELEMENTWISE_TILE, Schedule, UnsupportedCluster

ABI_VERSION = 2  # docs/KERNEL_ABI.md; the op and runtime/cpu_kernel.py check it


# Work item costs are in the unit of TensorFlow's thread pool (Eigen's cost
# model: about a CPU cycle): it runs a kernel on one thread below about 1e5
# in all, as it does its own ops. Per column element, in 1/COST_SCALE units:
# moving a byte costs 11/64 cycle (Eigen's load and store cost), a vectorised
# light op 1/8 cycle (a lane of an 8-wide vector), an expensive one (exp,
# tanh, division, ...) about 2.5 cycles; copies cost nothing.
COST_SCALE = 64
BYTE_COST = 11
_LIGHT_COST = 8
_EXPENSIVE_COST = 160


def element_cost(statements) -> int:
    """The estimated cost of one column element of a work item (the column
    loops' statements), in 1/COST_SCALE."""
    cost = 0
    for stmt in statements:
        if isinstance(stmt, (k.Load, k.Store, k.BufLoad, k.BufStore)):
            cost += BYTE_COST * DTYPE_BYTES[stmt.dtype]
        elif isinstance(stmt, k.Compute) and stmt.prim not in FREE:
            cost += _EXPENSIVE_COST if stmt.prim in EXPENSIVE else _LIGHT_COST
        elif isinstance(stmt, k.Accumulate):
            cost += _LIGHT_COST
    return max(cost, 1)


def num_ext(s: Schedule) -> int:
    """Iteration extents, then one run-time broadcast flag per maybe-broadcast dim."""
    return max(s.num_axes + len(s.maybe_broadcast), 1)


def print_meta(s: Schedule, export: str) -> str:
    return format_meta(s.cluster, num_ext(s), s.forward, export)


def format_meta(c, n_ext: int, forward, export: str) -> str:
    """`fs_meta` of cluster `c` with `n_ext` run-time extents and the
    (output, input) buffer `forward` pairs."""
    if max(len(c.inputs), len(c.outputs), n_ext) > MAX_META_COUNT:
        # A pack of thousands of parts: refused here, before it is compiled.
        raise UnsupportedCluster(f"{len(c.inputs)} inputs, {len(c.outputs)} outputs and "
                                 f"{n_ext} run-time extents: fs_meta allows {MAX_META_COUNT}")
    types = c.types()
    vals: List[int] = [ABI_VERSION, len(c.inputs), len(c.outputs), n_ext]
    vals += [t.rank for _, t in c.inputs]
    vals += [types[o].rank for o in c.outputs]
    vals += [DTYPE_CODES[t.dtype] for _, t in c.inputs]
    vals += [DTYPE_CODES[types[o].dtype] for o in c.outputs]
    vals += [len(forward)]
    for j, i in forward:
        vals += [j, i]
    return f"{export} const int64_t fs_meta[] = {{{', '.join(map(str, vals))}}};"


# Shape functions run once per call, on a few integers: not optimised as the
# kernels are. At -O1 (against -O3 kernels) a library of MobileNetV2's kernels
# compiled 10-15% faster and a call took 8-19 ns, against 8-16. At -O0 (against
# -O2 kernels) EfficientNetB0's train-step libraries compile in 13% less CPU
# than at -O1 and no step moved: O1/O0 step time 1.004x (0.98-1.03) on BERT
# inference, 1.031x (0.98-1.06) on EfficientNetB0's train step and 1.015x
# (0.98-1.03) on GPT-2's, tiny sizes, interleaved. GCC keeps the command
# line's other flags (-fwrapv) in such a function.
SHAPE_FN_ATTRIBUTES = '__attribute__((optimize("O0")))'


def shape_fn_head(export: str, symbol: str = "fs_shape", extra_params: str = "") -> str:
    """The first line of a shape function (docs/KERNEL_ABI.md, fs_shape)."""
    return (f"{export} {SHAPE_FN_ATTRIBUTES} int {symbol}(const int64_t* in_dims, "
            "int64_t* out_dims, int64_t* ext, "
            f"int64_t* work, char* err, int64_t errlen{extra_params}) {{")


def dim_offsets(types) -> List[int]:
    """Where each tensor's dimensions start in a flat array of dimensions
    (in_dims, out_dims), for `types` in order."""
    out, off = [], 0
    for t in types:
        out.append(off)
        off += t.rank
    return out


def shape_error(cond: str, got: str, want: List[str], number: str, name: str,
                reason: str) -> List[str]:
    """Lines that fail the shape function with TF's "Incompatible shapes" where
    `cond` holds: the input numbered by the C expression `number`, named by
    the C string `name`, has the dimensions at `got` (a pointer into in_dims)
    where `want` (C expressions) are required, for `reason` (the prelude's
    fs_shape_mismatch formats the message)."""
    return [f"  if ({cond}) {{",
            f"    const int64_t want[] = {{{', '.join(want)}}};",
            f"    return fs_shape_mismatch({got}, want, {len(want)}, {number}, {name}, "
            f'"{reason}", err, errlen);',
            "  }"]


_LABELS = ", const int64_t* in_numbers, const char* const* in_names"


def print_shape_fn(s: Schedule, kernel: k.Kernel, export: str, symbol: str = "fs_shape",
                   caller_names_inputs: bool = False) -> str:
    """With `caller_names_inputs`, the function takes two more arguments, the
    op's input index and the name of each of the cluster's inputs, for its
    error messages: a packed kernel's parts of one structure share it,
    each reading some of the op's inputs.

    The checks and sizes are a function of their own that reads the static
    extents, input numbers and names from arrays, named by a hash of its
    text and marked for a library to compile once for every kernel that
    holds it (runtime/kernel_library.py); `symbol` passes it this kernel's."""
    c = s.cluster
    statics = [e for e in s.static_extent if e is not None]
    name, body = kernel_library.mark_shared(_shape_body(s, kernel), "fs_shape_body")
    lines = [body, shape_fn_head(export, symbol, _LABELS if caller_names_inputs else "")]
    lines.append(f"  static const int64_t statics[] = {{{', '.join(map(str, statics)) or '0'}}};")
    if not caller_names_inputs:
        numbers = ", ".join(str(i) for i in range(len(c.inputs))) or "0"
        names = ", ".join(f'"{n}"' for n, _ in c.inputs) or "0"
        lines += [f"  static const int64_t in_numbers[] = {{{numbers}}};",
                  f"  static const char* const in_names[] = {{{names}}};"]
    lines += [f"  return {name}(in_dims, out_dims, ext, work, err, errlen, in_numbers, "
              "in_names, statics);", "}"]
    return "\n".join(lines)


def _shape_body(s: Schedule, kernel: k.Kernel) -> str:
    """The shape function's code, as `fs_shape_body` taking the input
    numbers and names and the static extents (in axis order) as arrays."""
    c = s.cluster
    lines = [shape_fn_head("static", "fs_shape_body", _LABELS + ", const int64_t* statics")]
    offsets = dim_offsets(t for _, t in c.inputs)
    sources = {a: [] for a in range(s.num_axes)}
    for i, (name, t) in enumerate(c.inputs):
        for d, a in enumerate(s.dim_axes[name]):
            if a is not None:
                sources[a].append((i, d))
    maybe = set(s.maybe_broadcast)
    static_index = {a: j for j, a in enumerate(
        a for a in range(s.num_axes) if s.static_extent[a] is not None)}
    for a in range(s.num_axes):
        if s.static_extent[a] is not None:
            lines.append(f"  const int64_t e{a} = statics[{static_index[a]}];")
        elif any((i, a) in maybe for i, _ in sources[a]):
            # Broadcasting: the extent is any source that is not 1.
            lines.append(f"  int64_t e{a} = 1;")
            for i, d in sources[a]:
                lines.append(f"  if (in_dims[{offsets[i] + d}] != 1) e{a} = in_dims[{offsets[i] + d}];")
        elif sources[a]:
            i, d = sources[a][0]
            lines.append(f"  const int64_t e{a} = in_dims[{offsets[i] + d}];")
        else:
            raise UnsupportedCluster(f"iteration axis {a} has no extent known from any input")
    # Every input dimension must agree with the axis it was aligned to.
    for i, (name, t) in enumerate(c.inputs):
        want = []
        for d, a in enumerate(s.dim_axes[name]):
            want.append("1" if a is None else f"e{a}")
        cond = " || ".join(
            f"(in_dims[{offsets[i] + d}] != {w} && in_dims[{offsets[i] + d}] != 1)"
            if (i, a) in maybe else f"in_dims[{offsets[i] + d}] != {w}"
            for d, (w, a) in enumerate(zip(want, s.dim_axes[name])))
        if not cond:
            continue
        lines += shape_error(cond, f"in_dims + {offsets[i]}", want, f"in_numbers[{i}]",
                             f"in_names[{i}]",
                             "dimensions that broadcasting ties together must agree; a "
                             "dimension unknown when the function was optimized may not "
                             "broadcast at run time")
    for a in range(s.num_axes):
        lines.append(f"  ext[{a}] = e{a};")
    for flag, (i, a) in enumerate(s.maybe_broadcast):
        d = s.dim_axes[c.inputs[i][0]].index(a)
        lines.append(f"  ext[{s.num_axes + flag}] = in_dims[{offsets[i] + d}] == 1 && e{a} != 1;")
    pos = 0
    for o in c.outputs:
        for a in s.dim_axes[o]:  # None marks a size-1 dimension
            lines.append(f"  out_dims[{pos}] = {1 if a is None else f'e{a}'};")
            pos += 1
    group_ext = [" * ".join(f"e{a}" for a in axes) for axes in kernel.group_extents]
    rows = " * ".join(f"({group_ext[g]})" for g in kernel.row_groups) or "1"
    cols = " * ".join(f"({group_ext[g]})" for g in kernel.col_groups) or "1"
    lines.append(f"  const int64_t n_cols = {cols};")
    if kernel.tiled and kernel.col_groups:
        lines.append(f"  const int64_t per_item = n_cols < {ELEMENTWISE_TILE} ? n_cols : "
                     f"{ELEMENTWISE_TILE};")
        lines.append(f"  work[0] = ({rows}) * ((n_cols + {ELEMENTWISE_TILE - 1}) / "
                     f"{ELEMENTWISE_TILE});")
    elif kernel.lanes:  # items of `lanes` elements of the innermost row group
        inner = group_ext[kernel.row_groups[-1]]
        outer = " * ".join(f"({group_ext[g]})" for g in kernel.row_groups[:-1]) or "1"
        lines.append(f"  const int64_t per_item = n_cols * {kernel.lanes};")
        lines.append(f"  work[0] = {outer} * (({inner} + {kernel.lanes - 1}) / {kernel.lanes});")
    else:
        lines.append("  const int64_t per_item = n_cols;")
        lines.append(f"  work[0] = {rows};")
    per_row = 16 + sum(len(seg) for seg in kernel.segments)
    column = [s for loop in kernel.loops for s in loop] + \
        [a for accs in kernel.accumulators for a in accs]
    lines.append(f"  work[1] = {per_row} + per_item * {element_cost(column)} / {COST_SCALE};")
    lines += ["  (void)in_dims; (void)err; (void)errlen;", "  return 0;", "}"]
    return "\n".join(lines)
