"""A training step's GraphDef cut for gradient accumulation over micro-batches. TF-free.

A step is forward, backward and variable writes (the optimizer's update). `split` cuts its
GraphDef in two at the *frontier*, the values the writes are computed from that depend
on the step's arguments:

- `compute`: everything the outputs and the frontier need, no write. It runs once per
  micro-batch.
- `update`: the writes and what they need besides the frontier, which they read from
  placeholders instead. It runs once, fed with the frontier's mean over the micro-batches.

The frontier is where each path from the arguments first loses the batch axis: the
gradients (and batch statistics). That is one step on the whole batch when those are means
over the batch (the gradient of a mean loss, as the planner's cost model assumes): the
optimizer's arithmetic, linear or not, runs once in the update on their mean.

`pipelined` merges the pieces' compute parts into one GraphDef whose control edges make
each pipeline stage run its micro-batches' forwards and backwards in a `schedule` (GPipe
or 1F1B). Works on GraphDef protobufs only, as `Plan.apply` does.
"""

import dataclasses

from tf_fusionstitch import fusion_ir
from tf_fusionstitch.planner import ir, op_rules


@dataclasses.dataclass
class Split:
    compute: object            # GraphDef
    update: object             # GraphDef
    frontier: list             # tensor names ("node:port") the writes read, per micro-batch
    placeholders: list         # the update's placeholder node per frontier tensor
    writes: list               # node names of the variable writes


def _node_of(name):
    return name.lstrip("^").split(":")[0]


def _tensor_of(name):
    """A NodeDef data input ("node" or "node:1") as a tensor name ("node:0", "node:1")."""
    return name if ":" in name else name + ":0"


def _ancestors(nodes, starts, follow):
    """Names of `starts` and every node they reach through the inputs `follow(node, input)`
    accepts."""
    seen, stack = set(), list(starts)
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for inp in nodes[name].input:
            if follow(nodes[name], inp):
                stack.append(_node_of(inp))
    return seen


def _descendants(graph_def, starts):
    consumers = {}
    for node in graph_def.node:
        for inp in node.input:
            consumers.setdefault(_node_of(inp), []).append(node.name)
    seen, stack = set(), list(starts)
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(consumers.get(name, ()))
    return seen


def _subgraph(graph_def, keep, renamed=None):
    """The nodes `keep` of `graph_def`, data inputs renamed by `renamed` (tensor name -> node
    name), inputs from nodes left out dropped (only control inputs are: see `split`)."""
    renamed = renamed or {}
    out = type(graph_def)()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in keep:
            copy = out.node.add()
            copy.CopyFrom(node)
            del copy.input[:]
            inputs = [inp if inp.startswith("^") else renamed.get(_tensor_of(inp), inp)
                      for inp in node.input]
            copy.input.extend(i for i in inputs if _node_of(i) in keep or
                              i in renamed.values())
    return out


def split(graph_def, args, outputs, dtype_of, batch_axes):
    """Cuts `graph_def` (a step with argument placeholders `args`, output tensors `outputs`,
    tensor names) at the frontier. `dtype_of(tensor name)` is the tensor's DataType enum,
    for the update's placeholders; `batch_axes` (batch_axes.BatchAxes) tells which axes of
    a tensor, or of a fused kernel's values, run along the batch.
    Raises ValueError when an output or a frontier tensor depends on a write (the step
    would read its own update), or a write reads a value per example."""
    nodes = {node.name: node for node in graph_def.node}
    writes = [n.name for n in graph_def.node if op_rules.writes_variable(n.op)]
    data_dependent = _descendants(graph_def, [_node_of(a) for a in args])
    after_writes = _descendants(graph_def, writes)
    frontier = _frontier(nodes, writes, set(_node_of(a) for a in args), data_dependent,
                         after_writes, batch_axes)
    # Control inputs on the writes (tf.function makes its outputs wait for every stateful
    # op) belong to the whole step, not to a micro-batch: the update runs after them all.
    compute = _ancestors(nodes, [_node_of(t) for t in frontier + list(outputs)],
                         lambda node, inp: not (inp.startswith("^") and
                                                _node_of(inp) in after_writes))
    reading_writes = sorted(compute.intersection(writes))
    if reading_writes:
        raise ValueError(f"the step's outputs or gradients depend on its variable writes "
                         f"{reading_writes[:3]}: it cannot run in micro-batches")
    cut = set(frontier)
    # The update's reads of what the compute part holds are only ordered after it (the
    # caller feeds the variables' handles after every micro-batch): control inputs into
    # the compute part are dropped, data inputs other than the frontier kept.
    update = _ancestors(nodes, writes, lambda node, inp: _tensor_of(inp) not in cut and not (
        inp.startswith("^") and _node_of(inp) in compute))
    placeholders = [f"micro_batch_mean_{i}" for i in range(len(frontier))]
    renamed = dict(zip(frontier, placeholders))
    update_def = _subgraph(graph_def, update, renamed)
    for tensor, name in renamed.items():
        node = update_def.node.add()
        node.name, node.op = name, "Placeholder"
        node.device = nodes[_node_of(tensor)].device
        node.attr["dtype"].type = dtype_of(tensor)
    return Split(_subgraph(graph_def, compute), update_def, frontier, placeholders, writes)


