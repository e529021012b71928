"""The planner's graph IR: ops with FLOPs and bytes, tensors with shapes, variables. TF-free.

A `Graph` is built by `graph_import` (from TensorFlow) or by hand in tests. `finalize()`
fills in what the planner derives from the structure: per-op FLOPs and bytes (from
`op_rules`), the phase of each op (forward, backward, update) and the linkage analysis.
"""

import dataclasses
import math

from tf_fusionstitch.planner import op_rules

FORWARD, BACKWARD, UPDATE = "forward", "backward", "update"


@dataclasses.dataclass
class Tensor:
    """One op output. `shape` entries are ints (static shapes are required to plan).

    A resource handle of a variable carries the variable's shape and dtype and names it in
    `variable`, so that ops on the handle relate to the variable's axes.
    """
    name: str
    shape: tuple
    dtype: str
    itemsize: int
    producer: str = ""
    consumers: list = dataclasses.field(default_factory=list)
    variable: str = ""

    @property
    def rank(self):
        return len(self.shape)

    @property
    def num_elements(self):
        return math.prod(self.shape)

    @property
    def nbytes(self):
        return self.num_elements * self.itemsize


@dataclasses.dataclass
class Op:
    """One node. `attrs` holds plain Python values (transpose flags, perms, axes, equations)."""
    name: str
    type: str
    inputs: list
    outputs: list
    attrs: dict = dataclasses.field(default_factory=dict)
    phase: str = FORWARD
    flops: float = 0.0
    bytes: float = 0.0


@dataclasses.dataclass
class Variable:
    """A variable as TF names it (`wq:0`); `handle` is the tensor that carries its handle."""
    name: str
    shape: tuple
    dtype: str
    itemsize: int
    handle: str
    trainable: bool = True

    @property
    def nbytes(self):
        return math.prod(self.shape) * self.itemsize


class Graph:
    """Ops in topological order, their tensors, variables, data inputs and outputs."""

    def __init__(self, name="graph"):
        self.name = name
        self.ops = {}
        self.tensors = {}
        self.variables = {}
        self.inputs = []      # data input tensor names (batch on axis 0)
        self.outputs = []     # function outputs (the loss of a training step)
        self._linkage = None

    # -- construction -------------------------------------------------------------------------

    def add_tensor(self, tensor):
        if tensor.name in self.tensors:
            raise ValueError(f"duplicate tensor {tensor.name!r}")
        self.tensors[tensor.name] = tensor
        return tensor

    def add_op(self, op):
        if op.name in self.ops:
            raise ValueError(f"duplicate op {op.name!r}")
        for name in op.inputs:
            if name not in self.tensors:
                raise ValueError(f"op {op.name!r} reads unknown tensor {name!r} (ops must be "
                                 "added in topological order)")
            self.tensors[name].consumers.append(op.name)
        for name in op.outputs:
            self.tensors[name].producer = op.name
        self.ops[op.name] = op
        return op

    def add_variable(self, variable):
        self.variables[variable.name] = variable
        handle = self.tensors[variable.handle]
        handle.variable = variable.name
        handle.shape = tuple(variable.shape)
        handle.dtype = variable.dtype
        handle.itemsize = variable.itemsize
        return variable

    def variable_of(self, tensor_name):
        """The Variable whose handle `tensor_name` is, or None."""
        name = self.tensors[tensor_name].variable
        return self.variables.get(name) if name else None

    # -- derived facts ------------------------------------------------------------------------

    def finalize(self):
        """Computes FLOPs, bytes and phases, and checks that every shape is static."""
        for t in self.tensors.values():
            if any((not isinstance(d, int)) or d < 0 for d in t.shape):
                raise ValueError(f"tensor {t.name!r} has a non-static shape {t.shape}: trace "
                                 "the function with concrete example inputs")
        for op in self.ops.values():
            ins = [self.tensors[n] for n in op.inputs]
            outs = [self.tensors[n] for n in op.outputs]
            op.flops, op.bytes = op_rules.flops_and_bytes(op, ins, outs)
        self._assign_phases()
        self._linkage = None
        return self

    def _assign_phases(self):
        # Forward: what the outputs (the loss) depend on. Update: ops that write variables.
        # Backward: the rest (gradients and the optimizer arithmetic feeding updates).
        forward = set()
        stack = [self.tensors[n].producer for n in self.outputs]
        while stack:
            name = stack.pop()
            if not name or name in forward:
                continue
            forward.add(name)
            stack.extend(self.tensors[i].producer for i in self.ops[name].inputs)
        # Without variable updates it is inference: everything is forward (control-only
        # ops such as NoOp are not ancestors of the outputs, but are not gradients either).
        has_updates = any(op_rules.writes_variable(op.type) for op in self.ops.values())
        for op in self.ops.values():
            if op_rules.writes_variable(op.type):
                op.phase = UPDATE
            elif op.name in forward or not has_updates:
                op.phase = FORWARD
            else:
                op.phase = BACKWARD
        self.is_training = has_updates

    @property
    def linkage(self):
        """The linkage analysis (`linkage.Linkage`), computed once per finalized graph."""
        if self._linkage is None:
            from tf_fusionstitch.planner import linkage
            self._linkage = linkage.analyze(self)
        return self._linkage

    @property
    def batch_size(self):
        sizes = {self.tensors[n].shape[0] for n in self.inputs if self.tensors[n].rank}
        return max(sizes) if sizes else 1

    def trainable_variables(self):
        return [v for v in self.variables.values() if v.trainable]

    def summary(self):
        by_phase = {}
        for op in self.ops.values():
            by_phase[op.phase] = by_phase.get(op.phase, 0) + 1
        flops = sum(op.flops for op in self.ops.values())
        params = sum(math.prod(v.shape) for v in self.trainable_variables())
        return (f"{self.name}: {len(self.ops)} ops ({by_phase}), {len(self.variables)} "
                f"variables, {params:,} trainable parameters, {flops:.3e} FLOPs per step")
