"""Kernel IR: a scheduled cluster as straight-line statements in loops.

A kernel runs independent work items (rows). Each item runs
`segments[0]`, then for every loop k: `loops[k]` over the columns followed by
`segments[k + 1]`. Statements are three-address code over named values; the
printer (codegen/printer.py) turns them into C++ and later CUDA through small
per-target tables. `lower(schedule)` builds it. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.schedule import Schedule


@dataclasses.dataclass(frozen=True)
class Load:
    dst: str
    tensor: int          # index into the kernel's buffers (inputs first)
    dtype: str           # storage dtype


@dataclasses.dataclass(frozen=True)
class Compute:
    dst: str
    prim: str
    args: tuple
    dtype: str           # result dtype (storage dtype; computed in compute_type)
    arg_dtype: str       # dtype of the arguments
    attrs: tuple = ()


@dataclasses.dataclass(frozen=True)
class Store:
    tensor: int
    src: str
    dtype: str


# Column buffers: pool "b" holds a row's values across loops, pool "h" the
# hoisted values computed once per call; both are indexed by the column.
@dataclasses.dataclass(frozen=True)
class BufStore:
    src: str
    dtype: str
    pool: str = "b"


@dataclasses.dataclass(frozen=True)
class BufLoad:
    dst: str
    src: str             # the buffered value's name (one buffer per value)
    dtype: str
    pool: str = "b"


@dataclasses.dataclass(frozen=True)
class Accumulate:
    acc: str             # the reduction's value name
    kind: str            # reduce_* primitive
    src: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class Finish:
    """Row value of a reduction, after the loop that accumulated it."""
    dst: str
    kind: str
    dtype: str


@dataclasses.dataclass
class Tensor:
    name: str
    dtype: str
    groups: tuple        # indices of the axis groups this tensor spans
    is_output: bool
    bcast: dict = dataclasses.field(default_factory=dict)  # group -> ext index of its
    # run-time broadcast flag (1: this dynamic dimension is 1 and the axis is not)
    layout: tuple = ()   # its groups in memory order, outer to inner (a transposed
    # tensor's differs from `groups`, which is in iteration order)

    def inner_groups(self, g: int) -> tuple:
        """The groups laid out inside group g: its stride is their extents' product."""
        return self.layout[self.layout.index(g) + 1:]



# GPU thread structure: the sync points between the parts of one thread's
# code (gpu_printer.GpuBody makes them; print_cuda prints them as CUDA and
# print_emulation as the loops over a block's threads that check it on a CPU).
@dataclasses.dataclass(frozen=True)
class Barrier:
    """Every thread of the block waits here (__syncthreads)."""


@dataclasses.dataclass(frozen=True)
class Shuffle:
    """A warp exchange: each tmp takes reg of lane ^ offset, then `combine` folds them."""
    offset: int
    exchanges: tuple   # ((tmp, reg, ctype), ...)
    combine: tuple     # statements that fold the tmps into the regs


@dataclasses.dataclass(frozen=True)
class Guard:
    """Code after it runs only where `cond` holds: false for the threads past
    the last row (whole warps or blocks, where shuffles or barriers follow)."""
    cond: str


@dataclasses.dataclass
class Kernel:
    tensors: List[Tensor]          # inputs then outputs, matching the ABI's bufs
    num_inputs: int
    group_extents: List[tuple]     # per axis group: the iteration axes it multiplies
    static_extents: List[Optional[int]]  # per iteration axis, when known statically
    col_groups: List[int]          # group indices looped over inside a work item
    row_groups: List[int]          # group indices enumerated by the work item index
    tiled: bool
    segments: List[list]           # statements per row segment (num_loops + 1)
    loops: List[list]              # statements per column loop
    accumulators: List[list]       # per loop: Accumulate statements it owns
    buffers: Dict[str, str]        # buffered value -> dtype
    hoisted: Dict[str, str]        # hoisted value -> dtype
    prelude: list                  # column loop run once per call for the hoisted values
    reduce_axes: tuple             # iteration axes reduced (for mean's count)
    # CPU only: a work item is `lanes` adjacent elements of the innermost row
    # group instead of one row, every row value an array over them, and each
    # column loop runs the lanes innermost (contiguous, vectorised); 0: off.
    lanes: int = 0


# Lanes per work item when a reduction keeps the innermost axis: one AVX-512
# vector of float32, so a column step reads one cache line per item.
CPU_LANES = 16


def cpu_lanes(s: Schedule) -> int:
    """CPU_LANES when the cluster reduces and keeps the innermost axis (a
    bias gradient, NHWC batchnorm statistics): a kernel over single kept
    elements would walk each one's values a row apart; else 0."""
    return CPU_LANES if s.reductions and s.num_axes - 1 not in s.col_axes else 0


