"""Where pack keeps downloads and reusable work ($PACK_CACHE_DIR, default ~/.cache/pack), and the
one way pack creates staging folders and writes files atomically.

Files and folders pack creates follow the process umask (0644/0755 under the usual 022), so a web
server or container running as another user can read a package. `tempfile.mkstemp`/`mkdtemp`
create 0600/0700 whatever the umask; the helpers here give their results the umask's modes.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from pipeline.errors import PackError

CACHE_ENV = "PACK_CACHE_DIR"


def current_umask() -> int:
    """The process umask, read without changing it where the system allows (Linux /proc)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    return 0o666 & ~current_umask()


def folder_mode() -> int:
    return 0o777 & ~current_umask()


@contextmanager
def staging_folder(parent: Path, prefix: str) -> Iterator[Path]:
    """A new, uniquely named folder in `parent` with the umask's mode (mkdtemp's is always 0700),
    removed again if the block raises, Ctrl-C and SIGTERM included. What the block moves out of it
    (a finished package renamed into place) stays."""
    path: Path | None = None
    # Made with Ctrl-C/SIGTERM held and the path bound before they are let through, so a stop
    # cannot fall between making the folder and owning its clean-up.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        try:
            path = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
            os.chmod(path, folder_mode())
        except OSError as error:
            raise PackError(f"{parent}: cannot create a folder there ({error.strerror or error}); give a writable output folder") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield path
    except BaseException:
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)
        raise


def swap_into_place(staging: Path, destination: Path) -> None:
    """Swap the finished package into place: old one aside, new one in, old one removed. Whatever
    stands at the package path (an earlier package, a stray file or link) is replaced. Ctrl-C and
    SIGTERM wait until the swap is done, so a stop never leaves the old package aside."""
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        old = None
        if destination.is_symlink() or destination.exists():
            old = destination.with_name(f".{destination.name}.old-{os.getpid()}")
            destination.rename(old)
        staging.rename(destination)
        if old is not None:
            if old.is_dir() and not old.is_symlink():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "pack"


def cache_dir(*parts: str) -> Path:
    """A folder under the cache root, created on first use; an unusable cache is bad environment."""
    root = cache_root()
    path = root.joinpath(*parts)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise PackError(_unusable_cache(root, error.strerror or str(error))) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PackError(_unusable_cache(root, f"{path} is not writable"))
    return path


def check_cache_writable() -> None:
    """Fail early (before any work) when the cache cannot be written: tried with a probe folder,
    since permission bits miss read-only mounts, immutable folders and root's override."""
    root = cache_dir()
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".pack-probe-", dir=root))
    except OSError as error:
        raise PackError(_unusable_cache(root, error.strerror or str(error))) from None


def _unusable_cache(root: Path, why: str) -> str:
    origin = f"{CACHE_ENV}={root}" if os.environ.get(CACHE_ENV) else f"the cache folder {root}"
    return f"{origin}: cannot write there ({why}); make it writable or set {CACHE_ENV} to a writable folder"


@contextmanager
def made_once(path: Path) -> Iterator[None]:
    """Held while this process makes the cache entry `path`: builds that share a cache (parallel
    CI jobs, test workers) wait for the one making it and then read it, instead of all making the
    same entry at once. The lock (`<path>.lock`) is released by the system if the process dies."""
    lock = path.with_name(path.name + ".lock")
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def file_sha256(path: Path) -> str:
    """sha256 hex of a file, read in 1 MiB blocks (models are too large to read whole)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digest_memo(path: Path, kind: str, state: os.stat_result) -> Path | None:
    """Where a digest of this file as it is on disk is remembered: keyed by device, inode, size,
    mtime and ctime (any write changes the ctime, which no tool can set back; a rename, such as
    the build's staging folder moved into place, changes none of them). None: no usable cache."""
    identity = "\0".join(map(str, (kind, state.st_dev, state.st_ino, state.st_size, state.st_mtime_ns, state.st_ctime_ns)))
    try:
        return cache_dir("digests") / hashlib.sha256(identity.encode()).hexdigest()
    except PackError:
        return None


def remember_digest(path: Path, kind: str, value: str) -> None:
    """Record `value` as `kind` of the file as written just now (the build knows its files' hashes)."""
    memo = _digest_memo(path, kind, path.stat())
    if memo is not None:
        try:
            atomic_write(memo, value.encode("ascii"))
        except OSError:
            pass  # a cache that cannot be written only costs a later re-read


def remembered_digest(path: Path, kind: str, compute: Callable[[Path], str | None]) -> str | None:
    """`compute(path)`, remembered for this file as it is on disk now (see _digest_memo), so an
    unchanged file is not read again (`pack publish` re-validating a package). `kind` names what
    is computed ("sha256", "br-decoded-sha256"). Computed afresh when the cache is unusable."""
    before = path.stat()
    memo = _digest_memo(path, kind, before)
    try:
        known = memo.read_text(encoding="ascii").strip() if memo is not None and memo.is_file() else None
    except (OSError, UnicodeDecodeError):
        known = None
    if known:
        return known if known != "-" else None
    value = compute(path)
    after = path.stat()
    if memo is not None and (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (before.st_size, before.st_mtime_ns, before.st_ctime_ns):
        try:
            atomic_write(memo, (value or "-").encode("ascii"))
        except OSError:
            pass  # a cache that cannot be written only costs the next run a re-read
    return value


@contextmanager
def atomic_output(path: Path) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside `path`, renamed onto `path` (with the umask's
    mode) when the block ends without error and removed otherwise: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write(path: Path, data: bytes) -> None:
    with atomic_output(path) as handle:
        handle.write(data)


def atomic_copy(source: Path, destination: Path) -> None:
    with atomic_output(destination) as handle, source.open("rb") as src:
        shutil.copyfileobj(src, handle, 1 << 20)
