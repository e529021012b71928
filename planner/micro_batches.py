"""A training step's GraphDef cut for gradient accumulation over micro-batches. TF-free.

A step is forward, backward and variable writes (the optimizer's update). `split` cuts its
GraphDef in two at the *frontier*: the data inputs of the writes that depend on the step's
arguments (the gradients, or what the update is computed from):

- `compute`: everything the outputs and the frontier need, no write. It runs once per
  micro-batch.
- `update`: the writes and what they need besides the frontier, which they read from
  placeholders instead. It runs once, fed with the frontier's mean over the micro-batches.

That is one step on the whole batch when the frontier is a mean over the batch (the
gradient of a mean loss, as the planner's cost model assumes) and the update is linear in
it up to the writes (Adam's `ResourceApplyAdam` takes the gradient itself; SGD's
`assign_sub(lr * g)` scales it).

`pipelined` merges the pieces' compute parts into one GraphDef whose control edges make
each pipeline stage run its micro-batches' forwards and backwards in a `schedule` (GPipe
or 1F1B). Works on GraphDef protobufs only, as `Plan.apply` does.
"""

import dataclasses

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


def split(graph_def, args, outputs, dtype_of):
    """Cuts `graph_def` (a step with argument placeholders `args`, output tensors `outputs`,
    tensor names) at the frontier. `dtype_of(tensor name)` is the tensor's DataType enum,
    for the update's placeholders. Raises ValueError when an output or a frontier tensor
    depends on a write (the step would read its own update)."""
    nodes = {node.name: node for node in graph_def.node}
    writes = [n.name for n in graph_def.node if op_rules.writes_variable(n.op)]
    data_dependent = _descendants(graph_def, [_node_of(a) for a in args])
    frontier = []
    for name in writes:
        for inp in nodes[name].input:
            if not inp.startswith("^") and _node_of(inp) in data_dependent and \
                    _tensor_of(inp) not in frontier:
                frontier.append(_tensor_of(inp))
    # Control inputs on the writes (tf.function makes its outputs wait for every stateful
    # op) belong to the whole step, not to a micro-batch: the update runs after them all.
    after_writes = _descendants(graph_def, writes)
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
