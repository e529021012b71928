"""The Java rules that Bazel 4's own tools load from @rules_java//java:defs.bzl: the native
rules. Nothing here builds Java: Bazel reads its JDK package when it resolves toolchains.
WORKSPACE says why this stands in."""

java_binary = native.java_binary
java_import = native.java_import
java_library = native.java_library
java_proto_library = native.java_proto_library
java_runtime = native.java_runtime
java_toolchain = native.java_toolchain
