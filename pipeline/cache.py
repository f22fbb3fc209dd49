"""Where pack keeps downloads and reusable work ($PACK_CACHE_DIR, default ~/.cache/pack), and the
one way pack creates staging folders and writes files atomically.

Files and folders pack creates follow the process umask (0644/0755 under the usual 022), so a web
server or container running as another user can read a package. `tempfile.mkstemp`/`mkdtemp`
create 0600/0700 whatever the umask; the helpers here give their results the umask's modes.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from pipeline.errors import PackError, error_path, is_environment_error, warn

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
    remove_orphans(parent, prefix)
    # Made with Ctrl-C/SIGTERM held and the path bound before they are let through, so a stop
    # cannot fall between making the folder and owning its clean-up.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        try:
            path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
            os.chmod(path, folder_mode())
        except OSError as error:
            raise PackError(f"{parent}: cannot create a folder there ({error.strerror or error}); give a writable output folder") from None
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        yield path
    except BaseException as error:
        if path is not None:
            note_written(error, path)
            shutil.rmtree(path, ignore_errors=True)
        raise


def remove_orphans(parent: Path, prefix: str) -> None:
    """Remove the scratch folders `<prefix><pid>...` a killed process left in `parent` (SIGKILL,
    power loss: no clean-up ran): that process is gone."""
    try:
        siblings = [p for p in parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return
    for sibling in siblings:
        pid = sibling.name[len(prefix):].partition("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            shutil.rmtree(sibling, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's process
    return True


@contextmanager
def temporary_folder(prefix: str) -> Iterator[str]:
    """`tempfile.TemporaryDirectory` for pack's scratch files: a write in it that fails for want of
    room or rights names this folder (a write to an open file names none), so the one-line error
    says the temporary folder filled (pipeline/errors.py)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        try:
            yield folder
        except BaseException as error:
            note_written(error, Path(folder))
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


def _memo_text(value: str) -> bytes:
    """A memo holds its value and a check of it, so a damaged memo reads as none, never as another hash."""
    return f"{value} {hashlib.sha256(value.encode()).hexdigest()[:16]}".encode("ascii")


def _memo_value(memo: Path) -> str | None:
    try:
        value, _, check = memo.read_text(encoding="ascii").strip().partition(" ")
    except (OSError, UnicodeDecodeError):
        return None
    return value if value and _memo_text(value).decode() == f"{value} {check}" else None


def remember_digest(path: Path, kind: str, value: str) -> None:
    """Record `value` as `kind` of the file as written just now (the build knows its files' hashes)."""
    memo = _digest_memo(path, kind, path.stat())
    if memo is not None:
        try:
            atomic_write(memo, _memo_text(value))
        except OSError:
            pass  # a cache that cannot be written only costs a later re-read


