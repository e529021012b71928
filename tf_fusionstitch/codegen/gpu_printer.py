"""GPU kernels from kernel IR: one body, printed as CUDA or as its C++ emulation.

`GpuBody` walks a `GpuPlan` (gpu/mapping.py) and prints the code of one
thread, using the shared printer (printer.py) for every statement, split into
*parts* by the points where threads communicate: `k.Barrier` (`__syncthreads`),
`k.Shuffle` (one step of a warp's xor tree) and `k.Guard` (threads past the
last row stop). Where the plan keeps inputs in registers across loops, the
column loops are unrolled over a counter `j` and those inputs live in
per-thread arrays `rc_<name>[j]`. The two assemblers differ only in how they
join the parts:

- `print_cuda`: straight-line code, a part after another, the sync points
  printed from the CUDA target table.
- `print_emulation`: a C++ block function (docs/KERNEL_ABI.md, fs_run) that
  runs the blocks one after another and, inside a block, each *phase* (code
  between two sync points) as a loop over the block's threads. Values that
  cross a phase boundary live in per-thread arrays (`R_<name>[tid]`), saved at
  the end of a phase and restored where a later phase uses them; a shuffle
  reads a snapshot of its lanes' values (`S_<name>[tid ^ offset]`); shared
  memory is an array of the block function. The index math, barriers and
  shuffles are exactly those of the CUDA kernel, so running the emulation
  against NumPy checks them without a GPU. Math functions come from the
  C++ target (vecmath.py), so the emulation does not check CUDA's libm.

No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict, List

from tf_fusionstitch.codegen import kernel_ir as k
from tf_fusionstitch.codegen import primitives as p
from tf_fusionstitch.codegen import printer
from tf_fusionstitch.codegen.printer import COMPUTE, CUDA, FLAG_TYPE, Target, fold_into
from tf_fusionstitch.gpu.cost import buffer_slots
from tf_fusionstitch.gpu.mapping import WARP, GpuPlan, split_phases
from tf_fusionstitch.schedule import ELEMENTWISE_TILE as TILE

KERNEL_NAME = "fs_kernel"

# NVRTC options every CUDA kernel is compiled with. --fmad=false keeps a*b+c
# as two roundings, like the C++ target's -ffp-contract=off: a value computed
# twice (a recomputed buffer) then has the same bits both times.
NVRTC_OPTIONS = ("--std=c++17", "--fmad=false")


class GpuBody(printer.KernelPrinter):
    """Prints one thread's code of a GpuPlan as parts between sync points."""

    # Float sums keep one float accumulator per thread (the shuffles and
    # shared-memory partials then combine them); the emulation is the CUDA
    # kernel's arithmetic.
    blocked_sums = False
    constant_extents = True   # static trip counts unroll and fold into the index math

    def __init__(self, plan: GpuPlan, target: Target, phase: int = 0):
        super().__init__(plan.kernel, target)
        self.m = plan.mapping
        self.phase = phase                    # the launch printed, for a split row
        self.per_thread = plan.cols_per_thread   # unrolled loops' trip count, or None
        self.cached = set(plan.register_cached)
        self.first_loop = {}                  # cached value -> the loop that loads it
        self.cached_dtype = {}
        for loop, body in enumerate(plan.kernel.loops):
            for st in body:
                if isinstance(st, k.Load) and st.dst in self.cached:
                    self.first_loop.setdefault(st.dst, loop)
                    self.cached_dtype[st.dst] = st.dtype
        self.loop_index = None                # the column loop being printed
        self.parts: list = []                 # list[str] (code) or a sync point
        self.regs: Dict[str, str] = {}        # thread-scope value -> C type
        self.reg_len: Dict[str, int] = {}     # thread-scope arrays -> elements
        self.reg_part: Dict[str, int] = {}    # thread-scope value -> part declaring it
        self.shared: List[tuple] = []         # (name, C type, elements)
        # This thread's rank among its row's threads, and its row's slot in the block.
        self.row_thread = {"thread": "0", "warp": "lane", "block": "tid"}[self.m.kind]
        self.row_slot = {"thread": "tid", "warp": "warp", "block": "0"}[self.m.kind]
        if self.m.row_blocks > 1:
            self.build_split()
        else:
            self.build()

    # -- bookkeeping -------------------------------------------------------
    def reg(self, name: str, ctype: str) -> None:
        self.regs[name] = ctype
        self.reg_part[name] = len(self.parts)

    def decl(self, ctype: str, name: str, value: str, const: bool = True) -> None:
        self.emit(f"{'const ' if const else ''}{ctype} {name} = {value};", 0)
        self.reg(name, ctype)

    def sync(self, point) -> None:
        self.parts.append(self.lines)
        self.parts.append(point)
        self.lines = []

    # -- statements --------------------------------------------------------
    def stmt(self, st, indent: int, in_loop: bool) -> None:
        if (isinstance(st, k.Load) and in_loop and st.dst in self.cached
                and self.loop_index is not None):
            if self.loop_index == self.first_loop[st.dst]:
                super().stmt(st, indent, in_loop)
                self.emit(f"rc_{st.dst}[j] = {st.dst};", indent)
            else:  # the value this thread loaded for this column in an earlier loop
                self.emit(f"const {COMPUTE[st.dtype]} {st.dst} = rc_{st.dst}[j];", indent)
        elif isinstance(st, k.Store) and not in_loop:  # a row value: one thread writes it
            guard = "" if self.m.row_threads == 1 else f"if ({self.row_thread} == 0) "
            if self.m.row_blocks > 1:
                guard = "if (slice == 0 && tid == 0) "
            self.emit(f"{guard}t{st.tensor}[{self.index(st.tensor, False)}]"
                      f" = {self.store_value(st.src, st.dtype)};", indent)
        elif isinstance(st, k.BufStore):
            self.emit(f"{self.buf(st.pool, st.src)} = {st.src};", indent)
        elif isinstance(st, k.BufLoad):
            self.emit(f"const {COMPUTE[st.dtype]} {st.dst} = {self.buf(st.pool, st.src)};",
                      indent)
        else:
            super().stmt(st, indent, in_loop)

    def buf(self, pool: str, value: str) -> str:
        """Shared-memory element of a buffered (per row) or hoisted (per block) value."""
        if pool == "b":
            value = self.slot[value]
        if pool == "b" and self.m.kind == "thread":  # column-major: no bank conflicts
            return f"{pool}_{value}[cl * {self.m.rows_per_block} + tid]"
        if pool == "b" and self.m.rows_per_block > 1:  # lanes read consecutive words
            return f"{pool}_{value}[{self.row_slot} * {self.m.smem_cols} + cl]"
        return f"{pool}_{value}[cl]"

    def lane_and_warp(self) -> None:
        """The thread's lane in its warp and its warp in the block."""
        self.decl("int", "lane", f"tid & {WARP - 1}")
        self.decl("int", "warp", f"tid >> {WARP.bit_length() - 1}")

    def row_stmt(self, st) -> None:
        self.stmt(st, 0, False)
        if isinstance(st, (k.Load, k.Compute, k.Finish)):
            self.reg(st.dst, COMPUTE[st.dtype])

    # -- structure ---------------------------------------------------------

    def row_offsets(self) -> None:
        """Row indices i{g} of item `r` and each tensor's element offset o{i}."""
        kr = self.k
        for g, line in self.row_indices(kr.row_groups, whole_outermost=False):
            self.emit(line, 0)
            self.reg(f"i{g}", "int64_t")
        for i in range(len(kr.tensors)):
            self.decl("int64_t", f"o{i}", self.row_offset(i, kr.row_groups))

    def build(self) -> None:
        kr, m = self.k, self.m
        self.declare_extents(0)
        self.uniform, self.lines = self.lines, []
        for h, dtype in kr.hoisted.items():
            self.shared.append((f"h_{h}", COMPUTE[dtype], m.smem_cols))
        self.slot = buffer_slots(kr)   # buffers whose lifetimes do not overlap share one
        for b, dtype in kr.buffers.items():
            if self.slot[b] == b:
                self.shared.append((f"b_{b}", COMPUTE[dtype], m.rows_per_block * m.smem_cols))
        self.lane_and_warp()
        if kr.prelude:  # hoisted values: every thread of the block shares the columns
            self.emit("{", 0)
            self.zero_offsets(1)
            self.col_loop(kr.prelude, [], 1, "0", "n_cols", "tid", m.block_threads)
            self.emit("}", 0)
            self.sync(k.Barrier())
        first_item = "begin + block" + ("" if m.rows_per_block == 1 else f" * {m.rows_per_block}")
        self.decl("int64_t", "item",
                  first_item + ("" if self.row_slot == "0" else f" + {self.row_slot}"))
        self.sync(k.Guard("item < end"))
        self.decl("int64_t", "r", "item", const=False)
        if kr.tiled and kr.col_groups:
            self.emit(printer.ITEM_TILE, 0)
            self.reg("tile", "int64_t")
        self.row_offsets()
        lo, hi = "0", "n_cols"
        if kr.tiled and kr.col_groups:
            self.decl("int64_t", "col_lo", f"tile * {TILE}")
            self.decl("int64_t", "col_hi", printer.bounded_end("col_lo", TILE, "n_cols"))
            lo, hi = "col_lo", "col_hi"
        for name in sorted(self.cached, key=lambda v: (self.first_loop[v], v)):  # deterministic text
            ctype = COMPUTE[self.cached_dtype[name]]
            self.emit(f"{ctype} rc_{name}[{self.per_thread}];", 0)
            self.reg(f"rc_{name}", ctype)
            self.reg_len[f"rc_{name}"] = self.per_thread
        for seg in range(len(kr.segments)):
            for st in kr.segments[seg]:
                self.row_stmt(st)
            self.loop_index = seg
            if seg < len(kr.loops):
                accs = kr.accumulators[seg]
                for a in accs:
                    self.init_acc(a, 0)
                    for name, ctype in self.partial_values([a]):
                        self.reg(name, ctype)
                self.col_loop(kr.loops[seg], accs, 0, lo, hi, self.row_thread,
                              m.row_threads, unrolled=self.per_thread is not None)
                if accs:
                    self.reduce(accs)
        self.parts.append(self.lines)

    def build_split(self) -> None:
        """Launch `self.phase` of a split row (gpu/mapping.split_plan): block
        `block` runs slice `block % row_blocks` of row `begin + block /
        row_blocks`. It recomputes the row values of the segments before its
        loop, combining each finished reduction's partials from the
        workspace `ws_<acc>[row * row_blocks + slice]` in slice order; stores
        only what this launch completes; runs its loop over its slice; and
        leaves its block's partials in the workspace."""
        kr, m = self.k, self.m
        rb = m.row_blocks
        self.declare_extents(0)
        self.uniform, self.lines = self.lines, []
        self.lane_and_warp()
        self.decl("int64_t", "item", f"begin + block / {rb}")
        self.decl("int64_t", "slice", f"block % {rb}")
        self.sync(k.Guard("item < end"))
        self.decl("int64_t", "r", "item", const=False)
        self.row_offsets()
        self.decl("int64_t", "chunk", f"(n_cols + {rb - 1}) / {rb}")
        self.decl("int64_t", "col_lo", "slice * chunk < n_cols ? slice * chunk : n_cols")
        self.decl("int64_t", "col_hi", printer.bounded_end("col_lo", "chunk", "n_cols"))
        self.decl("int64_t", "wsi", f"(item - begin) * {rb}")
        for seg in range(self.phase + 1):
            if seg > 0:
                self.combine_partials(kr.accumulators[seg - 1])
            for st in kr.segments[seg]:
                if not (isinstance(st, k.Store) and seg != self.phase):
                    self.row_stmt(st)
        if self.phase < len(kr.loops):
            accs = kr.accumulators[self.phase]
            for a in accs:
                self.init_acc(a, 0)
                for name, ctype in self.partial_values([a]):
                    self.reg(name, ctype)
            self.col_loop(kr.loops[self.phase], accs, 0, "col_lo", "col_hi", "tid",
                          m.block_threads)
            if accs:
                self.reduce(accs)
                self.emit("if (tid == 0) { " + " ".join(
                    f"ws_{n}[wsi + slice] = {n};" for n, _ in self.partial_values(accs)) + " }",
                    0)
        self.parts.append(self.lines)

    def partial_values(self, accs) -> list:
        """(name, C type) of what a reduction leaves per slice: its
        accumulator, and the NaN flag of a floating max or min."""
        out = []
        for a in accs:
            out.append((f"a_{a.acc}", self.acc_type(a.dtype, a.kind)))
            if p.tracks_nan(a):
                out.append((f"n_{a.acc}", FLAG_TYPE))
        return out

    def combine_partials(self, accs) -> None:
        """A row's slices' partials, in slice order, into a_<acc> (and n_<acc>)."""
        steps = []
        for a in accs:
            for name, ctype in self.partial_values([a]):
                self.emit(f"{ctype} {name} = ws_{name}[wsi];", 0)
                self.reg(name, ctype)
            steps += fold_into(a, f"ws_a_{a.acc}[wsi + s_]", f"ws_n_{a.acc}[wsi + s_]")
        self.emit(f"for (int s_ = 1; s_ < {self.m.row_blocks}; ++s_) {{ " + " ".join(steps)
                  + " }", 0)

    def col_loop(self, stmts, accs, indent, lo, hi, first, step, unrolled=False) -> None:
        """The thread's columns: lo + first, then every `step`-th below hi.
        `unrolled`: the per_thread columns by a counter j, unrolled, so that
        arrays indexed by j (register-cached inputs) stay in registers."""
        e = self.emit
        start = lo if first == "0" else f"{lo} + {first}"
        if unrolled:
            if self.t.unroll_pragma:
                e(self.t.unroll_pragma, indent)
            e(f"for (int j = 0; j < {self.per_thread}; ++j) {{", indent)
            e(f"const int64_t cl = {start} + (int64_t)j * {step};", indent + 1)
            e(f"if (cl < {hi}) {{", indent + 1)
            indent += 2
        else:
            e(f"for (int64_t cl = {start}; cl < {hi}; cl += {step}) {{", indent)
            indent += 1
        self.col_body(stmts, accs, indent)
        if unrolled:
            e("}", indent - 1)
            indent -= 1
        e("}", indent - 1)

    def col_body(self, stmts, accs, indent) -> None:
        e = self.emit
        groups = self.k.col_groups
        if len(groups) == 1:
            e(f"const int64_t c{groups[0]} = cl;", indent)
        elif groups:  # cl is row-major over the column groups
            e("int64_t q = cl;", indent)
            for g in reversed(groups[1:]):
                e(f"const int64_t c{g} = q % g{g}; q /= g{g};", indent)
            e(f"const int64_t c{groups[0]} = q;", indent)
        self.body(stmts, accs, indent)

    def reduce(self, accs) -> None:
        """Warp xor tree, then (block per row) partials per warp through shared
        memory; afterwards every thread of the row holds the same result.
        A thread per row has its result already."""
        if self.m.row_threads == 1:
            return
        vals = self.partial_values(accs)
        combine = []   # templates of the other value: {a_<acc>}, {n_<acc>}
        for a in accs:
            combine += fold_into(a, "{a_%s}" % a.acc, "{n_%s}" % a.acc)
        off = WARP // 2
        while off >= 1:
            tmps = {name: f"x{off}_{name}" for name, _ in vals}
            self.sync(k.Shuffle(off, tuple((tmps[n], n, t) for n, t in vals),
                               tuple(c.format(**tmps) for c in combine)))
            off //= 2
        warps = self.m.warps_per_row
        if warps == 1:
            return
        for name, ctype in vals:
            self.shared.append((f"p_{name}", ctype, warps))
        self.emit("if (lane == 0) { " + " ".join(f"p_{n}[warp] = {n};" for n, _ in vals) + " }",
                  0)
        self.sync(k.Barrier())
        for name, _ in vals:
            self.emit(f"{name} = p_{name}[0];", 0)
        parts = {name: f"p_{name}[w]" for name, _ in vals}
        self.emit(f"for (int w = 1; w < {warps}; ++w) {{ "
                  + " ".join(c.format(**parts) for c in combine) + " }", 0)


