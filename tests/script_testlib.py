"""The benchmark scripts the tests run end to end, in their own processes."""

import subprocess
import sys

import pytest

import repo_paths
from tf_fusionstitch.runtime import cpu_compiler


def benchmark_script(name: str):
    """benchmarks/<name>; skips the calling module where no C++ compiler is
    (every script compiles kernels or their host side)."""
    try:
        cpu_compiler.compiler_command()
    except cpu_compiler.CompilerNotFound as exc:
        pytest.skip(f"no C++ compiler: {exc}", allow_module_level=True)
    return repo_paths.BENCHMARKS / name


KEPT = "# Benchmark results\n\nkept\n"


def run_into_results(script, tmp_path, *flags, timeout: float) -> str:
    """Runs `script` with `flags` and --out=<a RESULTS.md holding other text>;
    asserts it exited 0 and kept that text, and returns the file's text."""
    out = tmp_path / "RESULTS.md"
    out.write_text(KEPT)
    res = subprocess.run([sys.executable, str(script), *flags, f"--out={out}"],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stdout + res.stderr
    text = out.read_text()
    assert text.startswith(KEPT), text   # other sections kept
    return text
