"""Run a plan: one training step of a tf.function on TensorFlow's own distributed engine.

`planner.parallelize` (in the package's `__init__`) traces the step and searches a plan;
`build` here turns step and plan into a `ParallelStep`, a callable with the step's calling
convention:

- A plan of d replicas x t-way tensor parallelism runs under DTensor: a ("batch" d) x
  ("model" t) mesh of logical CPU devices, every variable copied into a DVariable sharded as
  the plan splits it (`layouts`), step inputs sharded on "batch". The step's own GraphDef is
  imported into a new tf.function with its captured variable handles mapped to the
  DVariables' handles and its arguments to the DTensor inputs; calling it runs DTensor's SPMD
  expansion, which partitions every op and inserts the collectives. DTensor's layouts change
  where values live, never what is computed, so results match one device up to rounding.
- A pipeline plan without tensor parallelism runs as `Plan.apply` places it: every op on
  its stage's device (replica r's on the r-th device of the stage's group), each variable
  copied onto the device of the stage that reads it first in replica 0. With d replicas and
  m micro-batches, the step is traced again on one of d x m pieces of the batch and cut at
  its variable writes (`micro_batches`): each piece computes its gradients on its replica's
  devices, the writes run once on their mean. The replicas share one copy of each variable,
  so the gradients' mean is a reduce onto it, not an all-reduce between replicas. Each
  stage of a replica takes its pieces' forwards and backwards in the plan's schedule
  (GPipe or 1F1B: `micro_batches.schedule`), through control edges.
- A data plan of a fused step (FusionStitch ops, which DTensor cannot partition) runs
  placed too: the pipeline path with one stage, a piece of the batch per replica.
- On a `LocalCluster` (worker processes over gRPC), data and pipeline plans run placed as
  above, on the workers' devices (a data plan whose step takes only its global batch runs
  on the DTensor clients below). Tensor parallel plans run under multi-client DTensor: the
  cluster's DTensor clients (`dtensor_clients`, one per worker, all of them one mesh) each
  rebuild the step from its wire form (GraphDef, variable values, inputs) and run the same
  `MeshStep`; outputs and variable values come back from client 0.
- Pipelines combined with tensor parallelism do not run yet (ValueError).

The step's own variables are left as they were; `ParallelStep.sync_variables` writes the
distributed copies' values back into them.
"""

import itertools

import numpy as np
import tensorflow as tf
from tensorflow.experimental import dtensor

from tf_fusionstitch.planner import batch_axes
from tf_fusionstitch.planner import cluster as cluster_lib
from tf_fusionstitch.planner import graph_import, layouts, local_workers, micro_batches


def use_cpu_devices(count):
    """Makes this process's CPU `count` logical devices (if TensorFlow has not initialised
    its devices yet) and returns the names of the first `count`.

    Raises ValueError saying what to do when TensorFlow already runs with fewer.
    """
    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is None or len(configured) < count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
        except RuntimeError:   # devices initialised: only the check below can tell
            pass
    devices = tf.config.list_logical_devices("CPU")
    if len(devices) < count:
        raise ValueError(
            f"the cluster needs {count} logical CPU devices, but TensorFlow initialised its "
            f"devices already, with {len(devices)} CPU device(s). Call "
            f"planner.use_cpu_devices({count}) at the start of the program, before "
            "TensorFlow runs anything (an op, a tf.constant, a variable), or configure them "
            "yourself then: tf.config.set_logical_device_configuration(tf.config."
            "list_physical_devices('CPU')[0], [tf.config.LogicalDeviceConfiguration()] * "
            f"{count})")
    return [d.name for d in devices[:count]]


def run_cluster(cluster):
    """The `ClusterSpec` plans run on for `cluster` (a `LocalCluster`, or a spec of this
    process's logical CPUs), and whether its devices are in worker processes."""
    if isinstance(cluster, local_workers.LocalCluster):
        return cluster.spec, True
    spec = cluster_lib.get_cluster(cluster)
    if spec.device_type != "CPU" or spec.nodes != 1:
        raise ValueError(f"cannot run on cluster {spec.name!r}: plans run on this process's "
                         "logical CPU devices, cluster='NxCPU' (e.g. '4xCPU'), or on "
                         "planner.local_cluster(...)'s worker processes")
    return spec, False