def phase_bodies(plan: GpuPlan, target: Target) -> list:
    """One body, or one per launch of a split row."""
    if plan.mapping.row_blocks == 1:
        return [GpuBody(plan, target)]
    return [GpuBody(plan, target, p) for p in range(split_phases(plan.kernel))]


def split_workspace(plan: GpuPlan) -> list:
    """(name, C type) of the workspace arrays of a split row, in kernel
    parameter order: one element per (work item, slice) each."""
    if plan.mapping.row_blocks == 1:
        return []
    b = GpuBody(plan, CUDA, 0)
    return [(f"ws_{name}", ctype) for accs in plan.kernel.accumulators
            for name, ctype in b.partial_values(accs)]


def shared_union(bodies) -> list:
    seen: Dict[str, tuple] = {}
    for b in bodies:
        for name, ctype, count in b.shared:
            seen.setdefault(name, (name, ctype, count))
    return list(seen.values())


def _cuda_part_lines(b: GpuBody) -> list:
    out = []
    for part in b.parts:
        if isinstance(part, list):
            out += ["  " + line for line in part]
        elif isinstance(part, k.Barrier):
            out.append("  " + CUDA.barrier)
        elif isinstance(part, k.Guard):
            # Uniform per warp (block) where shuffles (barriers) follow.
            out.append("  " + CUDA.guard_exit.format(cond=part.cond))
        else:
            out.append("  {")
            for tmp, reg, ctype in part.exchanges:
                shfl = CUDA.shuffle_xor.format(v=reg, off=part.offset)
                out.append(f"    const {ctype} {tmp} = {shfl};")
            out += ["    " + c for c in part.combine]
            out.append("  }")
    return out


