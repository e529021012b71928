"""One distribution, one import root: the top-level folders install under tf_fusionstitch.

TensorFlow is not in install_requires: `tensorflow`, `tensorflow-cpu` and `tensorflow[and-cuda]`
are different distributions of the same module, and requiring one would install it over
whichever the user has. The extras pick one for a fresh environment; the TF-facing modules
check the installed version when imported (tf_fusionstitch/tensorflow_requirement.py).
"""

import ast
import pathlib
import runpy

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent

PACKAGES = {
    "tf_fusionstitch": "tf_fusionstitch",
    "tf_fusionstitch.codegen": "tf_fusionstitch/codegen",
    "tf_fusionstitch.gpu": "tf_fusionstitch/gpu",
    "tf_fusionstitch.runtime": "tf_fusionstitch/runtime",
    "tf_fusionstitch.tools": "tf_fusionstitch/tools",
    "tf_fusionstitch.tools.fuzzing": "tf_fusionstitch/tools/fuzzing",
    "tf_fusionstitch.rewriters": "rewriters",
    "tf_fusionstitch.custom_ops": "custom_ops",
    "tf_fusionstitch.planner": "planner",
}


def package_version() -> str:
    """`__version__` of tf_fusionstitch/__init__.py, the one place the version is written."""
    tree = ast.parse((HERE / "tf_fusionstitch" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise RuntimeError("tf_fusionstitch/__init__.py sets no __version__")


# The module is stdlib-only, so it runs here without the package's dependencies.
TF_RANGE = runpy.run_path(str(HERE / "tf_fusionstitch" / "tensorflow_requirement.py"))["PIP_RANGE"]
TF_GPU = [f"tensorflow[and-cuda]{TF_RANGE}"]

setup(
    name="tf_fusionstitch",
    version=package_version(),
    description="Stitched fusion of memory-intensive TensorFlow ops into generated kernels",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    # The HTML pages inline these (tf_fusionstitch/static/README.md).
    package_data={"tf_fusionstitch.custom_ops": ["*.cc", "*.h"],
                  "tf_fusionstitch": ["static/*.js", "static/LICENSE.*", "static/README.md"]},
    install_requires=[
        "numpy>=1.26,<3",
        "absl-py>=2.1",
        "tqdm>=4.66",
    ],
    extras_require={
        # TensorFlow for an environment that has none (pip install 'tf_fusionstitch[cpu]').
        "cpu": [f"tensorflow-cpu{TF_RANGE}; platform_machine=='x86_64'",
                f"tensorflow{TF_RANGE}; platform_machine!='x86_64'"],
        "and-cuda": TF_GPU,
        "gpu": TF_GPU,
        # CUDA kernels compiled by NVRTC through CuPy (with any TensorFlow).
        "cuda": ["cupy-cuda12x>=13", "nvidia-cuda-nvrtc-cu12>=12"],
        "test": ["pytest>=8", "tf2onnx>=1.17,<1.18", "onnxruntime>=1.20"],
    },
)
