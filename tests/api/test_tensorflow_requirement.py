"""The installed TensorFlow's version check (tf_fusionstitch/tensorflow_requirement.py), on
simulated installs: distribution metadata written to a temporary folder. TF-free."""

import os
import pathlib
import subprocess
import sys

import pytest

import repo_paths
from tf_fusionstitch.tensorflow_requirement import PIP_RANGE, check, installed


def fake_distribution(site: pathlib.Path, name: str, version: str, top_level=True):
    """Metadata of distribution `name` providing the `tensorflow` module, as pip writes it
    (top_level.txt from setuptools, else only RECORD)."""
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if top_level:
        (info / "top_level.txt").write_text("tensorflow\n")
    else:
        (info / "RECORD").write_text("tensorflow/__init__.py,,\n"
                                     f"{info.name}/METADATA,,\n")


def test_a_supported_version_passes(tmp_path):
    fake_distribution(tmp_path, "tensorflow", "2.21.3")
    assert check([str(tmp_path)]) == "2.21.3"


def test_a_distribution_without_top_level_txt_is_found_by_its_files(tmp_path):
    fake_distribution(tmp_path, "tf-nightly", "2.21.0.dev20260101", top_level=False)
    fake_distribution(tmp_path, "numpy-like", "2.21.0", top_level=False)
    (next(tmp_path.glob("numpy_like*")) / "RECORD").write_text("numpy_like/__init__.py,,\n")
    assert installed([str(tmp_path)]) == [("tf-nightly", "2.21.0.dev20260101")]


@pytest.mark.parametrize("version", ["2.20.0", "2.22.0rc1", "3.0.0"])
def test_an_unsupported_version_is_refused_naming_it_and_what_to_install(tmp_path, version):
    fake_distribution(tmp_path, "tensorflow-cpu", version)
    with pytest.raises(ImportError) as raised:
        check([str(tmp_path)])
    message = str(raised.value)
    assert f"installed: tensorflow-cpu {version}." in message
    assert f"pip install 'tensorflow-cpu{PIP_RANGE}'" in message


def test_two_distributions_are_both_named(tmp_path):
    fake_distribution(tmp_path, "tensorflow", "2.21.0")
    fake_distribution(tmp_path, "tensorflow-cpu", "2.20.1")
    with pytest.raises(ImportError,
                       match=r"installed: tensorflow 2\.21\.0, tensorflow-cpu 2\.20\.1 \(2 "
                             r"distributions provide the `tensorflow` module"):
        check([str(tmp_path)])


def test_none_installed_says_what_to_pip_install(tmp_path):
    with pytest.raises(ImportError) as raised:
        check([str(tmp_path)])
    message = str(raised.value)
    assert "not installed" in message
    assert "pip install 'tf_fusionstitch[cpu]'" in message
    assert f"pip install 'tensorflow{PIP_RANGE}'" in message


def test_a_tensorflow_without_metadata_reports_its_own_version(tmp_path, monkeypatch):
    module = tmp_path / "tensorflow"
    module.mkdir()
    (module / "__init__.py").write_text("__version__ = '2.19.0'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    real = sys.modules.pop("tensorflow", None)   # a real one imported by an earlier test
    try:
        with pytest.raises(ImportError, match=r"installed: tensorflow 2\.19\.0\."):
            check([str(tmp_path)])
    finally:
        sys.modules.pop("tensorflow", None)
        if real is not None:
            sys.modules["tensorflow"] = real


@pytest.mark.parametrize("module", ["tf_fusionstitch.api", "tf_fusionstitch.custom_ops.loader"])
def test_importing_a_tf_facing_module_refuses_an_unsupported_tensorflow(tmp_path, module):
    # The fake distribution comes first on the path; any real TensorFlow is never imported.
    fake_distribution(tmp_path, "tensorflow", "2.20.0")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    result = subprocess.run(
        [sys.executable, "-c", f"import sys\ntry:\n    import {module}\nexcept ImportError as e:\n"
         "    print(e, 'tensorflow' in sys.modules)\n"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "installed: tensorflow 2.20.0" in result.stdout, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("False"), result.stdout


def test_requirements_txt_installs_the_supported_range():
    # requirements.txt (what `make` installs) names TensorFlow itself; it must agree.
    lines = [line.split("#")[0].strip() for line in
             (repo_paths.REPO / "requirements.txt").read_text().splitlines()]
    tensorflow_lines = [line for line in lines if line.startswith(("tensorflow", "tf-"))]
    assert tensorflow_lines
    for line in tensorflow_lines:
        requirement = line.split(";")[0].replace(" ", "")
        assert requirement.endswith(PIP_RANGE), line