def print_cuda(plan: GpuPlan, n_ext: int) -> str:
    """The CUDA kernel `fs_kernel` (docs/KERNEL_ABI.md, "CUDA kernels"). A
    split row's kernel takes the launch `fs_phase` and its workspace after
    the extents, and runs that launch's body."""
    bodies = phase_bodies(plan, CUDA)
    b = bodies[0]
    kr, m = plan.kernel, plan.mapping
    params = ["const int64_t begin", "const int64_t end"]
    for i, tn in enumerate(kr.tensors):
        params.append(f"{'' if tn.is_output else 'const '}{CUDA.storage[tn.dtype]}* "
                      f"{CUDA.pointer_qualifier}t{i}")
    params += [f"const int64_t ext{a}" for a in range(n_ext)]
    if m.row_blocks > 1:
        params.append("const int fs_phase")
        params += [f"{ctype}* {name}" for name, ctype in split_workspace(plan)]
    head = (f"{CUDA.export} void {CUDA.launch_bounds.format(threads=m.block_threads)}"
            f"{KERNEL_NAME}(" + ", ".join(params) + ") {")
    out = [CUDA.prelude, head,
           f"  const int64_t ext[{n_ext}] = {{" + ", ".join(f"ext{a}" for a in range(n_ext))
           + "};"]
    out += ["  " + line for line in b.uniform]
    out += [f"  {CUDA.shared}{ctype} {name}[{count}];" for name, ctype, count in
            shared_union(bodies)]
    out += [f"  const int tid = {CUDA.thread_index};",
            f"  const int64_t block = {CUDA.block_index};"]
    if m.row_blocks == 1:
        out += _cuda_part_lines(b)
    else:
        for phase, body in enumerate(bodies):
            out.append(f"  if (fs_phase == {phase}) {{")
            out += ["  " + line for line in _cuda_part_lines(body)]
            out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


