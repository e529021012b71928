"""The C++ rules that Bazel 4's own tools load from @rules_cc//cc:defs.bzl: the native rules
(what rules_cc's first releases wrapped). WORKSPACE says why this stands in."""

cc_binary = native.cc_binary
cc_library = native.cc_library
cc_test = native.cc_test
cc_proto_library = native.cc_proto_library
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
