"""Whether a CUDA GPU is visible, for the `gpu` marker (conftest.py) and the
tests that behave differently with one. TF-free: CuPy alone answers."""

import functools


@functools.lru_cache(maxsize=None)
def gpu_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001  (no CuPy, no driver, or no device)
        return 0


NO_GPU = ("no CUDA GPU visible to CuPy (pip install cupy-cuda12x and run on a machine "
          "with a GPU and driver)")
