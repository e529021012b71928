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

Kernels also share code: the generator marks a function that another kernel
may hold too (SHARED_BEGIN name ... SHARED_END; its name is a hash of its
text), and a library compiles each such function once, before its members.
The layers of a CNN differ mostly in their sizes, which the run functions
read at run time: MobileNetV2's train step has 127 run functions, 56 of
them distinct. Kernels that share functions are put in one library where
that keeps the workers balanced.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import os
import pathlib
from typing import Dict, List, Optional, Sequence, Union

from tf_fusionstitch.runtime import cache, cpu_compiler, progress

# The symbols of docs/KERNEL_ABI.md that a kernel in a library exports renamed.
ABI_SYMBOLS = ("fs_meta", "fs_shape", "fs_run", "fs_check_inputs")
RECORD_SUFFIX = ".lib"
# Around a function that kernels may share: the begin marker is followed by the
# function's name on its line. Only generated sources carry them (codegen/printer.py).
SHARED_BEGIN = "// fs-shared-begin "
SHARED_END = "// fs-shared-end"

# A library holds at most this many kernels and this much of their own code
# (beyond the prelude): smaller libraries keep the work spread over the
# workers and a failure cheap; larger ones share more. MobileNetV2's train
# step at 16: 8 libraries, 73 run functions, 5.4 s of compiler CPU; at 32:
# 4 libraries, 68 run functions, 5.0 s.
MAX_KERNELS = 32
MAX_BYTES = 256 << 10
# A family of kernels (_groups) stays in one library unless that library
# would then cost more than this many times the average.
BALANCE = 1.1


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
    beginning with `prelude`: the prelude once, then the members' shared
    functions once each, then each member's own code in its namespace with
    its ABI symbols renamed. The preprocessor renames only whole
    identifiers, so private names (fs_run_p0) and strings stay. Raises
    ValueError for a member without the prelude, or two shared functions of
    one name and different text."""
    shared: Dict[str, str] = {}
    own = []
    for symbol, source in members:
        if not source.startswith(prelude):
            raise ValueError("a library member does not begin with the shared prelude")
        own.append((symbol, split_shared(source[len(prelude):], shared)))
    pieces = [prelude, *shared.values()]
    for symbol, code in own:
        pieces += [f"#define {name} {name}_{symbol}" for name in ABI_SYMBOLS]
        pieces += [f"namespace fs_{symbol} {{", code, f"}}  // namespace fs_{symbol}"]
        pieces += [f"#undef {name}" for name in ABI_SYMBOLS]
    pieces.append("")
    return "\n".join(pieces)


def mark_shared(code: str, placeholder: str) -> tuple:
    """(name, marked text) of the function `placeholder` that `code`
    defines first, renamed `<placeholder>_<hash of code>`: kernels that print
    the same function give it the same name, and a library compiles it once."""
    name = f"{placeholder}_" + hashlib.sha256(code.encode("utf-8")).hexdigest()[:24]
    renamed = code.replace(f" {placeholder}(", f" {name}(", 1)
    return name, "\n".join([SHARED_BEGIN + name, renamed, SHARED_END])


def _shared_blocks(code: str):
    """(start, stop, name, text) of each shared function in `code`, in order.
    Raises ValueError where a marker is unmatched."""
    pos = 0
    while (begin := code.find(SHARED_BEGIN, pos)) >= 0:
        line_end = code.find("\n", begin)
        end = code.find(SHARED_END, begin)
        if line_end < 0 or end < 0:
            raise ValueError("a shared function's markers are unmatched")
        pos = end + len(SHARED_END)
        yield begin, pos, code[begin + len(SHARED_BEGIN):line_end], code[line_end + 1:end]


def _same_text(shared: Dict[str, str], name: str, text: str) -> bool:
    """Records `text` under `name`; whether it was there already. Raises
    ValueError where another text has that name."""
    known = name in shared
    if shared.setdefault(name, text) != text:
        raise ValueError(f"two shared functions named {name} differ")
    return known


def split_shared(code: str, shared: Dict[str, str]) -> str:
    """`code` without its shared functions, each added to `shared` (name ->
    text) unless there already. Raises ValueError where `shared` holds
    another text under the same name, or a marker is unmatched."""
    kept, pos = [], 0
    for begin, stop, name, text in _shared_blocks(code):
        _same_text(shared, name, text)
        kept.append(code[pos:begin])
        pos = stop
    kept.append(code[pos:])
    return "".join(kept)


def first_shared_only(code: str) -> str:
    """`code` with each shared function defined once, where it first occurs
    (the parts of a packed kernel that differ only in their sizes print the
    same functions). Raises ValueError as split_shared does."""
    seen: Dict[str, str] = {}
    kept, pos = [], 0
    for begin, stop, name, text in _shared_blocks(code):
        if not _same_text(seen, name, text):
            continue   # kept with the code before the next one
        kept.append(code[pos:begin])
        pos = stop + code.startswith("\n", stop)   # the end marker's line too
    kept.append(code[pos:])
    return "".join(kept)


def shared_names(source: str) -> List[str]:
    """The names of the shared functions `source` holds."""
    return [name for _, _, name, _ in _shared_blocks(source)]


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
    within MAX_KERNELS and MAX_BYTES, balanced by their cost to compile.
    Sources whose costliest shared function is the same (the same loop nest
    at other sizes) form a family, kept in one library where it fits in
    BALANCE times the average; the families, largest first, go onto the
    lightest library. A source without the prelude, or with more own code
    than half a library, is a group of its own. Costliest group first."""
    single = {s for s in sources if not s.startswith(prelude) or
              len(s) - len(prelude) > MAX_BYTES // 2}
    alone = [[s] for s in sources if s in single]
    rest = [s for s in sources if s not in single]
    if not rest:
        return alone
    # A source costs its own code, plus each shared function that its library
    # does not hold yet (_shared_cost).
    shared = {s: {name: (len(text), _shared_cost(name, text))
                  for _, _, name, text in _shared_blocks(s)} for s in rest}
    own = {s: len(s) - len(prelude) - sum(chars for chars, _ in shared[s].values())
           for s in rest}
    weight = {name: cost for s in rest for name, (_, cost) in shared[s].items()}
    total = sum(own.values()) + sum(weight.values())
    count = max(-(-total // MAX_BYTES), -(-len(rest) // MAX_KERNELS))
    count = min(len(rest), -(-count // workers) * workers)   # each worker as many
    cap = BALANCE * total / count

    def cost(members: List[str]) -> int:
        return sum(own[s] for s in members) + sum(
            weight[name] for name in set().union(*(shared[s] for s in members)))
    families: Dict[str, List[str]] = {}
    for s in sorted(rest, key=lambda s: (-own[s] - sum(weight[n] for n in shared[s]), s)):
        key = max(shared[s], key=lambda name: (weight[name], name)) if shared[s] else s
        families.setdefault(key, []).append(s)
    units = []   # families cut where one would outgrow a library
    for members in families.values():
        unit: List[str] = []
        for s in members:
            if unit and (len(unit) >= MAX_KERNELS or cost(unit + [s]) > cap):
                units.append(unit)
                unit = []
            unit.append(s)
        units.append(unit)
    groups: List[List[str]] = [[] for _ in range(count)]
    for unit in sorted(units, key=lambda u: (-cost(u), u)):
        fits = [i for i in range(count) if len(groups[i]) + len(unit) <= MAX_KERNELS]
        i = min(fits or range(count), key=lambda i: (cost(groups[i] + unit), i))
        groups[i] += unit
    # The costliest first: the pool's workers take them in this order, and a
    # long library started last would run alone at the end.
    return sorted(alone + [g for g in groups if g],
                  key=lambda g: -(cost(g) if g[0] in own else len(g[0])))


def _shared_cost(name: str, text: str) -> int:
    """What the shared function `name` costs a library to compile, in
    characters: a shape function (-O1, codegen/shape_fn.py) a quarter of
    its size; a library's loop nests, not its checks, make it slow."""
    return len(text) // 4 if name.startswith("fs_shape_body_") else len(text)


def _compile_group(group: List[str], keys: Dict[str, str], prelude: str,
                   timeout: float) -> Dict[str, Outcome]:
    if len(group) == 1:
        return {group[0]: _compile_alone(group[0], timeout)}
    members = sorted(((symbol_of(keys[s]), s) for s in group))
    try:
        source = library_source(prelude, members)
        path = cpu_compiler.compile_shared_object(source, timeout=timeout * len(members),
                                                  kernels=len(members))
        library_key = path.name[:-len(".so")]
        for symbol, s in members:
            cache.write_verified(keys[s], RECORD_SUFFIX, f"{library_key} {symbol}\n".encode())
    except cpu_compiler.CompilerNotFound as e:
        return {s: e for s in group}
    except (cpu_compiler.CompileError, cache.CacheError, OSError, ValueError):
        # Which kernel failed, and whether alone it would, only compiling it alone tells.
        return {s: _compile_alone(s, timeout) for s in group}
    return {s: CompiledObject(path, symbol) for symbol, s in members}


def _compile_alone(source: str, timeout: float) -> Outcome:
    try:
        return CompiledObject(cpu_compiler.compile_shared_object(source, timeout=timeout))
    except (cpu_compiler.CompileError, cache.CacheError, OSError) as e:
        return e