def lower(s: Schedule, lanes: int = 0) -> Kernel:
    """The kernel IR of schedule `s`; `lanes`: see Kernel.lanes (cpu_lanes)."""
    c = s.cluster
    types = c.types()
    ops = c.op_by_name()
    group_index = {}
    for gi, g in enumerate(s.groups):
        for a in g.axes:
            group_index[a] = gi

    def groups_of(value):
        return tuple(sorted({group_index[a] for a in s.axes_of(value)}))

    def layout_of(value):
        return tuple(dict.fromkeys(group_index[a] for a in s.dim_axes[value] if a is not None))

    tensors = [Tensor(n, t.dtype, groups_of(n), False, layout=layout_of(n)) for n, t in c.inputs]
    tensors += [Tensor(o, types[o].dtype, groups_of(o), True, layout=layout_of(o))
                for o in c.outputs]
    for k, (i, axis) in enumerate(s.maybe_broadcast):
        tensors[i].bcast[group_index[axis]] = s.num_axes + k
    input_index = {n: i for i, (n, _) in enumerate(c.inputs)}
    n_loops = s.num_loops
    segments: List[list] = [[] for _ in range(n_loops + 1)]
    loops: List[list] = [[] for _ in range(n_loops)]
    accs: List[list] = [[] for _ in range(n_loops)]
    # Output stores end each loop body: a forwarded output shares its buffer
    # with an input, so every load of the element must come first.
    stores: List[list] = [[] for _ in range(n_loops)]

    # Row values: inputs that do not vary along the columns load once per row.
    for name, t in c.inputs:
        if not s.is_col[name]:
            segments[0].append(Load(value_name(name), input_index[name], t.dtype))

    # Per loop: which col values are already defined in that loop's body;
    # index n_loops is the prelude that computes the hoisted values.
    defined: List[set] = [set() for _ in range(n_loops + 1)]
    prelude: list = []

    def emit_col(value: str, k: int) -> str:
        """Make `value` available inside loop k, its operands first; returns
        its C++ name."""
        in_prelude = k == n_loops
        body = prelude if in_prelude else loops[k]

        def read(v):
            """The statement that reads v in this loop, or None where it is computed."""
            if v in input_index:
                return Load(value_name(v), input_index[v], types[v].dtype)
            if v in s.hoisted and not in_prelude:
                return BufLoad(value_name(v), value_name(v), types[v].dtype, "h")
            if v in s.buffered and s.phase[v] < k:
                return BufLoad(value_name(v), value_name(v), types[v].dtype)
            return None

        def skip(v):  # defined here already, or a row value (the row segments define it)
            return v in defined[k] or (not s.is_col[v] and not in_prelude)

        for v in operands_first(value, ops, skip, lambda v: read(v) is not None):
            body.append(read(v) or compute(ops[v], types))
            defined[k].add(v)
        return value_name(value)

    for v in sorted(s.hoisted, key=list(ops).index):
        emit_col(v, n_loops)
        prelude.append(BufStore(value_name(v), types[v].dtype, "h"))

    outputs = {o: len(c.inputs) + j for j, o in enumerate(c.outputs)}
    for op in c.ops:
        if op.name in s.reductions:
            k = s.phase[op.inputs[0]]
            src = emit_col(op.inputs[0], k)
            accs[k].append(Accumulate(value_name(op.name), op.prim, src, op.type.dtype))
            segments[k + 1].append(Finish(value_name(op.name), op.prim, op.type.dtype))
        elif op.name in s.hoisted:
            pass  # computed in the prelude; loops read it where they need it
        elif s.is_col[op.name]:
            # Emitted where something needs it: an output, a buffer, or (through
            # emit_col) a consumer; values only the prelude uses stay out of loops.
            k = s.phase[op.name]
            if op.name in outputs or op.name in s.buffered:
                emit_col(op.name, k)
            if op.name in s.buffered:
                loops[k].append(BufStore(value_name(op.name), op.type.dtype))
        else:
            segments[s.phase[op.name]].append(compute(op, types))
        if op.name in outputs:
            stmt = Store(outputs[op.name], value_name(op.name), op.type.dtype)
            if s.is_col[op.name]:
                stores[s.phase[op.name]].append(stmt)
            else:
                segments[s.phase[op.name]].append(stmt)

    for body, tail in zip(loops, stores):
        body.extend(tail)
    col_groups = [i for i, g in enumerate(s.groups) if g.is_col]
    row_groups = [i for i, g in enumerate(s.groups) if not g.is_col]
    return Kernel(
        tensors=tensors, num_inputs=len(c.inputs),
        group_extents=[g.axes for g in s.groups], static_extents=list(s.static_extent),
        col_groups=col_groups,
        row_groups=row_groups, tiled=s.tiled, segments=segments, loops=loops,
        accumulators=accs, buffers={value_name(b): types[b].dtype for b in sorted(s.buffered)},
        hoisted={value_name(h): types[h].dtype for h in sorted(s.hoisted)}, prelude=prelude,
        reduce_axes=tuple(sorted(s.col_axes)) if not s.tiled else (), lanes=lanes)


def operands_first(value: str, ops: dict, skip, read):
    """`value` and the values it needs, each after its operands (a post-order
    walk with an explicit stack, so a long chain of ops does not reach
    Python's recursion limit): values where `skip` holds are left out, and
    the operands of those that `read` are not walked. `skip` is asked again
    after each value the caller takes, so it may test what the caller has
    defined."""
    stack = [(value, False)]
    while stack:
        v, operands_done = stack.pop()
        if skip(v):
            continue
        if operands_done or read(v):
            yield v
        else:
            stack.append((v, True))
            stack.extend((i, False) for i in reversed(ops[v].inputs))


def value_name(name: str) -> str:
    """The name of a cluster value in kernel IR (and in the printed code)."""
    return "v_" + name


def compute(op: ir.Op, types) -> Compute:
    """The statement that computes `op` from its operands' values."""
    arg_dtype = types[op.inputs[-1]].dtype if op.inputs else op.type.dtype
    return Compute(value_name(op.name), op.prim, tuple(value_name(i) for i in op.inputs),
                   op.type.dtype, arg_dtype, op.attrs)
