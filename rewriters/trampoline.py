"""Nested calls without Python's call stack: a walk whose depth follows the
graph (functions calling functions, to any depth) keeps its frames as
generators on a list, so Python's recursion limit never applies to it.

A generator function takes the place of a recursive one: where it would call
itself (or a partner) it yields the generator of that call, and the yield
evaluates to the call's return value, or raises what the call raised, so
its code reads as the recursive version does and means the same.
"""

from __future__ import annotations

from typing import Generator


def run(root: Generator):
    """Runs `root` and every generator it yields, each to its end before the
    one that yielded it resumes; returns what `root` returns."""
    stack = [root]
    value, error = None, None
    while True:
        frame = stack[-1]
        try:
            if error is not None:
                call = frame.throw(error)
            else:
                call = frame.send(value)
        except StopIteration as done:
            stack.pop()
            value, error = done.value, None
            if not stack:
                return value
            continue
        except BaseException as e:  # noqa: BLE001  (goes to the caller, as a raise would)
            stack.pop()
            if not stack:
                raise
            value, error = None, e
            continue
        stack.append(call)
        value, error = None, None
