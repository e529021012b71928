"""tf_fusionstitch: stitched fusion of memory-intensive TensorFlow ops.

`optimize` needs TensorFlow; the fusion IR, schedule, codegen and runtime
submodules do not, so they import on machines without it (docs/DESIGN.md,
"TF-free core").

Importing it registers the FusionStitch op with TensorFlow (at once if
TensorFlow is imported, else as soon as it is; op_registration.py), so that
SavedModels with fused kernels load with `tf.saved_model.load`.
"""

from tf_fusionstitch import op_registration

__version__ = "0.1.0"
op_registration.register_with_tensorflow()


def __getattr__(name):
    # Lazy: importing the TF-free core must not import TensorFlow.
    if name in ("optimize", "OptimizedFunction"):
        from tf_fusionstitch import api
        return getattr(api, name)
    if name == "SavedModelConverter":
        from tf_fusionstitch import saved_model_converter
        return saved_model_converter.SavedModelConverter
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
