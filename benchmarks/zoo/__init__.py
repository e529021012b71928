"""The model zoo: third-party models as users bring them, built from their
public constructors with seeded random weights and no downloads.

Fifteen keras.applications CNNs (vision.py) and fifteen keras_hub backbones
(text.py), each at a "tiny" size for tests and a "real" one for benchmarks,
with an inference function (batch dimension None; sequence length None too
for text models) and a train step (a training head, a loss and one of nine
Keras optimizers; some models under the mixed_bfloat16 policy, some with
dropout active). tf_fusionstitch never sees these models while it is built:
they are where it is checked.

    from benchmarks import zoo
    m = zoo.build("bert", "tiny", seed=0)
    batch = m.make_batch(seed, batch=4, seq=16)
    m.inference(*batch.inputs); m.train_step(*batch.inputs, batch.labels)
"""

from benchmarks.zoo import text, vision
from benchmarks.zoo.assemble import OPTIMIZERS, POLICIES, ZooModel  # noqa: F401

SIZES = ("tiny", "real")
# (batch, sequence length) the benchmarks time at real sizes (a step takes
# about a second on a 2-core CPU); at tiny sizes, (4, 16).
REAL_BATCH = {("vision", "inference"): (4, None), ("vision", "train_step"): (4, None),
              ("text", "inference"): (4, 128), ("text", "train_step"): (2, 128)}
TINY_BATCH = (4, 16)
_BUILDERS = {**{name: vision.build for name in vision.ENTRIES},
             **{name: text.build for name in text.ENTRIES}}
NAMES = tuple(_BUILDERS)
# Models outside the zoo, built the same way: not in CI and not in the benchmarks'
# defaults; a check of the tool on architectures it was not looked at with
# (TF_FUSIONSTITCH_ZOO_EXTRA=1 for tests/models/test_zoo.py, --models=... by name).
EXTRA_NAMES = tuple(vision.EXTRA) + tuple(text.EXTRA)
_BUILDERS.update({**{name: vision.build for name in vision.EXTRA},
                  **{name: text.build for name in text.EXTRA}})


def entry(name: str):
    """The entry (vision.VisionEntry or text.TextEntry) that describes `name`."""
    _check(name)
    return (vision.ENTRIES.get(name) or text.ENTRIES.get(name) or vision.EXTRA.get(name)
            or text.EXTRA[name])


def build(name: str, size: str = "tiny", seed: int = 0, policy: str = None) -> ZooModel:
    """Builds zoo model `name` at `size` with weights seeded by `seed`, under
    its own dtype policy or `policy` (POLICIES; "float64": its float64 twin)."""
    _check(name)
    if size not in SIZES:
        raise ValueError(f"size must be one of {SIZES}, got {size!r}")
    if policy is not None and policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    return _BUILDERS[name](name, size, seed, policy)


def timed_shape(model: ZooModel, function: str, size: str):
    """(batch, sequence length or None) the benchmarks time `function` of
    `model` at, at `size`."""
    batch, seq = TINY_BATCH if size == "tiny" else REAL_BATCH[(model.family, function)]
    return batch, (seq if model.family == "text" else None)


def unknown_names(names) -> str:
    """"" when every name is a zoo model, else a message naming the others
    and the choices (for a script's --models check)."""
    unknown = sorted(set(names) - set(_BUILDERS))
    return (f"unknown --models {unknown}; choose from {', '.join(NAMES)} (or, outside the "
            f"zoo, {', '.join(EXTRA_NAMES)})" if unknown else "")


def _check(name: str) -> None:
    if name not in _BUILDERS:
        raise ValueError(f"unknown zoo model {name!r}; known: {', '.join(NAMES)} "
                         f"(and outside the zoo: {', '.join(EXTRA_NAMES)})")
