"""A packed kernel: several unconnected parts of one cluster in one launch
(the paper's kernel packing; docs/PAPERS.md, "Kernel packing").

Each part (fusion_ir.connected_parts) gets its own schedule and is printed
as an ordinary kernel under private names (`fs_shape_p<i>`, `fs_run_p<i>`).
The exported `fs_meta`, `fs_shape` and `fs_run` (docs/KERNEL_ABI.md) of the
pack combine them:

- `ext` holds every part's run-time extents one after another, then per
  part its number of work items, then per part its number of *chunks*;
- the pack's work items are the chunks: a part's items are cut into chunks
  of about equal estimated cost, so the thread pool's split of the pack's
  items (which assumes they cost alike) balances a large part against small
  ones; chunk `c` of a part with `n` items in `k` chunks runs its items
  `[c * n / k, (c + 1) * n / k)`;
- an input buffer may become an output only when a single part reads it.

No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
from typing import List

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir, printer, shape_fn
from tf_fusionstitch.runtime import kernel_library
from tf_fusionstitch.schedule import Schedule, UnsupportedCluster, build_schedule

# The pack's estimated cost (the parts' work items times their cost each) is
# cut into at most this many chunks, and no chunk is cheaper than
# MIN_CHUNK_COST (the thread pool's cost unit, about cycles): enough chunks
# to balance dozens of threads, few enough that a chunk's own overhead (its
# row buffers, its hoisted values) stays small.
MAX_CHUNKS = 64
MIN_CHUNK_COST = 20000


def generate_packed_cpp(cluster: ir.Cluster, parts: List[ir.Part]):
    """C++ source of a packed kernel and its parts' schedules."""
    parts, schedules = schedulable_parts(cluster, join_siblings(cluster, parts))
    # Parts that differ only in their values' names (an optimizer's update of
    # 36 same-shaped variables) share one run function: the source, and the
    # compiler's time, grow with the distinct parts only.
    body_of: dict = {}     # canonical part spec -> (body number, schedule, kernel)
    bodies = []            # per part: its (body number, schedule, kernel)
    for part in parts:
        local = _canonical(part.cluster)
        key = local.to_json()
        if key not in body_of:
            s = build_schedule(local)
            body_of[key] = (len(body_of), s, kernel_ir.lower(s, kernel_ir.cpu_lanes(s)))
        bodies.append(body_of[key])
    target = printer.CPP
    pieces = [printer.headers(target)]
    for n, s, kern in body_of.values():
        pieces.append(printer.print_kernel(kern, target, f"fs_run_p{n}", "static"))
        pieces.append(shape_fn.print_shape_fn(s, kern, "static", f"fs_shape_p{n}",
                                              caller_names_inputs=True))
    for i, (part, (n, _, _)) in enumerate(zip(parts, bodies)):
        names = ", ".join(f'"{name}"' for name, _ in part.cluster.inputs)
        pieces += [f"// part {i}: outputs {list(part.outputs)}, runs fs_run_p{n}",
                   f"static const int64_t fs_in_numbers_{i}[] = "
                   f"{{{', '.join(map(str, part.inputs)) or '0'}}};",
                   f"static const char* const fs_in_names_{i}[] = {{{names or '0'}}};"]
    local_schedules = [s for _, s, _ in bodies]
    n_ext = [shape_fn.num_ext(s) for s in local_schedules]
    ext_at = [sum(n_ext[:i]) for i in range(len(parts))]
    items_at = sum(n_ext)
    chunks_at = items_at + len(parts)
    pieces.append(shape_fn.format_meta(cluster, chunks_at + len(parts),
                                       _forward_pairs(parts, local_schedules), target.export))
    body = [n for n, _, _ in bodies]
    pieces.append(_shape_fn(cluster, parts, body, ext_at, items_at, chunks_at, target.export))
    pieces.append(_run_fn(cluster, parts, body, ext_at, items_at, chunks_at, target.export))
    pieces.append("")
    # Parts that differ only in their sizes print the same shared functions.
    return kernel_library.first_shared_only("\n".join(pieces)), tuple(schedules)


