"""The Python interpreter and the TensorFlow installed in it, as a Bazel repository.

As TensorFlow's custom-op template does, Bazel builds against the installed TensorFlow wheel
rather than TensorFlow's sources: this rule runs the interpreter (the repository environment's
PYTHON_BIN_PATH, else `python3` on PATH), asks `tf.sysconfig` for the headers, the framework
library and the flags they were built with, links them into the repository and writes a BUILD
file with:
  :tensorflow_framework  cc_library: TF's headers and libtensorflow_framework.so.2
  :python_toolchain      the same interpreter as the toolchain py_binary/py_test run on
and copts.bzl's TENSORFLOW_COPTS, TF's other compile flags (--std=c++17), for the op's copts.
Run `bazel sync --configure` (or `bazel clean --expunge`) after changing PYTHON_BIN_PATH's TF.
"""

_SYSCONFIG = """
import json, tensorflow as tf
print(json.dumps({"include": tf.sysconfig.get_include(), "lib": tf.sysconfig.get_lib(),
                  "compile_flags": tf.sysconfig.get_compile_flags(),
                  "link_flags": tf.sysconfig.get_link_flags(), "version": tf.__version__}))
"""

_BUILD = """
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

package(default_visibility = ["//visibility:public"])

# TensorFlow {version}, from {lib}
cc_library(
    name = "tensorflow_framework",
    hdrs = glob(["include/**"]),
    includes = ["include"],
    defines = {defines},
    srcs = ["lib/{library}"],
)

py_runtime(
    name = "python3_runtime",
    interpreter_path = "{python}",
    python_version = "PY3",
)

py_runtime_pair(name = "runtime_pair", py3_runtime = ":python3_runtime")

toolchain(
    name = "python_toolchain",
    toolchain = ":runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
"""

def _local_python_impl(ctx):
    python = ctx.os.environ.get("PYTHON_BIN_PATH") or ctx.which("python3")
    if not python:
        fail("no Python: set PYTHON_BIN_PATH (bazel build --repo_env=PYTHON_BIN_PATH=...)")
    result = ctx.execute([python, "-c", _SYSCONFIG], environment = {"TF_CPP_MIN_LOG_LEVEL": "3"})
    if result.return_code != 0:
        fail("%s cannot import TensorFlow (install it, or point PYTHON_BIN_PATH at a Python " +
             "that has it):\n%s" % (python, result.stderr))
    config = json.decode(result.stdout.strip().splitlines()[-1])
    library = None
    for flag in config["link_flags"]:
        if flag.startswith("-l:"):
            library = flag[len("-l:"):]
    if not library:
        fail("no -l:libtensorflow_framework... in tf.sysconfig.get_link_flags(): %s" %
             config["link_flags"])
    ctx.symlink(config["include"], "include")
    ctx.symlink(config["lib"] + "/" + library, "lib/" + library)
    defines = [f[len("-D"):] for f in config["compile_flags"] if f.startswith("-D")]
    # The rest (e.g. --std=c++17) a cc_library cannot pass on: BUILD loads them from here.
    copts = [f for f in config["compile_flags"] if not f.startswith(("-D", "-I"))]
    ctx.file("copts.bzl", "# tf.sysconfig.get_compile_flags() less -I and -D\n" +
                          "TENSORFLOW_COPTS = %r\n" % copts)
    ctx.file("BUILD", _BUILD.format(
        version = config["version"],
        lib = config["lib"],
        library = library,
        defines = repr(defines),
        python = str(python),
    ))

local_python = repository_rule(
    implementation = _local_python_impl,
    environ = ["PYTHON_BIN_PATH"],
    local = True,
    configure = True,
)