def build(fn, example_inputs, cluster, plan=None, search=None, variables=()):
    """A `ParallelStep` of `fn` under `plan`, or under `search(ir_graph, cluster_spec)`'s plan.

    cluster: an `NxCPU` spec (its N logical devices are set up here if TF has not started)
    or a `LocalCluster` (data and pipeline plans run placed on its workers, tensor parallel
    plans, and data plans whose step takes only its global batch, on its DTensor clients).
    variables: tf.Variables `fn` uses only through raw handles (as for `planner.search`).
    """
    spec, remote = run_cluster(cluster)
    if not remote:
        use_cpu_devices(spec.num_devices)
    graph, graph_def, concrete = graph_import.from_function(fn, example_inputs,
                                                            variables=variables)
    if plan is None:
        plan = search(graph, spec)
    planned = plan.replicas * plan.tensor_parallel * plan.num_stages
    if planned != spec.num_devices:
        raise ValueError(f"the plan uses {planned} devices ({plan.replicas} replicas x "
                         f"{plan.tensor_parallel}-way tensor parallel x {plan.num_stages} "
                         f"stages) but cluster {spec.name!r} has {spec.num_devices}")
    step = _Step(graph, graph_def, concrete, variables)
    pieces = plan.replicas * plan.micro_batches
    # A data plan runs placed (below), in pieces of the batch, one per replica, where
    # DTensor cannot run it: on worker processes (their devices are not this process's)
    # and for a fused step (DTensor has no layout propagation for FusionStitch ops). A
    # step that does not take a piece (it reshapes to its global batch) runs as one SPMD
    # program under DTensor instead: on a local cluster's DTensor clients, or refused
    # when it is fused.
    micro, not_in_pieces = None, ""
    if plan.num_stages == 1 and plan.tensor_parallel == 1 and plan.micro_batches == 1 \
            and pieces > 1 and (remote or _holds_fusion(step.graph_def)):
        try:
            micro = _micro_batch_step(fn, example_inputs, variables, step, pieces)
        except ValueError as e:
            not_in_pieces = str(e)
    if plan.num_stages == 1 and micro is None and (
            not remote or plan.tensor_parallel > 1 or (pieces > 1 and plan.micro_batches == 1)):
        if plan.micro_batches > 1:
            raise ValueError(f"the plan has {plan.micro_batches} micro-batches but no "
                             "pipeline stages: micro-batches run in pipeline plans only")
        if remote:
            return ClientMeshStep(plan, step, cluster.dtensor_clients())
        _check_unfused(step.graph_def, not_in_pieces)
        return MeshStep(plan, step, [f"CPU:{i}" for i in range(spec.num_devices)])
    if plan.tensor_parallel > 1:
        raise ValueError(
            f"the plan pipelines {plan.num_stages} stages of {plan.tensor_parallel}-way "
            "tensor parallelism: pipeline stages do not run with tensor parallelism yet; "
            "search with strategy='pipeline', 'data' or 'operator'")
    if pieces == 1:
        return PlacedStep(plan, step, spec)
    micro, is_split = micro or _micro_batch_step(fn, example_inputs, variables, step, pieces)
    return PlacedStep(plan, micro, spec, is_split)