def _canonical(c: ir.Cluster) -> ir.Cluster:
    """`c` with its ops in a topological order of their own structure and its
    values renamed by position (inputs i0.., ops t0..): two parts with the
    same structure become the same spec, whatever order the graph listed
    their ops in."""
    digest = {name: f"i{k}" for k, (name, _) in enumerate(c.inputs)}
    for op in c.ops:   # what the op computes, from what: no names
        digest[op.name] = hashlib.sha256(repr(
            (op.prim, op.attrs, op.type, [digest[i] for i in op.inputs])).encode()).hexdigest()
    inputs = {name for name, _ in c.inputs}
    waiting = {op.name: len(set(op.inputs) - inputs) for op in c.ops}
    readers: dict = {}
    for op in c.ops:
        for i in set(op.inputs) - inputs:
            readers.setdefault(i, []).append(op)
    serial = itertools.count()   # ties: equal digests compute the same, any order will do
    ready = [(digest[op.name], next(serial), op) for op in c.ops if not waiting[op.name]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        _, _, op = heapq.heappop(ready)
        ordered.append(op)
        for r in readers.get(op.name, ()):
            waiting[r.name] -= 1
            if not waiting[r.name]:
                heapq.heappush(ready, (digest[r.name], next(serial), r))
    new = {name: f"i{k}" for k, (name, _) in enumerate(c.inputs)}
    new.update((op.name, f"t{j}") for j, op in enumerate(ordered))
    ops = tuple(dataclasses.replace(op, name=new[op.name], inputs=tuple(new[i] for i in op.inputs))
                for op in ordered)
    classes = tuple(sorted(tuple(sorted((new[name], d) for name, d in cls))
                           for cls in c.equal_dims))
    return ir.Cluster(tuple((new[name], t) for name, t in c.inputs), ops,
                      tuple(new[o] for o in c.outputs), classes)


def schedulable_parts(cluster: ir.Cluster, parts: List[ir.Part]):
    """The parts that write outputs, each with a schedule. A part that cannot
    be scheduled alone joins another part with which it can: a cluster that
    was legal as one kernel may still fall apart into pieces (a row-wise part
    needs the reduction of another to be a row value), and packing must not
    undo it. Raises UnsupportedCluster when a part fits nowhere."""
    parts = [p for p in parts if p.cluster.outputs]  # ops nothing reads do nothing
    while True:
        schedules: List[Schedule] = []
        for i, part in enumerate(parts):
            try:
                schedules.append(build_schedule(part.cluster))
            except UnsupportedCluster as alone:
                failed, reason = i, alone
                break
        else:
            return parts, schedules
        for j, other in enumerate(parts):
            if j == failed:
                continue
            joined = _join(cluster, parts[failed], other)
            try:
                build_schedule(joined.cluster)
            except UnsupportedCluster:
                continue
            parts[min(failed, j)] = joined
            del parts[max(failed, j)]
            break
        else:
            raise reason


# Primitives that keep their operands' broadcast shape.
_ELEMENTWISE = frozenset(ir.UNARY + ir.BINARY + ir.TERNARY + ir.CONSTANT)


def join_siblings(cluster: ir.Cluster, parts: List[ir.Part]) -> List[ir.Part]:
    """Sibling fusion: elementwise parts that read the same inputs become
    one part, whose loop reads those inputs once. Their iteration spaces are
    the broadcast of the same tensors, so they agree at run time even where
    a size is unknown here. A part with a reduction or a reshape that
    changes the shape is left apart (its space is not its inputs'), and so
    is a pair the schedule refuses as one."""
    out: List[ir.Part] = []
    for part in parts:
        for i, other in enumerate(out):
            if part.inputs and set(other.inputs) == set(part.inputs) \
                    and _elementwise(other) and _elementwise(part):
                joined = _join(cluster, other, part)
                try:
                    build_schedule(joined.cluster)
                except UnsupportedCluster:
                    continue
                out[i] = joined
                break
        else:
            out.append(part)
    return out


def _elementwise(part: ir.Part) -> bool:
    """Only elementwise ops, and reshapes that keep the shape (an Identity
    lowers to one): with at most one size unknown, the same shape is the
    same layout."""
    types = part.cluster.types()
    return all(op.prim in _ELEMENTWISE or op.prim == "reshape"
               and types[op.inputs[0]].shape == op.type.shape
               and sum(d is None for d in op.type.shape) <= 1
               for op in part.cluster.ops)


def _join(cluster: ir.Cluster, a: ir.Part, b: ir.Part) -> ir.Part:
    names = {op.name for op in a.cluster.ops + b.cluster.ops}
    ins = tuple(sorted(set(a.inputs) | set(b.inputs)))
    outs = tuple(sorted(set(a.outputs) | set(b.outputs)))
    sub = cluster.subset(ins, [op for op in cluster.ops if op.name in names], outs)
    return ir.Part(sub, ins, outs)


def _forward_pairs(parts, schedules) -> list:
    readers: dict = {}
    for p in parts:
        for i in p.inputs:
            readers[i] = readers.get(i, 0) + 1
    return [(p.outputs[j], p.inputs[i]) for p, s in zip(parts, schedules)
            for j, i in s.forward if readers[p.inputs[i]] == 1]


def _shape_fn(cluster, parts, body, ext_at, items_at, chunks_at, export) -> str:
    """`body[p]`: the number of the shape function part p runs."""
    types = cluster.types()
    in_offset = shape_fn.dim_offsets(t for _, t in cluster.inputs)
    out_offset = shape_fn.dim_offsets(types[o] for o in cluster.outputs)
    lines = [shape_fn.shape_fn_head(export),
             f"  int64_t cost[{len(parts)}], total = 0;"]
    for p, part in enumerate(parts):
        sub = part.cluster
        dims = [f"in_dims[{in_offset[i] + d}]" for i in part.inputs
                for d in range(cluster.inputs[i][1].rank)]
        n_out = sum(t.rank for t in (sub.types()[o] for o in sub.outputs))
        lines += [
            "  {",
            f"    const int64_t in[{max(len(dims), 1)}] = {{{', '.join(dims) or '0'}}};",
            f"    int64_t out[{max(n_out, 1)}], w[2] = {{0, 0}};",
            f"    if (fs_shape_p{body[p]}(in, out, ext + {ext_at[p]}, w, err, errlen, "
            f"fs_in_numbers_{p}, fs_in_names_{p})) return 1;",
        ]
        k = 0
        for j in part.outputs:
            for d in range(types[cluster.outputs[j]].rank):
                lines.append(f"    out_dims[{out_offset[j] + d}] = out[{k}];")
                k += 1
        lines += [f"    ext[{items_at + p}] = w[0];",
                  f"    cost[{p}] = w[0] * w[1];",
                  f"    total += cost[{p}];",
                  "  }"]
    lines += [
        # Chunks of about equal cost: the thread pool splits the pack's items
        # evenly, as if each cost work[1].
        f"  const int64_t quantum = total / {MAX_CHUNKS} > {MIN_CHUNK_COST} ? "
        f"total / {MAX_CHUNKS} : {MIN_CHUNK_COST};",
        "  int64_t chunks = 0;",
        f"  for (int p = 0; p < {len(parts)}; ++p) {{",
        f"    const int64_t items = ext[{items_at} + p];",
        "    int64_t c = (cost[p] + quantum - 1) / quantum;",
        "    c = items == 0 ? 0 : c < 1 ? 1 : c > items ? items : c;",
        f"    ext[{chunks_at} + p] = c;",
        "    chunks += c;",
        "  }",
        "  work[0] = chunks;",
        "  work[1] = chunks ? total / chunks + 1 : 1;",
        "  (void)in_dims; (void)out_dims;",
        "  return 0;",
        "}",
    ]
    return "\n".join(lines)


def _run_fn(cluster, parts, body, ext_at, items_at, chunks_at, export) -> str:
    """`body[p]`: the number of the run function part p runs (as in _shape_fn)."""
    lines = [printer.block_function(export),
             "  int64_t first = 0;  // the pack's first item (chunk) of the part"]
    for p, part in enumerate(parts):
        bufs = [f"bufs[{i}]" for i in part.inputs]
        bufs += [f"bufs[{len(cluster.inputs) + j}]" for j in part.outputs]
        lines += [
            "  {",
            f"    const int64_t items = ext[{items_at + p}], chunks = ext[{chunks_at + p}];",
            "    const int64_t lo = begin > first ? begin : first;",
            "    const int64_t hi = end < first + chunks ? end : first + chunks;",
            "    if (lo < hi) {",
            f"      void* const part_bufs[{len(bufs)}] = {{{', '.join(bufs)}}};",
            f"      fs_run_p{body[p]}((lo - first) * items / chunks, (hi - first) * items / chunks, "
            f"ext + {ext_at[p]}, part_bufs);",
            "    }",
            "    first += chunks;",
            "  }",
        ]
    lines += ["}"]
    return "\n".join(lines)