def _frontier(nodes, writes, arg_nodes, data_dependent, after_writes, batch_axes):
    """The tensors the writes' computation reads from the pieces, walking back from the
    writes: each path from the arguments ends at its first value without a batch axis (a
    mean over the batch: a gradient, batch statistics), or at an argument the pieces share.
    Everything between those and the writes (an optimizer's arithmetic, nonlinear as
    Adam's square of the gradient is; a slot read after its write) is the update's, so it
    runs once on the frontier's mean, as on the whole batch. Where `batch_axes` cannot
    tell, the walk refuses to cut."""
    def unknown(what):
        return ValueError(f"whether {what} has an axis along the batch cannot be told: the "
                          "step cannot run in pieces of the batch")

    def batch(tensor):
        axes = batch_axes.of(tensor)
        if axes is None:
            raise unknown(tensor)
        return bool(axes)

    def a_mean(tensor):
        node = nodes[_node_of(tensor)]
        data = [i for i in node.input if not i.startswith("^")]
        if batch(tensor) or not any(batch(_tensor_of(t)) for t in data):
            return False
        if node.op in _SIZE_OPS:
            raise ValueError(f"the variable writes read {tensor}, the batch's size (a count of "
                             "examples?), which a piece would give as its own: the step "
                             "cannot run in pieces of the batch")
        if node.op == "FusionStitch":
            inside = batch_axes.kernel_values(node.name)
            if None in inside.values():
                raise unknown(f"a value of the fused kernel {node.name}")
            _check_affine(node, tensor, [_node_of(t) in data_dependent for t in data],
                          {v for v, axes in inside.items() if axes})
        return True

    frontier = []

    def follow(node, inp):
        src = _node_of(inp)
        if inp.startswith("^"):   # ordering among the writes stays in the update
            return src in after_writes
        tensor = _tensor_of(inp)
        if src in after_writes or src not in data_dependent:
            return True
        if src in arg_nodes or a_mean(tensor):
            if tensor not in frontier:
                frontier.append(tensor)
            return False
        if batch(tensor):
            raise ValueError(f"the variable write {node.name} depends on {tensor}, a value per "
                             "example rather than a mean over the batch (a sparse update?): "
                             "the step cannot run in pieces of the batch")
        return True
    _ancestors(nodes, writes, follow)
    return frontier


# Ops that read a tensor's size, not its values: a piece's is not the whole batch's.
_SIZE_OPS = frozenset({"Shape", "ShapeN", "Size"})

# Beyond the batch's reduction a value stays affine in the means it reads through these
# primitives (those of _ANY_OPERAND in every operand, the others in the one operand named,
# the rest fixed for the batch), so the mean of the pieces' values is the whole batch's.
_ANY_OPERAND = frozenset({"add", "sub", "neg", "reduce_sum", "reduce_mean", "reshape",
                          "broadcast_to", "transpose"})
_ONE_OPERAND = {"mul": None, "div": 0, "div_no_nan": 0}   # None: either one
# How a fused kernel sums over the batch: a reduction, a segment sum (an embedding's
# gradient over the batch's ids), or, in pieces of one example, a reshape that drops it.
_BATCH_REDUCTIONS = frozenset({"reduce_sum", "reduce_mean", "segment_sum", "reshape"})


