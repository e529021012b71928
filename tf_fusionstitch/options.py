"""`optimize`'s options as one validated object, built once and passed down whole.

FusionOptions is keyword-only (two ints cannot be passed swapped) and checks
every field when it is made: types, choices and ranges. `from_call` also
checks what only the call can tell: options that mean nothing under the
fusion strategy given (pack with fusion="xla_like", explore_k without
fusion="explore"). No TensorFlow import here.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict

STRATEGIES = ("stitch", "xla_like", "explore")
# kernels.TARGETS (tests/api/test_options.py checks they agree).
TARGETS = ("cpu", "cuda-emulated")
COSTS = ("calibrated", "builtin")


def _option(default, types, what: str, choices: tuple = (), lo=None, hi=None):
    return dataclasses.field(default=default, metadata=dict(
        types=types, what=what, choices=choices, range=(lo, hi)))


@dataclasses.dataclass(frozen=True, kw_only=True)
class FusionOptions:
    min_cluster_ops: int = _option(2, int, "smallest number of primitive ops worth a fused "
                                   "kernel", lo=1)
    grappler: bool = _option(True, bool, "run TF's constant folding / arithmetic / "
                             "dependency passes first")
    compile_timeout: float = _option(120, (int, float), "seconds one kernel compilation "
                                     "may take")
    fusion: str = _option("stitch", str, "the fusion strategy: 'stitch' (FusionStitching's "
                          "greedy stitching), 'xla_like' (XLA's fusion rules, to compare "
                          "plans) or 'explore' (FusionStitching's plan exploration with "
                          "remote fusion)", choices=STRATEGIES)
    explore_k: int = _option(3, int, "fusion='explore': candidate patterns kept per op "
                             "(1 to 8)", lo=1, hi=8)
    explore_beam: int = _option(3, int, "fusion='explore': beam width of the plan search "
                                "(1 to 16)", lo=1, hi=16)
    costs: str = _option("calibrated", str, "fusion='explore': the delta evaluator's costs, "
                         "'calibrated' (measured on this machine once, then cached: "
                         "rewriters/cpu_costs.py) or 'builtin'", choices=COSTS)
    explore_guard: bool = _option(True, bool, "fusion='explore': keep a rule plan (stitch's "
                                  "or XLA's) where the plan model does not predict the "
                                  "explored plan faster by more than its error on this "
                                  "machine (rewriters/plan_guard.py)")
    depthwise_calls: bool = _option(True, bool, "run a depthwise convolution that Keras "
                                    "writes as a grouped Conv2D in a call XLA compiles "
                                    "(Conv2D(groups=channels) on CPU) as TF's "
                                    "DepthwiseConv2dNative (rewriters/depthwise_calls.py)")
    pack: bool = _option(True, bool, "fusion='stitch' or 'explore': pack kernels that no "
                         "path connects into one launch (rewriters/packing.py)")
    target: str = _option("cpu", str, "the kernels' target: 'cpu' (C++ kernels) or "
                          "'cuda-emulated' (each cluster's CUDA schedule emulated in C++ "
                          "inside the same CPU op: the GPU index math, barriers and shuffles "
                          "run on whole models; tf_fusionstitch/kernels.py); the GPU "
                          "target launches a kernel per cluster, so it does not pack",
                          choices=TARGETS)
    rewrite_cache: bool = _option(True, bool, "reuse the rewrite of an identical traced "
                                  "graph from the disk cache (tf_fusionstitch/rewrite_cache.py)")
    specialize: bool = _option(True, bool, "where a call's arguments make dynamic sizes "
                               "equal that decide a gradient's reduction, rewrite a version "
                               "assuming them; every call checks its sizes and runs a "
                               "version they fit (tf_fusionstitch/versions.py)")
    measured_choice: int = _option(0, int, "N > 0: each version's first calls alternate "
                                   "between the fused and the original function (one "
                                   "untimed and N timed calls of each, rounded up to whole "
                                   "cycles) and the faster one runs from then on "
                                   "(tf_fusionstitch/measured_choice.py); "
                                   "0: always the fused one", lo=0, hi=1000)
    measured_plans: int = _option(8, int, "fusion='explore' only: N > 0: each version's "
                                  "first calls alternate between the explored plan and "
                                  "XLA's rule plan of the same function (one untimed and N "
                                  "timed calls of each, rounded up to whole cycles; with "
                                  "measured_choice, the original function too) and the "
                                  "fastest runs from then on "
                                  "(tf_fusionstitch/measured_choice.py); 0: always the "
                                  "explored plan", lo=0, hi=1000)
    background: bool = _option(False, bool, "the first calls run the original function "
                               "while the rewrite and its kernels' compilation run on a "
                               "thread; calls run the optimized function once it is ready "
                               "(tf_fusionstitch/background.py, OptimizedFunction.wait)")

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            types = meta["types"]
            if not isinstance(value, types) or isinstance(value, bool) != (types is bool):
                raise TypeError(f"optimize() option {f.name}={value!r}: expected "
                                f"{meta['what']} ({getattr(types, '__name__', types)})")
            if meta["choices"] and value not in meta["choices"]:
                allowed = ", ".join(repr(c) for c in meta["choices"])
                raise ValueError(f"optimize() option {f.name}={value!r} is not one of {allowed}")
            lo, hi = meta["range"]
            if lo is not None and hi is None and value < lo:
                raise ValueError(f"optimize() option {f.name} must be at least {lo}")
            if hi is not None and not lo <= value <= hi:
                raise ValueError(f"optimize() option {f.name}={value} is out of range: "
                                 f"expected {lo} to {hi}")

    @classmethod
    def from_call(cls, **given: Any) -> "FusionOptions":
        """The options of an optimize(fn, **given) call, with its errors."""
        names = {f.name for f in dataclasses.fields(cls)}
        for key in given:
            if key not in names:
                raise TypeError(f"optimize() got an unknown option {key!r}; options are: "
                                f"{', '.join(sorted(names))}")
        options = cls(**given)
        if options.target != "cpu":
            if given.get("pack"):
                raise ValueError(f"optimize() option pack=True applies to target='cpu' (got "
                                 f"target={options.target!r}, whose kernels launch one per "
                                 "cluster); drop pack")
            options = dataclasses.replace(options, pack=False)
        if "pack" in given and options.fusion == "xla_like":
            raise ValueError("optimize() option pack applies to fusion='stitch' and "
                             "'explore' (got fusion='xla_like', which never packs, as XLA "
                             "does not); drop pack")
        for key in EXPLORE_ONLY:
            if key in given and options.fusion != "explore":
                raise ValueError(f"optimize() option {key} applies only to fusion='explore' "
                                 f"(got fusion={options.fusion!r}); pass fusion='explore' "
                                 f"or drop {key}")
        return options

    def cache_key(self) -> Dict[str, Any]:
        """The options that can change the rewritten graph (the rewrite cache's key)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in NOT_IN_CACHE_KEY}

    @classmethod
    def help(cls) -> Dict[str, str]:
        """Option name -> what it does."""
        return {f.name: f.metadata["what"] for f in dataclasses.fields(cls)}


# Options that do not change the rewritten graph, so stay out of the rewrite cache's key.
NOT_IN_CACHE_KEY = ("rewrite_cache", "measured_choice", "measured_plans", "background")
# Options that only mean something under fusion="explore".
EXPLORE_ONLY = ("explore_k", "explore_beam", "costs", "explore_guard", "measured_plans")