def _micro_batch_step(fn, example_inputs, variables, step, count):
    """`fn` traced again on one of `count` equal pieces of the example inputs' batch (its
    graph holds the piece's shapes), and which arguments are split: those whose first
    axis is the batch (the first argument's)."""
    batch = step.arg_shapes[0][0] if step.arg_shapes and step.arg_shapes[0] else None
    if batch is None or batch % count:
        raise ValueError(f"a batch of {batch} does not split into {count} pieces (replicas "
                         "x micro-batches)")
    is_split = [bool(shape) and shape[0] == batch for shape in step.arg_shapes]
    flat = step.flat_args(example_inputs)
    micro_inputs = [x[:batch // count] if s else x for x, s in zip(flat, is_split)]
    try:
        micro = _Step(*graph_import.from_function(
            fn, tf.nest.pack_sequence_as(list(example_inputs), micro_inputs),
            variables=variables), variables)
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        raise ValueError(f"the step does not trace on a micro-batch of {batch // count} "
                         f"(it must take any batch size to run in micro-batches): {e}") from e
    # The plan places the whole batch's ops by name. Constants may differ (Grappler folds
    # shapes in a fused step's rewrite); an unplaced one runs where TensorFlow puts it.
    # Placeholders are fed, not placed, and a capture's may be named by TF's counter (a
    # nested tf.function that captures a variable, as Keras' grouped convolution is).
    ops = {node.name for node in step.graph_def.node}
    new = [node.name for node in micro.graph_def.node
           if node.name not in ops and node.op not in ("Const", "Placeholder")]
    if new:
        raise ValueError(f"the step traced on a micro-batch has ops the whole batch's does "
                         f"not ({', '.join(sorted(new)[:3])}), so the plan does not place it")
    micro.batch_axes = _batch_axes(step, micro)
    return micro, is_split


def _batch_axes(whole, piece):
    """The batch axes of the piece's tensors (batch_axes.BatchAxes): where their shapes
    differ from the whole batch's trace."""
    def shapes(tensor):
        found = []
        for step in (piece, whole):
            try:
                found.append(step.graph.get_tensor_by_name(tensor).shape.as_list())
            except (KeyError, ValueError):   # not in that trace, or of unknown rank
                found.append(None)
        return tuple(found)

    def fused(node):
        try:
            op = piece.graph.get_operation_by_name(node)
        except (KeyError, ValueError):
            return None
        if op.type != "FusionStitch":
            return None
        return op.get_attr("spec").decode("utf-8"), [t.name for t in op.inputs]
    return batch_axes.BatchAxes(shapes, fused)


class _Step:
    """The traced step: its GraphDef, argument and output names, and what each captured
    placeholder stands for (a variable, or a captured constant)."""

    def __init__(self, graph, graph_def, concrete, variables):
        self.graph_def = graph_def
        self.arg_names = list(graph.inputs)
        self.arg_shapes = [tuple(graph.tensors[n].shape) for n in self.arg_names]
        self.output_names = [t.name for t in concrete.graph.outputs]
        self.structured_outputs = concrete.structured_outputs
        self.dtype_of = lambda name: concrete.graph.get_tensor_by_name(
            name).dtype.as_datatype_enum
        self.graph = concrete.graph
        # Set on a trace of one piece of the batch (_micro_batch_step): which axes of its
        # tensors run along the batch.
        self.batch_axes = None
        self.phases = {name: op.phase for name, op in graph.ops.items()}
        by_handle = {id(v.handle): v for v in list(concrete.variables) + list(variables)}
        self.captured_variables, self.captured_values = {}, {}
        for external, internal in concrete.graph.captures:
            var = by_handle.get(id(external))
            if var is not None:
                self.captured_variables[internal.name] = var
            elif internal.name not in self.arg_names:
                self.captured_values[internal.name] = external
        self.variables = list({id(v): v for v in self.captured_variables.values()}.values())

    def wire(self):
        """What a DTensor client rebuilds the step from (`from_wire`), picklable: the
        GraphDef, argument and output names, each variable's name, value and trainability,
        the placeholders that stand for them, and the captured constants' values."""
        index = {id(var): i for i, var in enumerate(self.variables)}
        return {"graph_def": self.graph_def.SerializeToString(),
                "arg_names": self.arg_names, "arg_shapes": self.arg_shapes,
                "output_names": self.output_names,
                "variables": [(var.name, var.numpy(), var.trainable) for var in self.variables],
                "captured_variables": {name: index[id(var)]
                                       for name, var in self.captured_variables.items()},
                "captured_values": {name: np.asarray(value)
                                    for name, value in self.captured_values.items()}}

    @classmethod
    def from_wire(cls, wire):
        """The step `wire()` describes, its variables new ones of the same names (as the
        plan names them) and values; it holds what `MeshStep` uses, no more."""
        step = cls.__new__(cls)
        step.graph_def = tf.compat.v1.GraphDef.FromString(wire["graph_def"])
        step.arg_names, step.arg_shapes = wire["arg_names"], wire["arg_shapes"]
        step.output_names = wire["output_names"]
        step.variables = [tf.Variable(value, trainable=trainable, name=name.rpartition(":")[0])
                          for name, value, trainable in wire["variables"]]
        step.captured_variables = {name: step.variables[i]
                                   for name, i in wire["captured_variables"].items()}
        step.captured_values = {name: tf.constant(value)
                                for name, value in wire["captured_values"].items()}
        return step

    def importer(self, graph_def, feed_captures, finish_output):
        """A tf.function of the step's arguments that imports `graph_def` (the step's, or a
        placed copy), its captures fed by `feed_captures()` (called inside the function) and
        each output passed through `finish_output`."""

        @tf.function(autograph=False)
        def run(*args):
            feed = feed_captures()
            feed.update(zip(self.arg_names, args))
            outputs = tf.graph_util.import_graph_def(
                graph_def, input_map=feed, return_elements=self.output_names, name="")
            return [finish_output(t) for t in outputs]

        return run

    def pack_outputs(self, flat):
        if not self.output_names:
            return None
        return tf.nest.pack_sequence_as(self.structured_outputs, flat)

    def flat_args(self, args):
        flat = tf.nest.flatten(args)
        if len(flat) != len(self.arg_names):
            raise ValueError(f"the step takes {len(self.arg_names)} tensor argument(s) (as "
                             f"its example inputs), got {len(flat)}")
        return flat


class ParallelStep:
    """One training step of a function under a plan. Call it as the function; `plan` is the
    plan it runs; `sync_variables()` writes the distributed variables' values back into the
    function's own variables.

    Subclasses fill `copies`, `captured_constants` and `run` (the tf.function of the step's
    arguments) and say how a value moves onto the devices and back (`to_devices`,
    `from_devices`).
    """

    def __init__(self, plan, step):
        self.plan = plan
        self.step = step
        self.copies = {}               # id(original variable) -> its distributed copy
        self.captured_constants = {}   # placeholder name -> the value fed to it

    def __call__(self, *args):
        return self.step.pack_outputs(self.run_flat(
            [tf.convert_to_tensor(a) for a in self.step.flat_args(args)]))

    def run_flat(self, args):
        """The step's outputs (a flat list, on this process) for its flattened arguments."""
        flat = [self.to_devices(a, shape) for a, shape in zip(args, self.step.arg_shapes)]
        return [self.from_devices(t) for t in self.run(*flat)]

    def variable_values(self):
        """The distributed variables' current values, in `step.variables`' order."""
        return [self.from_devices(self.copies[id(var)].read_value())
                for var in self.step.variables]

    def sync_variables(self):
        """Assigns each distributed variable's current value to the original variable."""
        for var, value in zip(self.step.variables, self.variable_values()):
            var.assign(value)

    def feed_captures(self):
        feed = {name: tf.identity(self.copies[id(var)].handle)
                for name, var in self.step.captured_variables.items()}
        feed.update(self.captured_constants)
        return feed


def _holds_fusion(graph_def):
    return any(node.op == "FusionStitch" for node in graph_def.node) or any(
        node.op == "FusionStitch" for f in graph_def.library.function
        for node in f.node_def)


def _check_unfused(graph_def, not_in_pieces=""):
    """`not_in_pieces`: why a data plan's step could not run placed in pieces, if it was tried."""
    if _holds_fusion(graph_def):
        raise ValueError(
            "the step holds FusionStitch ops (tf_fusionstitch.optimize fused it), which "
            "DTensor cannot partition: it has no layout propagation for them. A fused step "
            "runs under a pipeline plan (strategy='pipeline'), or a data plan if it takes "
            "any batch size (it then runs placed, a piece of the batch per replica"
            + (f"; this one does not: {not_in_pieces}" if not_in_pieces else "")
            + "); or parallelize the step before optimizing it")


class MeshStep(ParallelStep):
    """A data x tensor parallel plan under DTensor (see the module's docstring)."""

    def __init__(self, plan, step, devices=None):
        """devices: this process's devices of the mesh; None in a DTensor client of
        several (`dtensor_client_main`), whose mesh spans every client's devices."""
        super().__init__(plan, step)
        _check_unfused(step.graph_def)
        self.layouts = layouts.MeshLayouts(plan)
        if devices is None:
            self.mesh = dtensor.create_distributed_mesh(self.layouts.mesh_axes,
                                                        device_type="CPU")
        else:
            self.mesh = dtensor.create_mesh(self.layouts.mesh_axes, devices=devices)
        for var in step.variables:
            value = self.shard(var.read_value(),
                               self.layouts.variable_spec(var.name, var.shape.rank))
            self.copies[id(var)] = dtensor.DVariable(value, trainable=var.trainable)
        self.captured_constants = {name: self.shard(tf.convert_to_tensor(value),
                                                    [None] * value.shape.rank)
                                   for name, value in step.captured_values.items()}
        self.run = step.importer(step.graph_def, self.feed_captures, self.replicated)

    @classmethod
    def in_client(cls, plan, wire):
        """The step a DTensor client of several runs: `_Step.wire()`'s step on the mesh of
        every client's devices."""
        return cls(plan, _Step.from_wire(wire))

    def shard_shapes(self):
        """{variable name: the shape of its shard on each of this process's devices}."""
        return {var.name: [shard.shape.as_list()
                           for shard in dtensor.unpack(self.copies[id(var)].read_value())]
                for var in self.step.variables}

    def layout(self, spec):
        return dtensor.Layout([axis or dtensor.UNSHARDED for axis in spec], self.mesh)

    def shard(self, value, spec):
        replicated = dtensor.copy_to_mesh(value, self.layout([None] * value.shape.rank))
        return dtensor.relayout(replicated, self.layout(spec))

    def replicated(self, value):
        return dtensor.relayout(value, self.layout([None] * value.shape.rank))

    def to_devices(self, value, shape):
        return self.shard(value, self.layouts.input_spec(shape))

    def from_devices(self, value):
        return dtensor.unpack(self.replicated(value))[0]


class ClientMeshStep(ParallelStep):
    """A data x tensor parallel plan on a `LocalCluster`'s DTensor clients: each builds the
    same `MeshStep` from the step's wire form and runs every call (the arguments go to
    each, whole; DTensor shards them); client 0's outputs and variable values come back."""

    _keys = itertools.count()

    def __init__(self, plan, step, clients):
        super().__init__(plan, step)
        _check_unfused(step.graph_def)
        self.clients = clients
        self.key = next(self._keys)
        clients.request("build", self.key, plan, step.wire())

    def run_flat(self, args):
        outputs = self.clients.request("call", self.key, [a.numpy() for a in args])[0]
        return [tf.constant(value) for value in outputs]

    def variable_values(self):
        return [tf.constant(value) for value in self.clients.request("read", self.key)[0]]

    def shard_shapes(self):
        """{variable name: the shape of its shard on each device of the mesh}."""
        per_client = self.clients.request("shard_shapes", self.key)
        return {name: [shape for shapes in per_client for shape in shapes[name]]
                for name in per_client[0]}


class PlacedStep(ParallelStep):
    """A pipeline plan (no tensor parallelism) placed as `Plan.apply` places it, each
    replica on its own devices; with several replicas or micro-batches, every piece of the
    batch computes its gradients and one update runs on their mean."""

    def __init__(self, plan, step, spec, is_split=None):
        """`step` is traced on one piece of the batch (replicas x micro-batches) when there
        are several; `is_split` says which of its arguments are split into pieces."""
        super().__init__(plan, step)
        placed = plan.apply(step.graph_def)
        first_reader = {}
        for node in placed.node:
            for src in node.input:
                first_reader.setdefault(src.split(":")[0].lstrip("^"), node.device)
        for name, var in step.captured_variables.items():
            if id(var) in self.copies:
                continue
            with tf.device(first_reader.get(name.split(":")[0]) or spec.device_name(0)):
                self.copies[id(var)] = tf.Variable(var.read_value(), trainable=var.trainable)
        self.captured_constants = dict(step.captured_values)
        if plan.replicas * plan.micro_batches > 1:
            self.run = self.micro_batched(placed, is_split)
        else:
            self.run = step.importer(placed, self.feed_captures, tf.identity)

    def micro_batched(self, placed, is_split):
        """The tf.function of a step in pieces (`micro_batches.split`): the arguments
        `is_split` marks are split into replicas x micro-batches equal pieces, piece k runs
        the compute part on replica k // micro-batches's devices, each stage of a replica
        taking its pieces' forwards and backwards in the order of the plan's schedule
        (`micro_batches.pipelined`), and the update runs once, on replica 0's devices, on
        the frontier's mean. Scalar outputs (a mean loss) are averaged, others concatenated
        along the batch. The replicas share one copy of each variable (on replica 0's
        devices): the gradients' mean is a reduce onto it."""
        step, plan = self.step, self.plan
        count = plan.replicas * plan.micro_batches
        cuts = [micro_batches.split(placed if r == 0 else plan.apply(step.graph_def, r),
                                    step.arg_names, step.output_names, step.dtype_of,
                                    step.batch_axes)
                for r in range(plan.replicas)]
        stage_of = {op: s for s, ops in enumerate(plan.stages) for op in ops}

        def group_of(name):
            if name not in stage_of or name not in step.phases:
                return None
            return stage_of[name], step.phases[name]

        compute = micro_batches.pipelined(
            [cuts[k // plan.micro_batches].compute for k in range(count)],
            plan.micro_batches, group_of,
            micro_batches.schedule(plan.schedule, plan.num_stages, plan.micro_batches))
        update = cuts[0]
        device = {node.name: node.device for node in update.update.node}
        returned = step.output_names + update.frontier
        outputs = len(step.output_names)

        @tf.function(autograph=False)
        def run(*args):
            parts = [tf.split(a, count) if s else [a] * count for a, s in zip(args, is_split)]
            captures = self.feed_captures()
            feed = {}
            for k in range(count):
                prefix = f"micro_batch_{k}/"
                feed.update((prefix + name, t) for name, t in captures.items())
                feed.update((prefix + name, part[k])
                            for name, part in zip(step.arg_names, parts))
            flat = tf.graph_util.import_graph_def(
                compute, input_map=_present(compute, feed), name="",
                return_elements=[f"micro_batch_{k}/{t}" for k in range(count)
                                 for t in returned])
            results = [flat[k * len(returned):(k + 1) * len(returned)] for k in range(count)]
            with tf.control_dependencies(flat):
                feed = self.feed_captures()
            for k, placeholder in enumerate(update.placeholders):
                pieces = [result[outputs + k] for result in results]
                if not (pieces[0].dtype.is_floating or pieces[0].dtype.is_complex):
                    # An integer or boolean has no mean: one the pieces share (an argument
                    # that is not split) is taken as it is; one they differ in is refused.
                    same = [tf.debugging.assert_equal(
                        p, pieces[0], message=f"the pieces of the batch give different "
                        f"values of {update.frontier[k]}, an integer the variable writes "
                        "read: this step cannot run in pieces") for p in pieces[1:]]
                    with tf.control_dependencies(same):
                        feed[placeholder] = tf.identity(pieces[0])
                    continue
                with tf.device(device[placeholder]):
                    total = tf.add_n(pieces)
                    feed[placeholder] = total / tf.cast(count, total.dtype)
            tf.graph_util.import_graph_def(update.update,
                                           input_map=_present(update.update, feed),
                                           name="update")
            per_output = zip(*[result[:outputs] for result in results])
            return [tf.add_n(list(values)) / count if values[0].shape.rank == 0
                    else tf.concat(values, 0) for values in per_output]

        return run

    def to_devices(self, value, shape):
        return value

    def from_devices(self, value):
        return value


def _present(graph_def, feed):
    """The entries of `feed` whose placeholder `graph_def` holds (import_graph_def refuses
    others)."""
    names = {node.name for node in graph_def.node}
    return {k: v for k, v in feed.items() if k.split(":")[0] in names}
