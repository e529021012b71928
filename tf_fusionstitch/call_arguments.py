"""How a call's arguments line up with a trace's inputs.

A trace flattens its arguments to leaves (tensors among them); versions.py
keys a call by the sizes of those leaves. With an input signature, an
argument in a spec's place is one leaf however it is nested (TF converts a
list there to one tensor), so the call is flattened like the signature.
"""

from __future__ import annotations

import inspect
from typing import Optional

import tensorflow as tf

from tf_fusionstitch.versions import call_sizes


class CallArguments:
    """The argument rules of one original function (None: a ConcreteFunction,
    whose arguments are its flat inputs)."""

    def __init__(self, python_fn, input_signature):
        self._python_fn = python_fn
        self._signature = input_signature

    def values(self, args, kwargs) -> list:
        """The arguments in parameter order, defaults filled in and *args
        spread (so an input signature's specs line up with the first ones);
        raises TypeError where they do not bind."""
        if self._python_fn is None:
            return list(args)
        parameters = inspect.signature(self._python_fn)
        bound = parameters.bind(*args, **kwargs)
        bound.apply_defaults()
        values = []
        for name, value in bound.arguments.items():
            spread = parameters.parameters[name].kind == inspect.Parameter.VAR_POSITIONAL
            values.extend(value if spread else [value])
        return values

    def leaves(self, args, kwargs) -> list:
        """The arguments flattened as a trace flattens them (tensors there)."""
        try:
            return tf.nest.flatten(self.values(args, kwargs), expand_composites=True)
        except TypeError:
            return []   # the call itself will raise TF's error

    def sizes(self, args, kwargs, traced_leaves: Optional[int]):
        """The call's sizes per traced leaf (versions.py); a call that does
        not line up with the traces' `traced_leaves` has no known sizes."""
        if self._signature is None:
            leaves = self.leaves(args, kwargs)
        else:
            try:
                values = self.values(args, kwargs)
                leaves = _flatten_like(list(self._signature), values[:len(self._signature)])
                leaves += tf.nest.flatten(values[len(self._signature):], expand_composites=True)
            except (TypeError, ValueError):
                leaves = []
        if traced_leaves is not None and len(leaves) != traced_leaves:
            leaves = [None] * traced_leaves
        return call_sizes(leaves)


def symbolic(args, kwargs) -> bool:
    """Whether the call is being traced into another function."""
    return any(isinstance(x, tf.Tensor) and tf.is_symbolic_tensor(x)
               for x in tf.nest.flatten((args, kwargs), expand_composites=True))


def _flatten_like(structure, value) -> list:
    """`value` flattened to the leaves of `structure` (an input signature):
    one value per TensorSpec, a composite's components per other spec.
    Raises ValueError where the two do not line up."""
    if isinstance(structure, tf.TensorSpec):
        return [value]
    if isinstance(structure, tf.TypeSpec):
        components = tf.nest.flatten(value, expand_composites=True)
        if len(components) != len(tf.nest.flatten(structure, expand_composites=True)):
            raise ValueError("a composite argument does not match its spec")
        return components
    if isinstance(structure, dict):
        if not isinstance(value, dict) or set(value) != set(structure):
            raise ValueError("a dict argument does not match its spec")
        return [leaf for key in sorted(structure)
                for leaf in _flatten_like(structure[key], value[key])]
    if isinstance(structure, (list, tuple)):
        if not isinstance(value, (list, tuple)) or len(value) != len(structure):
            raise ValueError("a sequence argument does not match its spec")
        return [leaf for s, v in zip(structure, value) for leaf in _flatten_like(s, v)]
    raise ValueError(f"an input signature entry of type {type(structure).__name__}")
