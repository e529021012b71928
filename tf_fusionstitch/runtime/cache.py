"""Content-addressed disk cache for compiled artifacts (TF-free).

Layout of the cache directory (user-owned, 0700):

    <key><suffix>          the artifact (a kernel .so; a rewritten graph, see
                           tf_fusionstitch/rewrite_cache.py)
    <key><suffix>.sha256   its sha256, verified on every lookup
    <key><suffix>.lock     fcntl lock serialising builders of that key

Artifacts are written to a temporary name in the same directory and moved into
place with os.replace, so readers never see a torn file; the sidecar hash
catches anything else (a crash mid-copy, a disk error, a hand-edited file).
Lock files are left in place: deleting them would race with waiting builders.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pathlib
import re
import secrets
import stat
from typing import Callable

ENV_CACHE_DIR = "TF_FUSIONSTITCH_CACHE_DIR"

_SAFE_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")


class CacheError(RuntimeError):
    """The cache directory is unsafe or unusable, or a build produced nothing."""


def cache_dir() -> pathlib.Path:
    """The cache directory, created 0700 if absent and checked on every call.

    $TF_FUSIONSTITCH_CACHE_DIR, else $XDG_CACHE_HOME/tf_fusionstitch, else
    ~/.cache/tf_fusionstitch. Refuses a directory that someone else could
    write to, because we dlopen what is in it.
    """
    path = _configured_dir()
    if not path.exists():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=0o700, exist_ok=True)
            # mkdir's mode is filtered by the umask; set it explicitly.
            os.chmod(path, 0o700)
        except OSError as exc:
            raise CacheError(
                f"cannot create the tf_fusionstitch cache directory {path}: {exc}. "
                f"Set {ENV_CACHE_DIR} to a directory you own.") from exc
    _check_safe(path)
    return path


def content_key(*parts: str) -> str:
    """sha256 hex of the parts; each is length-prefixed so ('ab','c') != ('a','bc')."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def get_or_build(key: str, suffix: str,
                 build_fn: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """Path of the verified artifact <cache_dir>/<key><suffix>, building it if needed.

    build_fn(tmp_path) must write the artifact to tmp_path (same directory,
    same suffix). Concurrent callers, in this process or others, build a key
    once: the others wait on the key's lock and then reuse the result.
    """
    directory, artifact, sidecar = _entry(key, suffix)

    # Fast path without the lock: a mismatch only sends us to the locked path,
    # which re-checks before deleting anything.
    if _verified(artifact, sidecar):
        return artifact

    with _KeyLock(directory / f"{key}{suffix}.lock"):
        if _verified(artifact, sidecar):
            return artifact  # another process built it while we waited
        # Missing, truncated or altered: drop it and rebuild.
        for stale in (artifact, sidecar):
            stale.unlink(missing_ok=True)
        _build_atomically(directory, artifact, sidecar, build_fn)
    return artifact


def find_verified(key: str, suffix: str) -> pathlib.Path | None:
    """The path of <cache_dir>/<key><suffix> if present and matching its
    sidecar hash, else None; builds nothing."""
    _, artifact, sidecar = _entry(key, suffix)
    return artifact if _verified(artifact, sidecar) else None


def read_verified(key: str, suffix: str) -> bytes | None:
    """The bytes of <cache_dir>/<key><suffix> if present and matching its
    sidecar hash, else None (missing, torn or altered entries read as absent).

    The bytes are hashed as read, so a writer replacing the entry meanwhile
    cannot pair old bytes with a new hash. Raises CacheError for an unsafe
    cache directory, like get_or_build.
    """
    _, artifact, sidecar = _entry(key, suffix)
    try:
        expected = sidecar.read_text(encoding="ascii").strip()
        data = artifact.read_bytes()
    except (OSError, UnicodeDecodeError):
        return None
    if not expected or hashlib.sha256(data).hexdigest() != expected:
        return None
    return data


def write_verified(key: str, suffix: str, data: bytes) -> pathlib.Path:
    """Stores `data` as <cache_dir>/<key><suffix> with its sidecar hash,
    atomically and under the key's lock; replaces whatever was there."""
    directory, artifact, sidecar = _entry(key, suffix)
    with _KeyLock(directory / f"{key}{suffix}.lock"):
        _build_atomically(directory, artifact, sidecar, lambda tmp: tmp.write_bytes(data))
    return artifact


