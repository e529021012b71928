"""One distribution, one import root: the top-level folders install under tf_fusionstitch."""

from setuptools import setup

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

setup(
    name="tf_fusionstitch",
    version="0.1.0",
    description="Stitched fusion of memory-intensive TensorFlow ops into generated kernels",
    python_requires=">=3.10",
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    package_data={"tf_fusionstitch.custom_ops": ["*.cc", "*.h"]},
    install_requires=[
        "tensorflow-cpu>=2.21,<2.22; platform_machine=='x86_64'",
        "tensorflow>=2.21,<2.22; platform_machine!='x86_64'",
        "numpy>=1.26,<3",
        "absl-py>=2.1",
    ],
    extras_require={
        "test": ["pytest>=8", "tf2onnx>=1.17,<1.18", "onnxruntime>=1.20"],
        "cuda": ["cupy-cuda12x>=13", "nvidia-cuda-nvrtc-cu12>=12"],
    },
)