@dataclasses.dataclass
class _Phase:
    lines: list
    declared: set
    guarded: bool                  # threads past the last row skip it
    snapshot: tuple = ()           # regs copied to S_ arrays before the phase


def print_emulation(plan: GpuPlan, reverse_threads: bool = False) -> str:
    """fs_run (docs/KERNEL_ABI.md): the CUDA kernel's blocks, threads as loops.

    A phase runs its threads in one order, ascending or (`reverse_threads`)
    descending: a read of another thread's shared-memory write that lacks a
    barrier reads poison in at least one of the two orders. A split row's
    launches run one after another, each over all blocks of the call's rows,
    with the workspace local to the call (rows are independent)."""
    bodies = phase_bodies(plan, printer.CPP)
    m = plan.mapping
    nt = m.block_threads
    tid_loop = (f"for (int tid = {nt - 1}; tid >= 0; --tid) {{" if reverse_threads else
                f"for (int tid = 0; tid < {nt}; ++tid) {{")
    blocks = [_emulated_block(b, tid_loop, nt) for b in bodies]
    shared = shared_union(bodies)
    out = [printer.block_function(printer.CPP.export)]
    out += ["  " + line for line in printer.tensor_pointers(
        [(tn.dtype, tn.is_output) for tn in plan.kernel.tensors], printer.CPP)]
    out += ["  " + line for line in bodies[0].uniform]
    out.append("  // One block's shared memory, then its threads' registers that cross phases.")
    out += [f"  {ctype} {name}[{count}];" for name, ctype, count in shared]
    out.append(f"  bool R_fs_active[{nt}] = {{}};")
    declared = set()
    for _, decls in blocks:
        for d in decls:
            if d not in declared:
                declared.add(d)
                out.append("  " + d)
    if m.row_blocks == 1:
        out.append(f"  const int64_t n_blocks = end > begin ? (end - begin + "
                   f"{m.rows_per_block - 1}) / {m.rows_per_block} : 0;")
    else:
        out.append(f"  const int64_t n_blocks = end > begin ? (end - begin) * {m.row_blocks} : 0;")
        # Heap arrays, not std::vector: a kernel's code after the shared
        # prelude compiles inside a namespace in a library, where no
        # #include may stand (runtime/kernel_library.py).
        out += [f"  {ctype}* {name} = new {ctype}[n_blocks]();" for name, ctype in
                split_workspace(plan)]
    for body, _ in blocks:
        out.append("  for (int64_t block = 0; block < n_blocks; ++block) {")
        # Shared memory starts as NaN / -1 bytes in every block, as undefined as
        # CUDA's: a read before the write that a barrier should order shows up.
        out += [f"    std::memset({name}, 0xff, sizeof {name});" for name, _, _ in shared]
        out += ["    " + line for line in body]
        out.append("  }")
    if m.row_blocks > 1:
        out += [f"  delete[] {name};" for name, _ in split_workspace(plan)]
    out.append("}")
    return "\n".join(out) + "\n"


