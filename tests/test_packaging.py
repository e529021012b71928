"""The repository's top-level folders install under the single import root `tf_fusionstitch`.

No TensorFlow is needed here (this file checks layout), so it uses absltest directly.
"""

import email.parser
import os
import pathlib
import runpy
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from unittest import mock

from absl.testing import absltest
from packaging.requirements import Requirement
import pytest
import setuptools
import repo_paths
import tf_fusionstitch
from tf_fusionstitch import html_page
from tf_fusionstitch.tensorflow_requirement import DISTRIBUTIONS, PIP_RANGE

REPO = str(repo_paths.REPO)
TOP_LEVEL = ("rewriters", "custom_ops", "planner")
OP_SOURCE = "custom_ops/fusion_stitch_op.cc"


def _setup_kwargs():
    """The keyword arguments setup.py passes to setuptools.setup, without running it."""
    captured = {}
    with mock.patch.object(setuptools, "setup", lambda **kw: captured.update(kw)):
        runpy.run_path(os.path.join(REPO, "setup.py"), run_name="__main__")
    return captured


def _run_isolated(code):
    """Runs `code` in a fresh interpreter outside the repository (cwd not on sys.path)."""
    with tempfile.TemporaryDirectory() as cwd:
        return subprocess.run([sys.executable, "-I", "-c", code], cwd=cwd,
                              capture_output=True, text=True, timeout=120)


class PackagingTest(absltest.TestCase):

    def test_top_level_folders_map_under_the_import_root(self):
        package_dir = _setup_kwargs()["package_dir"]
        self.assertEqual(package_dir["tf_fusionstitch"], "tf_fusionstitch")
        self.assertEqual(package_dir["tf_fusionstitch.rewriters"], "rewriters")
        self.assertEqual(package_dir["tf_fusionstitch.custom_ops"], "custom_ops")
        for folder in TOP_LEVEL:
            if os.path.exists(os.path.join(REPO, folder, "__init__.py")):
                self.assertEqual(package_dir.get(f"tf_fusionstitch.{folder}"), folder,
                                 f"{folder}/ is a package: map it in setup.py's package_dir")
        for name in package_dir:
            self.assertTrue(name == "tf_fusionstitch" or name.startswith("tf_fusionstitch."),
                            f"{name} would install outside the tf_fusionstitch import root")

    def test_every_subpackage_is_listed(self):
        # packages= is an explicit list: a folder left out of it imports in an editable
        # install but is missing from a wheel.
        kwargs = _setup_kwargs()
        listed = set(kwargs["packages"])
        for package, folder in kwargs["package_dir"].items():
            for root, dirs, files in os.walk(os.path.join(REPO, folder)):
                dirs[:] = [d for d in dirs if d != "__pycache__"]
                if "__init__.py" in files:
                    rel = os.path.relpath(root, os.path.join(REPO, folder))
                    name = package if rel == "." else package + "." + rel.replace(os.sep, ".")
                    self.assertIn(name, listed, f"{root} is not in setup.py's packages")

    def test_only_the_import_root_is_importable(self):
        probe = ("import importlib.util as u\n"
                 f"for name in {TOP_LEVEL!r}:\n"
                 "    print(name, u.find_spec(name) is not None)\n"
                 "for name in ('tf_fusionstitch.rewriters', 'tf_fusionstitch.custom_ops'):\n"
                 "    print(name, u.find_spec(name) is not None)\n")
        result = _run_isolated(probe)
        self.assertEqual(result.returncode, 0, result.stderr)
        found = dict(line.split() for line in result.stdout.splitlines())
        for name in TOP_LEVEL:
            self.assertEqual(found[name], "False", f"a top-level `{name}` is importable")
        self.assertEqual(found["tf_fusionstitch.rewriters"], "True")
        self.assertEqual(found["tf_fusionstitch.custom_ops"], "True")

    def test_fusion_ir_does_not_import_tensorflow(self):
        result = _run_isolated(
            "import sys\n"
            "import tf_fusionstitch.fusion_ir\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf_keras')))\n")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.strip(), "[]")