def remembered_digest(path: Path, kind: str, compute: Callable[[Path], str | None]) -> str | None:
    """`compute(path)`, remembered for this file as it is on disk now (see _digest_memo), so an
    unchanged file is not read again (`pack publish` re-validating a package). `kind` names what
    is computed ("sha256", "br-decoded-sha256"). Computed afresh when the cache is unusable."""
    before = path.stat()
    memo = _digest_memo(path, kind, before)
    known = _memo_value(memo) if memo is not None and memo.is_file() else None
    if known:
        return known if known != "-" else None
    value = compute(path)
    after = path.stat()
    if memo is not None and (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (before.st_size, before.st_mtime_ns, before.st_ctime_ns):
        try:
            atomic_write(memo, _memo_text(value or "-"))
        except OSError:
            pass  # a cache that cannot be written only costs the next run a re-read
    return value


@contextmanager
def atomic_output(path: Path, entry: bool = False) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside `path`, renamed onto `path` (with the umask's
    mode) when the block ends without error and removed otherwise: readers never see half a file.
    `entry`: a cache entry, whose sha256 is recorded beside it first (see `cached_entry`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
        os.chmod(tmp, file_mode())
        if entry:
            digest = file_sha256(Path(tmp))
            with _entries_locked(path.parent):
                atomic_write(_recorded_hash_file(path), f"{digest}\n".encode("ascii"))
                os.replace(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as error:
        note_written(error, Path(tmp))
        Path(tmp).unlink(missing_ok=True)
        raise
    if entry:
        share_entry(path, digest)


def atomic_write(path: Path, data: bytes, entry: bool = False) -> None:
    with atomic_output(path, entry) as handle:
        handle.write(data)


def atomic_copy(source: Path, destination: Path, entry: bool = False) -> None:
    with atomic_output(destination, entry) as handle, source.open("rb") as src:
        shutil.copyfileobj(src, handle, 1 << 20)


def note_written(error: BaseException, path: Path) -> None:
    """Before a clean-up removes a failed write: name on the error the file it was writing (a
    write to an open file names none) and, on a full disk, how much it had put there, so the
    one-line message names the folder and what the build needed (pipeline/errors.py)."""
    if not is_environment_error(error):
        return
    if error.filename is None:
        error.filename = str(path)
    named = error_path(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT) and named is not None and (named == path.absolute() or path.absolute() in named.parents):
        try:
            size = path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        except OSError:
            return
        error.written_bytes = max(getattr(error, "written_bytes", 0), size)


# Cache entries check themselves. A file entry is written whole under a temporary name and renamed
# into place after its sha256 is recorded beside it (`<name>.sha256`), or is named by its sha256
# (downloads); a folder entry (a stored build, an installed runtime) is sealed last with the list
# of its files and their sha256 (FOLDER_SEAL) and then renamed into place. On read the bytes are
# checked against the record (remembered per file as it is on disk: see `remembered_digest`), and an
# entry that fails (a damaged byte, a partial file, a record missing) is removed with one warning
# and made again. The commit and the verdict on a failing entry hold one lock per folder, so a
# reader never judges an entry another process is committing.
_RECORDED_HASH = ".sha256"
FOLDER_SEAL = ".pack-entry.json"


def _recorded_hash_file(path: Path) -> Path:
    return path.with_name(path.name + _RECORDED_HASH)


def is_entry_record(path: Path) -> bool:
    """Whether `path` is pack's bookkeeping beside entries (a recorded hash, a lock), not an entry."""
    return path.name.endswith((_RECORDED_HASH, ".lock")) or path.name == FOLDER_SEAL


@contextmanager
def _entries_locked(folder: Path) -> Iterator[None]:
    with made_once(folder / ".entries"):
        yield


def cached_entry(path: Path, sha256: str | None = None) -> Path | None:
    """`path` when the cache holds it whole: its bytes hash to `sha256` (an entry named by its hash)
    or to the hash recorded when it was written. None when it is not there, or when it failed the
    check: then it is removed with one warning, and the caller makes it again."""
    if not path.is_file():
        return _shared_entry(path, sha256)
    if _entry_fault(path, sha256) is None:
        return path
    with _entries_locked(path.parent):
        fault = _entry_fault(path, sha256) if path.is_file() else None
        if fault is None:
            return path if path.is_file() else None
        _discard(path, fault)
        _recorded_hash_file(path).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    return _shared_entry(path, sha256)


# The shared store (pipeline/shared_cache.py) behind the local cache: a local miss reads through
# it, a committed entry is written back. Nothing happens unless PACK_CACHE_URL names one.


def _shared_name(path: Path, folder: bool = False) -> str | None:
    from pipeline.shared_cache import object_name, shared_store

    return object_name(cache_root(), path, folder) if shared_store() is not None else None


def share_entry(path: Path, sha256: str) -> None:
    """Write the committed file entry `path` (its bytes hash to `sha256`) back to the shared store."""
    name = _shared_name(path)
    if name is not None:
        from pipeline.shared_cache import put_file

        put_file(name, path, sha256)


def _shared_entry(path: Path, sha256: str | None) -> Path | None:
    """The entry read from the shared store and committed here as if made here; None when it has none."""
    name = _shared_name(path)
    if name is None:
        return None
    from pipeline.shared_cache import fetch_file

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        digest = fetch_file(name, Path(scratch), sha256)
        if digest is None:
            return None
        os.chmod(scratch, file_mode())
        with _entries_locked(path.parent):
            if sha256 is None:
                atomic_write(_recorded_hash_file(path), f"{digest}\n".encode("ascii"))
            os.replace(scratch, path)
        remember_digest(path, "sha256", digest)
        return path
    except BaseException as error:
        note_written(error, Path(scratch))
        raise
    finally:
        Path(scratch).unlink(missing_ok=True)


def _entry_fault(path: Path, sha256: str | None) -> str | None:
    expected = sha256
    if expected is None:
        try:
            expected = _recorded_hash_file(path).read_text(encoding="ascii").strip()
        except FileNotFoundError:
            return "no sha256 recorded with it (partial, or written by an older pack)"
        except (OSError, UnicodeDecodeError):
            return "its recorded sha256 is unreadable"
    return None if remembered_digest(path, "sha256", file_sha256) == expected else "its bytes do not match their recorded sha256"


def seal_folder(folder: Path) -> None:
    """Record every file of a finished folder entry with its sha256 (call it last, before the rename
    that puts the folder in place)."""
    files = {p.relative_to(folder).as_posix(): remembered_digest(p, "sha256", file_sha256) for p in sorted(folder.rglob("*")) if p.is_file() and p.name != FOLDER_SEAL}
    atomic_write(folder / FOLDER_SEAL, json.dumps({"files": files, "sha256": _listing_sha256(files)}, indent=0, sort_keys=True).encode())


def _listing_sha256(files: dict) -> str:
    """The seal's check of its own list, so a damaged list reads as damaged, not as files missing."""
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


@contextmanager
def folder_commit(folder: Path) -> Iterator[None]:
    """Held while a sealed scratch folder is renamed onto the entry `folder`; the entry is then
    written back to the shared store."""
    with _entries_locked(folder.parent):
        yield
    name = _shared_name(folder, folder=True)
    if name is not None and (folder / FOLDER_SEAL).is_file():
        from pipeline.shared_cache import put_folder

        put_folder(name, folder)


def sealed_folder(folder: Path) -> bool:
    """Whether `folder` holds a whole folder entry: sealed, with every recorded file there with its
    sha256, and nothing else. A folder that fails is removed with one warning (False: make it again)."""
    if not folder.is_dir():
        return _shared_folder(folder)
    if _folder_fault(folder) is None:
        return True
    with _entries_locked(folder.parent):
        fault = _folder_fault(folder) if folder.is_dir() else None
        if fault is None:
            return folder.is_dir()
        _discard(folder, fault)
        shutil.rmtree(folder, ignore_errors=True)
    return _shared_folder(folder)


def _shared_folder(folder: Path) -> bool:
    """The folder entry read from the shared store, checked against its seal and renamed into place."""
    name = _shared_name(folder, folder=True)
    if name is None:
        return False
    from pipeline.shared_cache import discard_object, fetch_folder

    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = folder.with_name(f".{folder.name}.{os.getpid()}-shared")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        if not fetch_folder(name, scratch):
            return False
        fault = _folder_fault(scratch)
        if fault is not None:
            discard_object(name, fault)
            return False
        with _entries_locked(folder.parent):
            if not folder.is_dir():
                os.rename(scratch, folder)
        return folder.is_dir()
    except BaseException as error:
        note_written(error, scratch)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _folder_fault(folder: Path) -> str | None:
    try:
        recorded = json.loads((folder / FOLDER_SEAL).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return "no list of its files (partial, or written by an older pack)"
    except (OSError, ValueError):
        return "its list of files is unreadable"
    if not isinstance(recorded, dict) or not isinstance(recorded.get("files"), dict) or recorded.get("sha256") != _listing_sha256(recorded["files"]):
        return "its list of files is damaged"
    recorded = recorded["files"]
    present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != FOLDER_SEAL}
    missing, extra = sorted(set(recorded) - present), sorted(present - set(recorded))
    if missing:
        return f"{missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    if extra:
        return f"{extra[0]} is not one of its files"
    for name, sha256 in sorted(recorded.items()):
        if remembered_digest(folder / name, "sha256", file_sha256) != sha256:
            return f"{name} does not match its recorded sha256"
    return None


def _discard(path: Path, fault: str) -> None:
    warn(f"cache entry {path}: {fault}; removed, it is made again")
