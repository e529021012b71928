"""The repository's modules and the imports between them, read with ast
(nothing is imported): for tests of the package's structure."""

from __future__ import annotations

import ast
import pathlib
from typing import Dict, List, Set, Tuple

import repo_paths

ROOT = repo_paths.REPO
# Import name of each top-level folder (setup.py's PACKAGES).
PACKAGES = {"tf_fusionstitch": "tf_fusionstitch", "tf_fusionstitch.rewriters": "rewriters",
            "tf_fusionstitch.planner": "planner", "tf_fusionstitch.custom_ops": "custom_ops"}


def modules() -> Dict[str, pathlib.Path]:
    """Module name -> file, for every module of the installed package."""
    out = {}
    for package, folder in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts
                     if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _resolve(module: str, path: pathlib.Path, node: ast.ImportFrom) -> str:
    """The absolute module an ImportFrom names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def imports(known: Dict[str, pathlib.Path]) -> Dict[str, Set[str]]:
    """Module -> the repository modules it imports (anywhere in the file,
    function bodies included: a lazy import is a dependency too)."""
    graph: Dict[str, Set[str]] = {}
    for module, path in known.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # `from pkg import mod` depends on pkg.mod; `from mod import x` on mod
                base = _resolve(module, path, node)
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in node.names]
            else:
                continue
            for name in names:
                # the longest known prefix: `from pkg import mod` names pkg.mod
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name and name != module:
                    deps.add(name)
        graph[module] = deps
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan,
    iterative), each sorted: every import cycle lies in one."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    on_stack: Set[str] = set()
    stack: List[str] = []
    out: List[List[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: List[Tuple[str, iter]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def private_uses(known: Dict[str, pathlib.Path]) -> List[str]:
    """'file:line name' for each private name (one leading underscore) of a
    repository module that another module imports or reads as an attribute."""
    found = []
    for module, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}   # local name -> repository module it stands for
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = _resolve(module, path, node)
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in known:
                        aliases[a.asname or a.name] = full
                    elif base in known and base != module and _private(a.name):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {base}.{a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in known and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases and _private(node.attr) \
                    and aliases[node.value.id] != module:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} "
                             f"{aliases[node.value.id]}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


# Distributions a test needs TensorFlow's stack for: a test module that
# reaches one of these at import time is a `tf` test, any other a `core` one.
TF_STACK = {"tensorflow", "keras", "keras_hub", "tf_keras", "tf2onnx", "onnxruntime"}


def _import_time_names(path: pathlib.Path) -> Set[str]:
    """The absolute modules a file imports when it is imported: statements
    at module level (in if/try blocks and class bodies too), not in function
    bodies, which run only when called. `from a import b` names a.b and a."""
    names: Set[str] = set()
    pending = list(ast.parse(path.read_text(), str(path)).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return names


def _test_units() -> Dict[str, pathlib.Path]:
    """Module name -> file for what tests import besides the package: the
    repository's benchmarks (as `benchmarks.x` from the root, and by bare
    name as their scripts import each other) and the tests' helper modules."""
    out = {}
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        parts = [p for p in path.relative_to(ROOT).with_suffix("").parts if p != "__init__"]
        out[".".join(parts)] = path
        if path.parent.name == "benchmarks":
            out.setdefault(path.stem, path)
    for path in sorted((ROOT / "tests").rglob("*.py")):
        if not path.name.startswith("test_") and path.name != "conftest.py":
            out[path.stem] = path
    return out


class TensorFlowReach:
    """Whether importing a file imports TensorFlow's stack, through the
    package, the benchmarks and the tests' helpers (read with ast)."""

    def __init__(self):
        self._units = {**modules(), **_test_units()}
        self._memo: Dict[pathlib.Path, bool] = {}

    def __call__(self, path: pathlib.Path) -> bool:
        path = pathlib.Path(path).resolve()
        if path not in self._memo:
            self._memo[path] = False   # an import cycle adds nothing
            self._memo[path] = any(self._reaches(name) for name in _import_time_names(path))
        return self._memo[path]

    def _reaches(self, name: str) -> bool:
        if name.split(".")[0] in TF_STACK:
            return True
        # importing a.b.c runs a's and a.b's __init__ first
        parts = name.split(".")
        prefixes = (".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return any(self(self._units[p]) for p in prefixes if p in self._units)