def _check_affine(node, tensor, moving_inputs, batch_values):
    """Raises ValueError unless `tensor`, an output of the fused kernel `node`, is a mean:
    affine in the sums over the batch the kernel takes (of its values `batch_values`, which
    have an axis along the batch) and in its inputs that depend on the step's arguments
    (`moving_inputs`, per data input). Anything may happen per example before the sum; a
    kernel that squares a gradient after summing it (an optimizer fused with its
    gradient's sum) computes no mean of the pieces."""
    cluster = fusion_ir.Cluster.from_json(node.attr["spec"].s.decode("utf-8"))
    moving = {name for (name, _), m in zip(cluster.inputs, moving_inputs) if m}
    affine = moving - batch_values
    for op in cluster.ops:
        if op.name in batch_values:   # per example: anything goes
            moving.add(op.name)
            continue
        reads = [k for k, i in enumerate(op.inputs) if i in moving]
        if not reads:
            continue
        moving.add(op.name)
        if any(op.inputs[k] in batch_values for k in reads):   # the sum over the batch
            ok = op.prim in _BATCH_REDUCTIONS and all(
                op.inputs[k] in affine or op.inputs[k] in batch_values for k in reads)
        elif op.prim in _ANY_OPERAND or (op.prim == "cast" and
                                         op.type.dtype in fusion_ir.FLOAT_DTYPES):
            ok = all(op.inputs[k] in affine for k in reads)
        elif op.prim in _ONE_OPERAND:
            which = _ONE_OPERAND[op.prim]
            ok = len(reads) == 1 and (which is None or reads == [which]) and \
                op.inputs[reads[0]] in affine
        elif op.prim == "select":   # a fixed choice between values
            ok = 0 not in reads and all(op.inputs[k] in affine for k in reads)
        else:
            ok = False
        if ok:
            affine.add(op.name)
    output = cluster.outputs[int(tensor.split(":")[1])]
    if output in moving and output not in affine:
        raise ValueError(f"the fused kernel {node.name} computes {tensor}, which the variable "
                         "writes read, from a sum over the batch through a nonlinear op (an "
                         "optimizer's arithmetic fused with its gradient's sum): the pieces' "
                         "mean of it is not the whole batch's value, so the step cannot run "
                         "in pieces of the batch; parallelize it before optimizing it")


SCHEDULES = ("gpipe", "1f1b")


def schedule(kind, stages, micro_batches):
    """Per pipeline stage, the order its (micro-batch, phase) groups run in, phase "forward"
    or "backward": "gpipe" runs every forward, then every backward; "1f1b" lets stage s run
    `stages - s - 1` forwards to fill the pipeline, then one forward and one backward in
    turn, then the backwards left."""
    if kind not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {kind!r}; use one of {SCHEDULES}")
    forward, backward = ir.FORWARD, ir.BACKWARD
    orders = []
    for s in range(stages):
        if kind == "gpipe":
            order = [(i, forward) for i in range(micro_batches)]
            order += [(i, backward) for i in range(micro_batches)]
        else:
            warm = min(stages - s - 1, micro_batches)
            order = [(i, forward) for i in range(warm)]
            for i in range(micro_batches - warm):
                order += [(warm + i, forward), (i, backward)]
            order += [(i, backward) for i in range(micro_batches - warm, micro_batches)]
        orders.append(order)
    return orders


def _prefixed(node, prefix):
    copy = type(node)()
    copy.CopyFrom(node)
    copy.name = prefix + node.name
    del copy.input[:]
    copy.input.extend(("^" + prefix + inp[1:]) if inp.startswith("^") else prefix + inp
                      for inp in node.input)
    if "_class" in node.attr:   # colocation with other nodes of the same piece
        del copy.attr["_class"].list.s[:]
        copy.attr["_class"].list.s.extend(
            b"loc:@" + prefix.encode() + c[len(b"loc:@"):] if c.startswith(b"loc:@") else c
            for c in node.attr["_class"].list.s)
    return copy


def pipelined(pieces, micro_batches, group_of, orders):
    """One GraphDef of every piece's compute part, piece k's nodes named "micro_batch_k/..."
    (piece k is micro-batch k % `micro_batches` of replica k // `micro_batches`), with
    control edges that make each stage of each replica run its groups of nodes in `orders`
    (`schedule`): between consecutive groups, a NoOp that waits for every node of the first
    and that every node of the second waits for.

    pieces: the compute GraphDef of each piece. group_of(node name): (stage, phase) of a
    node of the step, or None for nodes left unordered (placeholders, which are fed).
    """
    merged = type(pieces[0])()
    merged.versions.CopyFrom(pieces[0].versions)
    merged.library.CopyFrom(pieces[0].library)
    members, nodes = {}, {}
    for k, piece in enumerate(pieces):
        prefix = f"micro_batch_{k}/"
        replica, micro_batch = divmod(k, micro_batches)
        for node in piece.node:
            copy = merged.node.add()
            copy.CopyFrom(_prefixed(node, prefix))
            nodes[copy.name] = copy
            group = group_of(node.name) if node.op != "Placeholder" else None
            if group is not None:
                stage, phase = group
                phase = ir.FORWARD if phase == ir.FORWARD else ir.BACKWARD
                members.setdefault((replica, stage, micro_batch, phase), []).append(copy.name)
    replicas = len(pieces) // micro_batches
    for replica in range(replicas):
        for stage, order in enumerate(orders):
            groups = [members[(replica, stage) + step] for step in order
                      if (replica, stage) + step in members]
            for j, (first, second) in enumerate(zip(groups, groups[1:])):
                barrier = merged.node.add()
                barrier.name = f"pipeline_schedule/replica_{replica}/stage_{stage}/{j}"
                barrier.op = "NoOp"
                barrier.device = nodes[first[0]].device
                barrier.input.extend("^" + name for name in first)
                for name in second:
                    nodes[name].input.append("^" + barrier.name)
    return merged
