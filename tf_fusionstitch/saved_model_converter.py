"""SavedModel in, SavedModel out: every signature with fused kernels.

Shaped like TF-TRT's TrtGraphConverterV2:

    converter = tf_fusionstitch.SavedModelConverter("in_dir")
    converter.convert()
    converter.build(input_fn)          # optional: run at these shapes ahead of serving
    print(converter.summary())
    converter.save("out_dir")

`convert` loads the SavedModel and optimizes each signature (tf_fusionstitch.optimize,
with the options given) as the function that takes its inputs by name, input shapes
as the SavedModel declares them, so dynamic dimensions stay dynamic. A signature whose
rewrite fails or fuses nothing is kept as it was, with the reason in the summary. `save`
writes the loaded object again (its variables, assets and other functions as they were)
with the converted signatures. Loading the result needs `import tf_fusionstitch` first:
that registers the op, and each FusionStitch kernel is built from its node's validated
spec (spec_kernels.py).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence

from tf_fusionstitch import tensorflow_requirement

tensorflow_requirement.check()

import numpy as np
import tensorflow as tf

from tf_fusionstitch import api
from tf_fusionstitch.options import FusionOptions
from tf_fusionstitch.report import Report


@dataclasses.dataclass
class ConvertedSignature:
    """What convert did to one signature."""
    key: str
    input_names: List[str]        # sorted: the order positional inputs take in build()
    function: object              # the ConcreteFunction save() writes under `key`
    original: object              # the loaded signature's ConcreteFunction
    report: Optional[Report]      # None where the signature was not rewritten
    kept_reason: str = ""         # why the signature stays as it was ("": converted)
    built: List[str] = dataclasses.field(default_factory=list)   # build(): shapes run
    max_difference: float = 0.0   # build(): largest |converted - original| of an output

    @property
    def converted(self) -> bool:
        return not self.kept_reason

    def line(self) -> str:
        if not self.converted:
            return f"{self.key}: kept as it was: {self.kept_reason}"
        fused = [c for c in self.report.clusters if c.fused]
        text = (f"{self.key}: converted, {len(fused)} FusionStitch kernel(s) in place of "
                f"{sum(len(c.tf_ops) for c in fused)} TF ops; rewrite "
                f"{self.report.rewrite_seconds:.2f} s")
        if self.built:
            text += (f"; built for {', '.join(self.built)} (largest difference from the "
                     f"original's outputs {self.max_difference:.3g})")
        return text


class SavedModelConverter:
    """Converts the signatures of the SavedModel in `input_saved_model_dir`
    (all of them, or `signature_keys`) with `optimize(**options)`."""

    def __init__(self, input_saved_model_dir, signature_keys: Optional[Sequence[str]] = None,
                 **options):
        FusionOptions.from_call(**options)   # a bad option fails here, not in convert()
        self._input_dir = os.fspath(input_saved_model_dir)
        self._signature_keys = None if signature_keys is None else list(signature_keys)
        self._options = options
        self._loaded = None
        self._signatures: Dict[str, ConvertedSignature] = {}

    def convert(self) -> Dict[str, object]:
        """Loads the SavedModel and converts its signatures; returns the
        function each signature key will be saved with."""
        loaded = tf.saved_model.load(self._input_dir)
        keys = list(loaded.signatures) if self._signature_keys is None else self._signature_keys
        unknown = sorted(set(keys) - set(loaded.signatures))
        if unknown:
            raise ValueError(f"{self._input_dir} has no signature {unknown}; it has "
                             f"{sorted(loaded.signatures)}")
        if not keys:
            raise ValueError(f"{self._input_dir} has no signatures to convert")
        self._loaded = loaded
        self._signatures = {key: self._convert_signature(key, loaded.signatures[key])
                            for key in keys}
        return {key: s.function for key, s in self._signatures.items()}

    def build(self, input_fn: Callable[[], Iterable]) -> None:
        """Runs the converted signatures on the inputs `input_fn()` yields, so
        whatever they need is compiled and loaded now and a failure at those
        shapes shows before serving; compares each output with the original
        signature's. Each yielded item is a dict {input name: value}, run by every
        converted signature with exactly those inputs, or a sequence of values,
        run by every converted signature with that many inputs, in the order of
        their sorted names."""
        self._require_converted("build")
        for inputs in input_fn():
            ran = False
            for s in self._signatures.values():
                feeds = _feeds(s.input_names, inputs)
                if not s.converted or feeds is None:
                    continue
                got, want = s.function(**feeds), s.original(**feeds)
                for name in want:
                    a, b = np.asarray(got[name]), np.asarray(want[name])
                    if a.size:
                        s.max_difference = max(s.max_difference, float(np.max(np.abs(
                            a.astype(np.float64) - b.astype(np.float64)))))
                shapes = ", ".join(f"{n}{list(np.shape(feeds[n]))}" for n in s.input_names)
                s.built.append(shapes if len(s.input_names) == 1 else f"({shapes})")
                ran = True
            if not ran:
                raise ValueError("build: no converted signature takes the inputs "
                                 f"{_describe(inputs)}; their inputs are "
                                 f"{ {k: s.input_names for k, s in self._signatures.items()} }")

    def summary(self) -> str:
        """One line per signature: converted (kernels, shapes built) or kept, with why."""
        self._require_converted("summary")
        lines = [f"SavedModelConverter: {self._input_dir}"]
        lines += ["  " + s.line() for s in self._signatures.values()]
        return "\n".join(lines)

    def reports(self) -> Dict[str, Report]:
        """The optimize report of each signature that was rewritten."""
        return {k: s.report for k, s in self._signatures.items() if s.report is not None}

    def save(self, output_saved_model_dir) -> None:
        """Writes the SavedModel with the converted signatures (the others,
        the variables, assets and functions as they were)."""
        self._require_converted("save")
        signatures = dict(self._loaded.signatures)
        signatures.update((k, s.function) for k, s in self._signatures.items())
        tf.saved_model.save(self._loaded, os.fspath(output_saved_model_dir),
                            signatures=signatures)

    def _require_converted(self, what: str) -> None:
        if self._loaded is None:
            raise RuntimeError(f"call convert() before {what}()")

    def _convert_signature(self, key: str, original) -> ConvertedSignature:
        positional, named = original.structured_input_signature
        names = sorted(named)
        specs = [named[n] for n in names]
        if positional or not all(isinstance(s, tf.TensorSpec) for s in specs):
            return ConvertedSignature(key, names, original, original, None,
                                      "its inputs are not all dense tensors passed by name")

        def by_position(*values):
            return original(**dict(zip(names, values)))
        optimized = api.optimize(tf.function(by_position, input_signature=specs,
                                             autograph=False), **self._options)
        # The version that assumes nothing of input sizes: right for any batch.
        generic = optimized.get_concrete_function(*specs)
        report = optimized.report()
        if report is None or report.failure:
            reason = report.failure if report is not None else "it was not traced"
            return ConvertedSignature(key, names, original, original, report,
                                      f"the rewrite failed ({reason})")
        if not any(c.fused for c in report.clusters):
            return ConvertedSignature(key, names, original, original, report,
                                      "nothing in it fuses (no FusionStitch kernel)")

        def by_name(**inputs):
            return generic(*[inputs[n] for n in names])
        function = tf.function(by_name, autograph=False).get_concrete_function(
            **{n: tf.TensorSpec(s.shape, s.dtype, name=n) for n, s in zip(names, specs)})
        return ConvertedSignature(key, names, function, original, report)


def _feeds(names: List[str], inputs) -> Optional[Dict[str, object]]:
    """`inputs` (a dict, or values in the order of `names`) by input name;
    None when they are not this signature's."""
    if isinstance(inputs, dict):
        return dict(inputs) if sorted(inputs) == names else None
    values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    return dict(zip(names, values)) if len(values) == len(names) else None


def _describe(inputs) -> str:
    if isinstance(inputs, dict):
        return str({k: list(np.shape(v)) for k, v in inputs.items()})
    values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    return str([list(np.shape(v)) for v in values])
