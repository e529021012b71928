"""Reference models for the fusion compiler (docs/DESIGN.md, "Performance method"):
Keras layers, seeded random weights, no downloads.

Each module has `build(**sizes, seed=0) -> common.ReferenceModel` and two size
sets, TINY (tests) and REAL (benchmarks):

    from benchmarks import models
    m = models.build("bert", "tiny", seed=0)
    batch = m.make_batch(seed, batch=4)
    m.inference(*batch.inputs); m.train_step(*batch.inputs, batch.labels)
"""

from benchmarks.models import asr, bert, crnn, dien, transformer

MODELS = {"bert": bert, "transformer": transformer, "dien": dien, "crnn": crnn, "asr": asr}
SIZES = ("tiny", "real")
# Batch sizes the benchmarks use at real sizes: one training step takes about a
# second or two on a 2-core CPU.
DEFAULT_BATCH = {"bert": 2, "transformer": 4, "dien": 128, "crnn": 8, "asr": 2}


def default_batch(name, size):
    """The benchmarks' batch for model `name` at `size`: DEFAULT_BATCH at real sizes, 4 at tiny."""
    return DEFAULT_BATCH[name] if size == "real" else 4


def build(name, size="tiny", seed=0, **overrides):
    """Builds model `name` at its `size` sizes, with `overrides` replacing some."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    module = MODELS[name]
    sizes = dict(module.TINY if size == "tiny" else module.REAL)
    unknown = set(overrides) - set(sizes)
    if unknown:
        raise ValueError(f"model {name!r} has no size(s) {sorted(unknown)}; it takes "
                         f"{sorted(sizes)}")
    sizes.update(overrides)
    return module.build(seed=seed, **sizes)