def _build(command, cwd):
    result = subprocess.run([sys.executable, *command], cwd=cwd, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


class DistributionTest(absltest.TestCase):
    """The sdist, built from a copy of the source tree, and the wheel built from that sdist
    (as pip does from PyPI): what they carry and what the wheel requires."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls._tmp = tempfile.TemporaryDirectory(prefix="tf_fusionstitch-dist-")
        tmp = pathlib.Path(cls._tmp.name)
        # A copy, so that the build leaves nothing in the repository (and finds no stale build/).
        source = tmp / "source"
        folders = set(_setup_kwargs()["package_dir"].values())
        for folder in {f.split("/")[0] for f in folders}:
            shutil.copytree(os.path.join(REPO, folder), source / folder,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        for name in os.listdir(REPO):
            if os.path.isfile(os.path.join(REPO, name)):
                shutil.copy(os.path.join(REPO, name), source / name)
        _build(["setup.py", "-q", "sdist", "-d", str(tmp / "sdist")], cwd=source)
        (sdist,) = (tmp / "sdist").glob("*.tar.gz")
        with tarfile.open(sdist) as archive:
            cls.sdist_names = [name.split("/", 1)[-1] for name in archive.getnames()]
            archive.extractall(tmp / "unpacked", **(
                {"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        (unpacked,) = (tmp / "unpacked").iterdir()
        _build(["-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                "-w", str(tmp / "wheel"), str(unpacked)], cwd=tmp)
        (wheel,) = (tmp / "wheel").glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            cls.wheel_names = archive.namelist()
            (metadata,) = [n for n in cls.wheel_names if n.endswith(".dist-info/METADATA")]
            cls.metadata = email.parser.Parser().parsestr(archive.read(metadata).decode())

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()
        super().tearDownClass()

    def test_the_sdist_carries_the_op_source(self):
        self.assertIn(OP_SOURCE, self.sdist_names)
        self.assertIn("requirements.txt", self.sdist_names)

    def test_the_wheel_carries_the_op_source_under_the_import_root(self):
        self.assertIn("tf_fusionstitch/" + OP_SOURCE, self.wheel_names)
        self.assertIn("tf_fusionstitch/tensorflow_requirement.py", self.wheel_names)

    def test_both_carry_the_javascript_the_html_pages_inline(self):
        for name in html_page.LIBRARIES + ("report_page.js", "LICENSE.cytoscape"):
            self.assertIn(f"tf_fusionstitch/static/{name}", self.wheel_names)
            self.assertIn(f"tf_fusionstitch/static/{name}", self.sdist_names)

    def test_the_version_is_the_package_s(self):
        self.assertEqual(self.metadata["Version"], tf_fusionstitch.__version__)

    def test_tensorflow_is_required_only_in_extras(self):
        tensorflows = {}
        for line in self.metadata.get_all("Requires-Dist"):
            requirement = Requirement(line)
            if requirement.name.lower() in DISTRIBUTIONS:  # only in an extra
                self.assertIn("extra ==", str(requirement.marker),
                              f"{line}: a TensorFlow distribution outside the extras")
                self.assertEqual(str(requirement.specifier), str(Requirement(
                    "tensorflow" + PIP_RANGE).specifier), line)
                extra = str(requirement.marker).rpartition("extra == ")[2].strip('"')
                tensorflows.setdefault(extra, set()).add(
                    requirement.name.lower() + "".join(f"[{e}]" for e in requirement.extras))
        self.assertEqual(tensorflows, {"cpu": {"tensorflow-cpu", "tensorflow"},
                                       "gpu": {"tensorflow[and-cuda]"},
                                       "and-cuda": {"tensorflow[and-cuda]"}})
        self.assertIn("cuda", self.metadata.get_all("Provides-Extra"))


@pytest.mark.tf   # the environment with TensorFlow (the TF-free one has none)
class EnvironmentTest(absltest.TestCase):
    """What `make` installs: one TensorFlow distribution, keras-hub beside it."""

    def test_one_tensorflow_distribution_and_no_tensorflow_text(self):
        from importlib import metadata
        names = {(d.metadata["Name"] or "").lower().replace("_", "-")
                 for d in metadata.distributions()}
        tensorflows = sorted(n for n in names if n in DISTRIBUTIONS)
        self.assertLen(tensorflows, 1, f"TensorFlow distributions installed: {tensorflows}")
        self.assertNotIn("tensorflow-text", names)
        self.assertIn("keras-hub", names)


if __name__ == "__main__":
    absltest.main()