def _entry(key: str, suffix: str):
    """(cache directory, artifact path, sidecar path) of a checked key and suffix."""
    _check_name("key", key)
    if suffix:
        _check_name("suffix", suffix.lstrip("."))
    directory = cache_dir()
    return directory, directory / f"{key}{suffix}", directory / f"{key}{suffix}.sha256"


def _configured_dir() -> pathlib.Path:
    explicit = os.environ.get(ENV_CACHE_DIR)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg and os.path.isabs(xdg):  # the XDG spec says to ignore relative paths
        return pathlib.Path(xdg) / "tf_fusionstitch"
    return pathlib.Path.home() / ".cache" / "tf_fusionstitch"


def _check_safe(path: pathlib.Path) -> None:
    fix = f"set {ENV_CACHE_DIR} to a directory you own with mode 0700"
    try:
        info = os.stat(path)
    except OSError as exc:
        raise CacheError(f"cannot stat the cache directory {path}: {exc}; {fix}") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise CacheError(f"the cache path {path} is not a directory; {fix}")
    mode = stat.S_IMODE(info.st_mode)
    uid = os.geteuid()
    if info.st_uid != uid:
        raise CacheError(
            f"refusing the cache directory {path}: it is owned by uid {info.st_uid}, "
            f"not by you (uid {uid}), and kernels from it are loaded into this "
            f"process; {fix}")
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CacheError(
            f"refusing the cache directory {path}: it is writable by group or others "
            f"(mode {mode:04o}), so anyone could plant a kernel there; "
            f"run `chmod 700 {path}` or {fix}")
    if not os.access(path, os.W_OK | os.X_OK):
        raise CacheError(
            f"the cache directory {path} is not writable by you (mode {mode:04o}); "
            f"run `chmod u+rwx {path}` or {fix}")


def _check_name(what: str, name: str) -> None:
    # Keys become file names; refuse anything that could escape the directory.
    if not isinstance(name, str) or not _SAFE_NAME.fullmatch(name):
        raise ValueError(
            f"cache {what} {name!r} must be letters, digits, '_', '-' or '.', "
            f"not starting with '.' (use content_key() to make one)")


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _verified(artifact: pathlib.Path, sidecar: pathlib.Path) -> bool:
    try:
        expected = sidecar.read_text(encoding="ascii").strip()
        return bool(expected) and _sha256_file(artifact) == expected
    except (OSError, UnicodeDecodeError):
        return False


def _build_atomically(directory: pathlib.Path, artifact: pathlib.Path,
                      sidecar: pathlib.Path,
                      build_fn: Callable[[pathlib.Path], None]) -> None:
    token = f"{os.getpid()}-{secrets.token_hex(4)}"
    # Same directory (so os.replace is atomic) and same suffix (compilers care).
    tmp_artifact = directory / f".tmp-{token}-{artifact.name}"
    tmp_sidecar = directory / f".tmp-{token}-{sidecar.name}"
    try:
        build_fn(tmp_artifact)
        if not tmp_artifact.is_file():
            raise CacheError(
                f"building {artifact.name} produced no file at {tmp_artifact}; "
                f"the build function must write its output to the path it is given")
        tmp_sidecar.write_text(_sha256_file(tmp_artifact) + "\n", encoding="ascii")
        # Artifact first: a reader that sees the new sidecar with the old
        # artifact (or vice versa) fails verification and takes the lock.
        os.replace(tmp_artifact, artifact)
        os.replace(tmp_sidecar, sidecar)
    finally:
        tmp_artifact.unlink(missing_ok=True)
        tmp_sidecar.unlink(missing_ok=True)


class _KeyLock:
    """Exclusive flock on a per-key file; blocks until the holder finishes.

    flock locks belong to the open file description, so this also serialises
    threads of one process that each open the file.
    """

    def __init__(self, path: pathlib.Path):
        self._path = path
        self._fd = -1

    def __enter__(self) -> "_KeyLock":
        self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(self._fd)
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
