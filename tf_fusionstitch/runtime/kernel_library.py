"""Compile many generated kernels in few compiler runs (TF-free).

Most of a small kernel's compile time is what every kernel repeats: the
compiler's start, the headers and the prelude all kernels share, the link.
Kernels whose sources begin with the same prelude (codegen/printer.headers)
are therefore compiled several to a *library*: the prelude once, then each
kernel's own code in a namespace of its own, its ABI symbols renamed
`fs_meta_<symbol>`, `fs_shape_<symbol>`, ... (docs/KERNEL_ABI.md, "Libraries").
The 110 kernels of a MobileNetV2 train step took 17.5 s of CPU one by one
and 11.0 s sixteen to a library.

Each kernel stays content-addressed by its own source, under the key
cpu_compiler.compile_shared_object gives that source alone. A kernel compiled
alone is `<key>.so`; one compiled in a library has a record `<key>.lib` with
the library's key and the kernel's symbol, written (atomically and
hash-checked, like every entry) only once the library is in place. Two
processes that compile overlapping sets each build their own library; both
stay valid, and the kernels they share keep whichever record came last.

A library that fails to compile (one kernel's error, a timeout) is compiled
again kernel by kernel, so only the kernels that fail alone fail.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pathlib
from typing import Dict, List, Optional, Sequence, Union

from tf_fusionstitch.runtime import cache, cpu_compiler, progress

# The symbols of docs/KERNEL_ABI.md that a kernel in a library exports renamed.
ABI_SYMBOLS = ("fs_meta", "fs_shape", "fs_run", "fs_check_inputs")
RECORD_SUFFIX = ".lib"

# A library holds at most this many kernels and this much of their own code
# (beyond the prelude): most of the saving comes by sixteen, and smaller
# libraries keep the work spread over the workers and a failure cheap.
MAX_KERNELS = 16
MAX_BYTES = 256 << 10


@dataclasses.dataclass(frozen=True)
class CompiledObject:
    """Where a compiled kernel lives: a shared object, and the suffix of its
    ABI symbols there ("" for a kernel compiled alone: plain fs_meta, ...)."""
    path: pathlib.Path
    symbol: str = ""


def symbol_of(key: str) -> str:
    """The symbol suffix of the kernel whose standalone key is `key`."""
    return "k" + key[:24]


def library_source(prelude: str, members: Sequence[tuple]) -> str:
    """One translation unit of (symbol, source) members, each source
    beginning with `prelude`: the prelude once, then each member's own code
    in its namespace with its ABI symbols renamed. The preprocessor renames
    only whole identifiers, so private names (fs_run_p0) and strings stay."""
    pieces = [prelude]
    for symbol, source in members:
        if not source.startswith(prelude):
            raise ValueError("a library member does not begin with the shared prelude")
        pieces += [f"#define {name} {name}_{symbol}" for name in ABI_SYMBOLS]
        pieces += [f"namespace fs_{symbol} {{", source[len(prelude):],
                   f"}}  // namespace fs_{symbol}"]
        pieces += [f"#undef {name}" for name in ABI_SYMBOLS]
    pieces.append("")
    return "\n".join(pieces)


Outcome = Union[CompiledObject, Exception]


def compile_kernels(sources: Sequence[str], prelude: str, *, timeout: float = 120,
                    workers: Optional[int] = None) -> List[Outcome]:
    """A CompiledObject or the exception that stopped it, per source.
    Sources found in the cache are not compiled again; the others are
    compiled in libraries of a few (those beginning with `prelude`) or alone,
    over `workers` compiler runs at a time (default: one per CPU).
    `timeout`: seconds one kernel may take (a library of n gets n times that)."""
    outcome: Dict[str, Outcome] = {}
    try:
        keys = {s: cpu_compiler.object_key(s, timeout=timeout) for s in set(sources)}
    except (cpu_compiler.CompileError, cache.CacheError, OSError) as e:
        return [e for _ in sources]
    libraries: Dict[str, Optional[pathlib.Path]] = {}
    for source, key in keys.items():
        try:
            found = _lookup(key, libraries)
        except (cache.CacheError, OSError) as e:
            outcome[source] = e
            continue
        if found is not None:
            outcome[source] = found
    missing = sorted((s for s in keys if s not in outcome), key=keys.get)
    workers = max(1, workers or os.cpu_count() or 1)
    groups = _groups(missing, prelude, workers)
    if groups:
        with concurrent.futures.ThreadPoolExecutor(min(workers, len(groups))) as pool, \
                progress.kernels_bar(len(missing)) as bar:
            futures = [pool.submit(_compile_group, g, keys, prelude, timeout) for g in groups]
            for future in concurrent.futures.as_completed(futures):
                done = future.result()
                outcome.update(done)
                bar.update(len(done))
    return [outcome[s] for s in sources]


def _lookup(key: str, libraries: Dict[str, Optional[pathlib.Path]]) -> Optional[CompiledObject]:
    """The cached object of the kernel with standalone key `key`, or None.
    `libraries` memoises library checks (a library holds several kernels)."""
    alone = cache.find_verified(key, ".so")
    if alone is not None:
        return CompiledObject(alone)
    record = cache.read_verified(key, RECORD_SUFFIX)
    if record is None:
        return None
    try:
        library_key, symbol = record.decode("ascii").split()
    except (UnicodeDecodeError, ValueError):
        return None
    if symbol != symbol_of(key):
        return None
    if library_key not in libraries:
        libraries[library_key] = cache.find_verified(library_key, ".so")
    path = libraries[library_key]
    return None if path is None else CompiledObject(path, symbol)


def _groups(sources: List[str], prelude: str, workers: int) -> List[List[str]]:
    """The missing sources cut into libraries: at least one per worker,
    balanced by code size (largest first onto the lightest), within
    MAX_KERNELS and MAX_BYTES. A source without the prelude, or with more
    own code than half a library, is a group of its own."""
    single = {s for s in sources if not s.startswith(prelude) or
              len(s) - len(prelude) > MAX_BYTES // 2}
    alone = [[s] for s in sources if s in single]
    rest = [s for s in sources if s not in single]
    if not rest:
        return alone
    size = {s: len(s) - len(prelude) for s in rest}
    total = sum(size.values())
    count = max(min(workers, len(rest)), -(-total // MAX_BYTES), -(-len(rest) // MAX_KERNELS))
    groups: List[List[str]] = [[] for _ in range(count)]
    loads = [0] * count
    for s in sorted(rest, key=lambda s: -size[s]):
        open_groups = [i for i in range(count) if len(groups[i]) < MAX_KERNELS] or range(count)
        i = min(open_groups, key=lambda i: (loads[i], i))
        groups[i].append(s)
        loads[i] += size[s]
    return alone + [g for g in groups if g]


def _compile_group(group: List[str], keys: Dict[str, str], prelude: str,
                   timeout: float) -> Dict[str, Outcome]:
    if len(group) == 1:
        return {group[0]: _compile_alone(group[0], timeout)}
    members = sorted(((symbol_of(keys[s]), s) for s in group))
    source = library_source(prelude, members)
    try:
        path = cpu_compiler.compile_shared_object(source, timeout=timeout * len(members),
                                                  kernels=len(members))
        library_key = path.name[:-len(".so")]
        for symbol, s in members:
            cache.write_verified(keys[s], RECORD_SUFFIX, f"{library_key} {symbol}\n".encode())
    except cpu_compiler.CompilerNotFound as e:
        return {s: e for s in group}
    except (cpu_compiler.CompileError, cache.CacheError, OSError):
        # Which kernel failed, and whether alone it would, only compiling it alone tells.
        return {s: _compile_alone(s, timeout) for s in group}
    return {s: CompiledObject(path, symbol) for symbol, s in members}


def _compile_alone(source: str, timeout: float) -> Outcome:
    try:
        return CompiledObject(cpu_compiler.compile_shared_object(source, timeout=timeout))
    except (cpu_compiler.CompileError, cache.CacheError, OSError) as e:
        return e
