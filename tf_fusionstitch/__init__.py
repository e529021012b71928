"""tf_fusionstitch: stitched fusion of memory-intensive TensorFlow ops.

`optimize` needs TensorFlow; the fusion IR, schedule, codegen and runtime
submodules do not, so they import on machines without it (docs/DESIGN.md,
"TF-free core").
"""

__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: importing the TF-free core must not import TensorFlow.
    if name in ("optimize", "OptimizedFunction"):
        from tf_fusionstitch import api
        return getattr(api, name)
    if name == "memory_intensive_kernels":  # for benchmarks: count any GraphDef
        from tf_fusionstitch.rewriters import kernel_count
        return kernel_count.memory_intensive_kernels
    if name == "keras":   # tf_fusionstitch.keras.optimize(model): Keras 3 models
        import importlib
        return importlib.import_module("tf_fusionstitch.keras")
    if name == "planner":
        # TF-free until a search traces a function
        import importlib
        return importlib.import_module("tf_fusionstitch.planner")
    raise AttributeError(f"module 'tf_fusionstitch' has no attribute {name!r}")
