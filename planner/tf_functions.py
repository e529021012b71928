"""The functions a TF graph calls (a call's function, a conditional's branches), read as
graphs at the static shapes of the call, for the planner's import (graph_import)."""

import dataclasses

import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph
from tensorflow.python.ops import handle_data_util

CALLS = ("PartitionedCall", "StatefulPartitionedCall")


class FunctionLibrary:
    """The functions a graph calls, as graphs at the static shapes of each call."""

    def __init__(self, graph):
        library = graph.as_graph_def().library
        self.definitions = {f.signature.name: f for f in library.function}

    def body(self, call):
        """The body of `call`'s function, as `Body`, or None if the library lacks it."""
        return self.instantiate(call.get_attr("f").name, list(call.inputs))

    def instantiate(self, function_name, call_inputs):
        """Function `function_name` as `Body`, its arguments shaped as the tensors
        `call_inputs` (None if the library lacks it)."""
        definition = self.definitions.get(function_name)
        if definition is None:
            return None
        graph_def, flat_names = function_def_to_graph.function_def_to_graph_def(
            definition, [t.shape for t in call_inputs], include_library_functions=True)
        args = [flat_names[a.name] for a in definition.signature.input_arg]
        body = tf.Graph()
        with body.as_default():
            # Arguments carry the call's shapes and, for variables, their handles' data, so
            # TF's shape inference gives every op of the body static shapes.
            inputs = []
            for k, t in enumerate(call_inputs):
                arg = tf.compat.v1.placeholder(t.dtype, t.shape, name=f"inlined_arg_{k}")
                if t.dtype == tf.resource:
                    handle_data_util.copy_handle_data(t, arg)
                inputs.append(arg)
            mapped = dict(zip(args, inputs))
            tf.graph_util.import_graph_def(graph_def, mapped, name="")
        # An output may be an argument passed through (a forward function's saved input).
        returned = [flat_names[definition.ret[a.name]] for a in definition.signature.output_arg]
        outputs = [mapped[name] if name in mapped else body.get_tensor_by_name(name)
                   for name in returned]
        arg_ops = {name.split(":")[0] for name in args}
        ops = [op for op in body.get_operations() if op.name not in arg_ops]
        return Body(inputs, outputs, ops)


@dataclasses.dataclass
class Body:
    """A called function's graph: its argument placeholders, outputs and ops."""
    inputs: list
    outputs: list
    ops: list
