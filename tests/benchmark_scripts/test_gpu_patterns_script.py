"""benchmarks/gpu_patterns.py, the prepared GPU script, checked without a GPU.

Its --compile_only --quick mode builds every case's CUDA kernel for sm_90
with the plan chosen for the H200, compiles its host shape function and runs
the C++ emulation of the CUDA schedule against NumPy: the table must list
every case with ok, and neither importing nor running it may import
TensorFlow (the GPU machines it is meant for have none).
"""

import json
import subprocess
import sys

import pytest

from tf_fusionstitch.runtime import nvrtc
import script_testlib

SCRIPT = script_testlib.benchmark_script("gpu_patterns.py")
CASES = ["layernorm", "softmax", "softmax_1024", "bias_gelu_erf", "bias_gelu_tanh",
         "residual_layernorm", "bn_inference_relu"]

if nvrtc.nvrtc_version() is None:
    pytest.skip("NVRTC cannot be loaded (pip install cupy-cuda12x nvidia-cuda-nvrtc-cu12)",
                allow_module_level=True)


def test_compile_only_lists_every_pattern_ok_without_tensorflow(tmp_path):
    out = tmp_path / "gpu_patterns.md"
    res = subprocess.run([sys.executable, str(SCRIPT), "--compile_only", "--quick",
                          "--arch=sm_90", f"--out={out}"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    for name in CASES:
        (line,) = [l for l in lines if l.split() and l.split()[0] == name]
        assert line.endswith("yes"), line
    assert f"gpu_patterns: {len(CASES)} kernels, {len(CASES)} ok, 0 failed" in lines
    report = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in report["rows"]] == CASES
    assert all(r["ok"] and r["emulated_rows"] >= 1 for r in report["rows"]), report["rows"]
    assert report["meta"]["tensorflow_imported"] is False
    assert "| layernorm | 512x1024 |" in out.read_text()


def test_importing_the_script_does_not_import_tensorflow():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('gpu_patterns', {str(SCRIPT)!r})\n"
            "module = importlib.util.module_from_spec(spec)\n"
            "sys.modules['gpu_patterns'] = module\n"
            "spec.loader.exec_module(module)\n"
            "assert len(module.cases()) == 7\n"
            "print('tensorflow' in sys.modules)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
