"""The Java rules that Bazel 4's own tools load from @rules_java//java:defs.bzl, as the native
rules they wrap. Nothing here builds Java: Bazel reads its JDK package when it resolves
toolchains. WORKSPACE says why this stands in."""

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)

def java_proto_library(**attrs):
    native.java_proto_library(**attrs)

def java_runtime(**attrs):
    native.java_runtime(**attrs)

def java_toolchain(**attrs):
    native.java_toolchain(**attrs)
