"""A kernel of segment sums: TF's UnsortedSegmentSum, with the elementwise ops
that compute what it sums, in one pass over the rows.

An embedding's gradient reaches its optimizer as `UnsortedSegmentSum(rows,
ids, n)`: a zero tensor of the whole table with every row of the batch's
gradient added into the row its id names (DIEN: 12928 rows of 18 into a
100000 x 18 table, twice per step, for Adam's first and second moments).
TF's CPU kernel does that one row at a time on one thread.

A scatter cluster (`scatter_form`) is segment sums that share one ids input
and size, of values that elementwise ops compute from the cluster's inputs,
row by row (the *rows* cluster). Its kernel splits the output's segments
into blocks, one work item each: an item zeroes its segments, then walks
all the ids in order and, for those in its block, computes the row's values
and adds them in. Items write disjoint segments, and every segment adds its
rows in the order TF's kernel does (increasing row index), so results are
TF's, bit for bit. A row whose id is negative is dropped, as TF drops it; an
id past the last segment is an error, which `fs_check_inputs` reports before
anything runs (docs/KERNEL_ABI.md).

The rows cluster is elementwise over [rows, columns] (a rank-2 sum) with
inputs of that shape, of its columns alone, or scalars; run-time broadcasting
of the rows is not taken (the rewriter proves the rows' sizes equal). CPU only:
the CUDA target leaves these clusters to TensorFlow. No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Tuple

from tf_fusionstitch import fusion_ir as ir
from tf_fusionstitch.codegen import kernel_ir as k
from tf_fusionstitch.codegen import printer, shape_fn
from tf_fusionstitch.schedule import UnsupportedCluster

# Segments per work item: enough work per item to amortise a walk over all the
# ids (each item reads every id once), few enough items to spread over threads.
ELEMENTS_PER_ITEM = 1 << 16
MAX_ITEMS = 64


@dataclasses.dataclass(frozen=True)
class ScatterForm:
    cluster: ir.Cluster
    rows: ir.Cluster          # the summed values, as a cluster of their own
    ids: str                  # the cluster input holding the segment ids
    num_segments: int
    summed: Tuple[str, ...]   # per cluster output: the rows cluster's value it sums


def is_scatter(cluster: ir.Cluster) -> bool:
    return any(op.prim in ir.SCATTER for op in cluster.ops)


def scatter_form(cluster: ir.Cluster) -> ScatterForm:
    """The cluster as segment sums of row values; UnsupportedCluster when it
    is not of that form."""
    sums = [op for op in cluster.ops if op.prim in ir.SCATTER]
    if not sums:
        raise UnsupportedCluster("no segment sum")
    inputs = dict(cluster.inputs)
    ids = {op.inputs[1] for op in sums}
    sizes = {op.attr("num_segments") for op in sums}
    if len(ids) != 1 or len(sizes) != 1 or next(iter(ids)) not in inputs:
        raise UnsupportedCluster("segment sums of one kernel share their ids (an input) "
                                 "and number of segments")
    ids_name = next(iter(ids))
    names = {op.name for op in sums}
    if set(cluster.outputs) != names:
        raise UnsupportedCluster("a scatter kernel's outputs are its segment sums alone")
    if any(ids_name in op.inputs or names & set(op.inputs)
           for op in cluster.ops if op.name not in names):
        raise UnsupportedCluster("nothing in a scatter kernel reads the ids or a sum")
    types = cluster.types()
    shape = types[sums[0].inputs[0]].shape
    if len(shape) != 2 or any(types[op.inputs[0]].shape != shape for op in sums):
        raise UnsupportedCluster("segment sums of one kernel sum matrices of one shape")
    rows_n, cols = shape
    if types[ids_name].shape[0] not in (rows_n, None) and rows_n is not None:
        raise UnsupportedCluster("segment ids and summed rows differ in number")
    for name, t in cluster.inputs:
        if name != ids_name and t.shape not in ((rows_n, cols), (cols,), (1, cols), ()):
            raise UnsupportedCluster(f"input {name}{list(t.shape)} is not a row, a column "
                                     "vector or a scalar of the summed matrix")
    _check_rows_equal(cluster, ids_name)
    ops = [op for op in cluster.ops if op.name not in names]
    for op in ops:
        if op.prim in ir.REDUCE or op.prim == "broadcast_to" or op.prim in ir.SCATTER or (
                op.prim == "reshape" and types[op.inputs[0]].shape != op.type.shape):
            raise UnsupportedCluster(f"{op.prim} in the rows of a scatter kernel")
        if op.type.shape not in ((rows_n, cols), (cols,), (1, cols), ()):
            raise UnsupportedCluster(f"value {op.name}{list(op.type.shape)} in the rows")
    summed, copies = [], []
    for op in sorted(sums, key=lambda o: cluster.outputs.index(o.name)):
        value = op.inputs[0]
        if value in inputs:   # an input summed as it is: a copy makes it a value
            copy = f"{value}_rows"
            if copy not in {c.name for c in copies}:
                copies.append(ir.make_op(copy, "reshape", [value], inputs[value],
                                         shape=list(inputs[value].shape)))
            value = copy
        summed.append(value)
    rows = ir.Cluster(tuple(i for i in cluster.inputs if i[0] != ids_name),
                      tuple(ops + copies), tuple(dict.fromkeys(summed)),
                      tuple(c for c in cluster.equal_dims
                            if all(m[0] != ids_name for m in c)))
    return ScatterForm(cluster, rows, ids_name, next(iter(sizes)), tuple(summed))


def _check_rows_equal(cluster: ir.Cluster, ids: str) -> None:
    """Every input that runs along the rows has the ids' number of rows,
    statically or by a proof (equal_dims): the kernel takes no run-time
    broadcast of a row count that TF would broadcast."""
    types = dict(cluster.inputs)
    counts = [(ids, 0)] + [(n, 0) for n, t in cluster.inputs
                           if n != ids and t.rank == 2 and t.shape[0] != 1]
    static = {types[n].shape[0] for n, _ in counts} - {None}
    dynamic = [m for m in counts if types[m[0]].shape[0] is None]
    proven = not dynamic or (not static and (len(dynamic) == 1 or any(
        set(dynamic) <= set(c) for c in cluster.equal_dims)))
    if len(static) > 1 or not proven:
        raise UnsupportedCluster("the rows of a scatter kernel's inputs are not proven to "
                                 "be as many as its ids")


def generate_scatter_cpp(cluster: ir.Cluster) -> str:
    """C++ source of a scatter kernel (docs/KERNEL_ABI.md)."""
    form = scatter_form(cluster)
    c = cluster
    types = c.types()
    out_dtype = [types[o].dtype for o in c.outputs]
    target = printer.CPP
    n_ext = 4   # rows, columns, segments, segments per work item
    pieces = [printer.headers(target),
              shape_fn.format_meta(c, n_ext, [], target.export),
              _shape_fn(form, target.export),
              _check_fn(form, target),
              _run_fn(form, out_dtype, target),
              ""]
    return "\n".join(pieces)


def _input_index(form: ScatterForm) -> Dict[str, int]:
    return {n: i for i, (n, _) in enumerate(form.cluster.inputs)}


def _wanted_dims(t: ir.TensorType) -> List[str]:
    """The extents an input of a segment sum's rows must have: a row per id
    (or one row, broadcast), a row's columns, or nothing for a scalar (a
    learning rate that scales the rows)."""
    if t.rank == 2:
        return ["n_rows", "n_cols"] if t.shape[0] != 1 else ["1", "n_cols"]
    return ["n_cols"] if t.rank == 1 else []


def _element_index(t: ir.TensorType) -> str:
    """Where row r, column c of the summed rows is in an input of this type."""
    if t.rank == 2:
        return "r * n_cols + c" if t.shape[0] != 1 else "c"
    return "c" if t.rank == 1 else "0"


def _shape_fn(form: ScatterForm, export: str) -> str:
    c = form.cluster
    out_dtype = [c.types()[o].dtype for o in c.outputs]
    cols = form.rows.types()[form.summed[0]].shape[1]
    lines = [shape_fn.shape_fn_head(export)]
    offsets = dict(zip((name for name, _ in c.inputs),
                       shape_fn.dim_offsets(t for _, t in c.inputs)))
    lines.append(f"  const int64_t n_rows = in_dims[{offsets[form.ids]}];")
    col_source = next(((n, t.rank - 1) for n, t in c.inputs
                       if n != form.ids and t.rank and t.shape[-1] is None), None)
    if cols is not None:
        lines.append(f"  const int64_t n_cols = {cols};")
    elif col_source is not None:
        lines.append(f"  const int64_t n_cols = in_dims[{offsets[col_source[0]] + col_source[1]}];")
    else:
        raise UnsupportedCluster("the summed rows' width is known from no input")
    for number, (name, t) in enumerate(c.inputs):
        if name == form.ids:
            continue
        want = _wanted_dims(t)
        cond = " || ".join(f"in_dims[{offsets[name] + d}] != {w}" for d, w in enumerate(want))
        if not cond:
            continue
        lines += shape_fn.shape_error(cond, f"in_dims + {offsets[name]}", [str(w) for w in want],
                                      str(number), f'"{name}"',
                                      "the rows of a segment sum and their ids")
    segments = form.num_segments
    per_element = shape_fn.element_cost(_row_statements(form))
    lines += [f"  const int64_t n_segments = {segments};",
              "  const int64_t total = n_segments * n_cols;",
              f"  int64_t items = total / {ELEMENTS_PER_ITEM};",
              f"  items = items < 1 ? 1 : (items > {MAX_ITEMS} ? {MAX_ITEMS} : items);",
              "  items = items > n_segments ? (n_segments > 0 ? n_segments : 1) : items;",
              "  const int64_t per_item = (n_segments + items - 1) / items;",
              "  ext[0] = n_rows; ext[1] = n_cols; ext[2] = n_segments; ext[3] = per_item;"]
    pos = 0
    for _ in c.outputs:
        lines.append(f"  out_dims[{pos}] = n_segments; out_dims[{pos + 1}] = n_cols;")
        pos += 2
    # An item zeroes its segments, walks every id, and computes its rows' values.
    zeroing = shape_fn.BYTE_COST * sum(ir.DTYPE_BYTES[t] for t in out_dtype)
    lines += ["  work[0] = n_segments > 0 ? (n_segments + per_item - 1) / per_item : 0;",
              "  const int64_t rows_per_item = n_rows / (work[0] > 0 ? work[0] : 1);",
              f"  work[1] = 16 + n_rows + (per_item * n_cols * {zeroing} + rows_per_item * n_cols"
              f" * {per_element}) / {shape_fn.COST_SCALE};",
              "  (void)in_dims; (void)err; (void)errlen;", "  return 0;", "}"]
    return "\n".join(lines)


def _check_fn(form: ScatterForm, target) -> str:
    """Ids past the last segment are TF's InvalidArgument, before any write."""
    i = _input_index(form)[form.ids]
    ids_t = target.storage[dict(form.cluster.inputs)[form.ids].dtype]
    return "\n".join([
        f"{target.export} int fs_check_inputs(const int64_t* ext, void* const* bufs, char* err, "
        "int64_t errlen) {",
        f"  const {ids_t}* ids = static_cast<const {ids_t}*>(bufs[{i}]);",
        "  for (int64_t r = 0; r < ext[0]; ++r) {",
        "    if (ids[r] >= ext[2]) {",
        "      char msg[256];",
        '      std::snprintf(msg, sizeof msg, "segment_ids[%lld] = %lld is out of range [0, '
        '%lld)", (long long)r, (long long)ids[r], (long long)ext[2]);',
        "      return fs_fail(err, errlen, msg);",
        "    }",
        "  }",
        "  return 0;",
        "}"])


