"""`import_root`: setup.py's package_dir for Bazel.

setup.py installs the top-level folders rewriters/, custom_ops/ and planner/ as
tf_fusionstitch.rewriters, tf_fusionstitch.custom_ops and tf_fusionstitch.planner. Bazel's
Python rules cannot rename folders, so this rule copies each of those files to
<root>/<folder>/... in the same package: in the runfiles they sit beside tf_fusionstitch/'s own
modules, and the package imports as it does when installed.
"""

def _import_root_impl(ctx):
    outputs = []
    for src in ctx.files.srcs:
        # A copy, not a symlink: custom_ops/loader.py finds its .cc beside its own __file__.
        out = ctx.actions.declare_file(ctx.attr.root + "/" + src.short_path)
        ctx.actions.expand_template(template = src, output = out, substitutions = {})
        outputs.append(out)
    return [DefaultInfo(files = depset(outputs), runfiles = ctx.runfiles(files = outputs))]

import_root = rule(
    implementation = _import_root_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = True, doc = "files of the folders to move"),
        "root": attr.string(mandatory = True, doc = "the package they move into"),
    },
)
