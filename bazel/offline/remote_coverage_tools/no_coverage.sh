#!/bin/sh
# Bazel 4 downloads its coverage tools; offline there are none (WORKSPACE says why).
echo "bazel coverage is not available: Bazel's coverage tools are not installed" >&2
exit 1