def _row_statements(form: ScatterForm) -> List:
    """The rows cluster's loads and computes for one element, as kernel IR
    statements (every value is read per element: column vectors and
    scalars too, which stay in cache)."""
    rows = form.rows
    types = rows.types()
    index = {n: i for i, (n, _) in enumerate(form.cluster.inputs)}
    ops = rows.op_by_name()
    body: List = []
    defined = set()
    for value in form.summed:
        for v in k.operands_first(value, ops, defined.__contains__, index.__contains__):
            body.append(k.Load(k.value_name(v), index[v], types[v].dtype) if v in index
                        else k.compute(ops[v], types))
            defined.add(v)
    return body


def _run_fn(form: ScatterForm, out_dtype: List[str], target) -> str:
    c = form.cluster
    lines = [printer.block_function(target.export)]
    tensors = [(t.dtype, False) for _, t in c.inputs] + [(d, True) for d in out_dtype]
    lines += ["  " + line for line in printer.tensor_pointers(tensors, target)]
    n_in = len(c.inputs)
    ids = f"t{_input_index(form)[form.ids]}"
    lines += ["  const int64_t n_rows = ext[0], n_cols = ext[1], n_segments = ext[2];",
              "  const int64_t per_item = ext[3];",
              "  for (int64_t item = begin; item < end; ++item) {",
              "    const int64_t lo = item * per_item;",
              "    const int64_t hi = lo + per_item < n_segments ? lo + per_item : n_segments;"]
    for j, dtype in enumerate(out_dtype):
        lines.append(f"    std::memset(t{n_in + j} + lo * n_cols, 0, "
                     f"(hi - lo) * n_cols * sizeof({target.storage[dtype]}));")
    lines += ["    for (int64_t r = 0; r < n_rows; ++r) {",
              f"      const int64_t s = static_cast<int64_t>({ids}[r]);",
              "      if (s < lo || s >= hi) continue;   // another item's, or dropped (< 0)",
              "      " + target.simd_pragma.format(clauses=""),
              "      for (int64_t c = 0; c < n_cols; ++c) {"]
    for st in _row_statements(form):
        if isinstance(st, k.Load):
            name, t = c.inputs[st.tensor]
            where = _element_index(t)
            value = printer.load_value(f"t{st.tensor}[{where}]", st.dtype, target)
        else:
            value = printer.expression(st, target)
        lines.append("        " + printer.definition(st.dst, st.dtype, value))
    for j, value in enumerate(form.summed):
        out = f"t{n_in + j}[s * n_cols + c]"
        dtype = out_dtype[j]
        total = printer.store_value(f"{printer.load_value(out, dtype, target)} + "
                                    f"{k.value_name(value)}", dtype, target)
        lines.append(f"        {out} = {total};")
    lines += ["      }", "    }", "  }", "}"]
    return "\n".join(lines)