# A maximal run of word characters: a register name (an identifier) is used
# where it is one of them, as `\bname\b` would find it.
_WORD = re.compile(r"\w+")


def _emulated_block(b: GpuBody, tid_loop: str, nt: int) -> tuple:
    """(lines running one block of `b`, declarations of the per-thread arrays
    that carry registers across its phases and shuffles)."""
    phases: List[_Phase] = [_Phase([], set(), False)]
    guarded = False
    for index, part in enumerate(b.parts):
        if isinstance(part, list):
            phases[-1].lines += part
            phases[-1].declared |= {n for n, p in b.reg_part.items() if p == index}
        elif isinstance(part, k.Barrier):
            phases.append(_Phase([], set(), guarded))
        elif isinstance(part, k.Guard):
            phases[-1].lines += [f"const bool fs_active = {part.cond};",
                                 "R_fs_active[tid] = fs_active;", "if (!fs_active) continue;"]
            guarded = True
        else:
            lines = ["{"] + [f"  const {ct} {tmp} = S_{reg}[tid ^ {part.offset}];"
                             for tmp, reg, ct in part.exchanges]
            lines += ["  " + c for c in part.combine] + ["}"]
            phases.append(_Phase(lines, set(), guarded,
                                 tuple(reg for _, reg, _ in part.exchanges)))

    def uses(phase: _Phase) -> set:
        # The phase's words once, not a search per register: a block of a
        # large kernel has hundreds of each (EfficientNetV2B0's GPU rewrite
        # spent 6.4 s of 56 in those searches).
        words = set(_WORD.findall("\n".join(phase.lines)))
        return {n for n in b.regs if n in words} | set(phase.snapshot)

    def restore_line(n: str) -> str:
        if n in b.reg_len:  # a per-thread array (register-cached columns)
            return (f"{b.regs[n]} {n}[{b.reg_len[n]}]; "
                    f"for (int q_ = 0; q_ < {b.reg_len[n]}; ++q_) {n}[q_] = R_{n}[tid][q_];")
        return f"{b.regs[n]} {n} = R_{n}[tid];"

    def save_line(n: str) -> str:
        if n in b.reg_len:
            return f"for (int q_ = 0; q_ < {b.reg_len[n]}; ++q_) R_{n}[tid][q_] = {n}[q_];"
        return f"R_{n}[tid] = {n};"

    used = [uses(p) for p in phases]
    crossing = set()
    body = []
    declared_before: set = set()  # a name seen earlier (a prelude's o0) is another variable
    for i, phase in enumerate(phases):
        later = set().union(*used[i + 1:]) if i + 1 < len(phases) else set()
        live_in = (used[i] & declared_before) - phase.declared
        restore = sorted(live_in, key=list(b.regs).index)
        save = sorted((live_in | phase.declared) & later, key=list(b.regs).index)
        declared_before |= phase.declared
        crossing |= set(restore) | set(save)
        for reg in phase.snapshot:
            body.append(f"for (int t = 0; t < {nt}; ++t) S_{reg}[t] = R_{reg}[t];")
        body.append(tid_loop)
        if phase.guarded:
            body.append("  if (!R_fs_active[tid]) continue;")
        body += ["  " + restore_line(n) for n in restore]
        body += ["  " + line for line in phase.lines]
        body += ["  " + save_line(n) for n in save]
        body.append("}")
    snap = sorted({r for p in phases for r in p.snapshot}, key=list(b.regs).index)
    decls = [f"{b.regs[n]} R_{n}[{nt}]" + (f"[{b.reg_len[n]}];" if n in b.reg_len else ";")
             for n in b.regs if n in crossing]
    decls += [f"{b.regs[n]} S_{n}[{nt}];" for n in snap]
    return body, decls
