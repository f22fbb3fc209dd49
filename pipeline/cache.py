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
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, Callable, Iterator

from pipeline.cache_location import CACHE_ENV, cache_root
from pipeline.errors import PackError, error_path, is_environment_error, stops_held, warn

if TYPE_CHECKING:
    from pipeline.shared_cache import StoreSession



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
    try:
        # Made with Ctrl-C/SIGTERM held and the path bound before they are let through, so a stop
        # cannot fall between making the folder and owning its clean-up.
        with stops_held():
            try:
                path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
                os.chmod(path, folder_mode())
            except OSError as error:
                raise PackError(f"{parent}: cannot create a folder there ({error.strerror or error}); give a writable output folder") from None
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
    with stops_held():
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
def atomic_output(path: Path, entry: bool = False, share: bool = True) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside `path`, renamed onto `path` (with the umask's
    mode) when the block ends without error and removed otherwise: readers never see half a file.
    `entry`: a cache entry, whose sha256 is recorded beside it first (see `cached_entry`), and
    written back to the shared cache unless `share` is False (pipeline/shared_cache.py)."""
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
    if entry and share:
        share_entry(path, digest)


def atomic_write(path: Path, data: bytes, entry: bool = False) -> None:
    with atomic_output(path, entry) as handle:
        handle.write(data)


def atomic_copy(source: Path, destination: Path, entry: bool = False, share: bool = True) -> None:
    with atomic_output(destination, entry, share) as handle, source.open("rb") as src:
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
# Removed (`pack cache prune`) while it was being checked: the verdict under the lock finds it gone.
_GONE = "removed while it was read"
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
    _mark_used(path, sha256)
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


# The shared store (pipeline/shared_cache.py `StoreSession`) behind the local cache: a local miss
# reads through it, a committed entry is written back. The command that opened it binds it for the
# work it runs (`reading_through`); with none bound, the cache is local only. A context variable
# rather than an argument, because every entry point below is reached from modules that know
# nothing of stores (a brotli encoding, a host run, a stage the stage table keeps); the binding
# ends with its block, and a worker thread gets it only through `carrying_shared_store`.
_shared_store: ContextVar["StoreSession | None"] = ContextVar("the shared store behind the cache", default=None)


@contextmanager
def reading_through(session: "StoreSession | None") -> Iterator[None]:
    """Within the block, cache entries read through `session`'s store and are written back to it."""
    token = _shared_store.set(session)
    try:
        yield
    finally:
        _shared_store.reset(token)


def carrying_shared_store(function: Callable) -> Callable:
    """`function` run under this thread's shared store: for work handed to a worker thread, which
    starts with none bound."""
    session = _shared_store.get()

    def run(*args, **kwargs):
        with reading_through(session):
            return function(*args, **kwargs)

    return run


def _shared(path: Path, folder: bool = False) -> "tuple[StoreSession, str] | None":
    """The bound session and its name for the entry `path`; None when no store is bound or the entry is not shared."""
    session = _shared_store.get()
    name = session.object_name(path, folder) if session is not None else None
    return (session, name) if name is not None else None


def share_entry(path: Path, sha256: str) -> None:
    """Write the committed file entry `path` (its bytes hash to `sha256`) back to the shared store."""
    shared = _shared(path)
    if shared is not None:
        session, name = shared
        session.put_file(name, path, sha256)


def _shared_entry(path: Path, sha256: str | None) -> Path | None:
    """The entry read from the shared store and committed here as if made here; None when it has none."""
    shared = _shared(path)
    if shared is None:
        return None
    session, name = shared
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        digest = session.fetch_file(name, Path(scratch), sha256)
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
    try:
        actual = remembered_digest(path, "sha256", file_sha256)
    except FileNotFoundError:
        return _GONE
    return None if actual == expected else "its bytes do not match their recorded sha256"


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
    shared = _shared(folder, folder=True)
    if shared is not None and (folder / FOLDER_SEAL).is_file():
        session, name = shared
        sealed = json.loads((folder / FOLDER_SEAL).read_text())["files"]  # every other file's sha256
        session.put_folder(name, folder, {**sealed, FOLDER_SEAL: file_sha256(folder / FOLDER_SEAL)})


def sealed_folder(folder: Path) -> bool:
    """Whether `folder` holds a whole folder entry: sealed, with every recorded file there with its
    sha256, and nothing else. A folder that fails is removed with one warning (False: make it again)."""
    if not folder.is_dir():
        return _shared_folder(folder)
    _touch(folder / FOLDER_SEAL)
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
    shared = _shared(folder, folder=True)
    if shared is None:
        return False
    session, name = shared
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = folder.with_name(f".{folder.name}.{os.getpid()}-shared")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        if not session.fetch_folder(name, scratch):
            return False
        fault = _folder_fault(scratch)
        if fault is not None:
            session.discard_object(name, fault)
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
    try:
        present = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and p.name != FOLDER_SEAL}
    except FileNotFoundError:
        return _GONE
    missing, extra = sorted(set(recorded) - present), sorted(present - set(recorded))
    if missing:
        return f"{missing[0]} is missing" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
    if extra:
        return f"{extra[0]} is not one of its files"
    for name, sha256 in sorted(recorded.items()):
        try:
            if remembered_digest(folder / name, "sha256", file_sha256) != sha256:
                return f"{name} does not match its recorded sha256"
        except FileNotFoundError:
            return _GONE
    return None


def _discard(path: Path, fault: str) -> None:
    warn(f"cache entry {path}: {fault}; removed, it is made again", local=True)


# Last use, for `pack cache prune`. File atimes are unreliable (noatime, relatime), and touching an
# entry itself would change its ctime, which keys its remembered digest (a re-read of every byte on
# the next use). So a read touches what stands beside the entry instead: a file entry's record
# (`<name>.sha256`; an entry named by its sha256 gets one on its first read), a folder entry's seal.
# Marked before the check, so `remove_entry` (which reads the mark under the lock) never takes an
# entry a reader has just found whole.


def _touch(path: Path) -> None:
    try:
        os.utime(path)
    except OSError:
        pass  # gone (the check that follows says so), or a read-only cache: reading still works


def _mark_used(path: Path, sha256: str | None) -> None:
    record = _recorded_hash_file(path)
    if sha256 is None or record.is_file():
        _touch(record)
        return
    try:
        with _entries_locked(path.parent):
            if path.is_file():
                atomic_write(record, f"{sha256}\n".encode("ascii"))
    except OSError:
        pass  # a read-only cache: the entry ages from when it was written


def last_use(entry: Path) -> float | None:
    """When the cache entry `entry` was last written or read, in seconds since the epoch: the newest
    mtime of the entry and its record (a file entry) or of its seal (a folder entry). A file or
    folder pack keeps without a record or seal (a memo, Mesa's shader cache) ages from when it was
    written. None: gone."""
    try:
        if entry.is_dir() and not entry.is_symlink():
            if not (entry / FOLDER_SEAL).is_file():  # a folder entry pack does not seal: its newest file
                return max((p.stat().st_mtime for p in entry.rglob("*") if p.is_file()), default=entry.stat().st_mtime)
            return (entry / FOLDER_SEAL).stat().st_mtime
        state = entry.stat()
    except OSError:
        return None
    try:
        return max(state.st_mtime, _recorded_hash_file(entry).stat().st_mtime)
    except OSError:
        return state.st_mtime


# The areas (first folders under the cache root) pack writes that describe this machine and are
# never shared; the others pack writes are pipeline/shared_cache.py's SHARED_AREAS. Folders of
# other areas (tools a test installs there) are shown by `pack cache` but never pruned.
MACHINE_AREAS = frozenset({"botocore-models", "digests", "external-data", "lock-writes", "locks", "mesa-shader-cache", "published", "valid-manifests"})


@dataclass(frozen=True)
class CacheEntry:
    """One removable thing in the local cache: a file entry with its record, a sealed folder entry,
    a record whose entry is gone, or a file pack keeps without a record."""

    path: Path
    area: str  # the first folder under the cache root
    size: int  # bytes, its record or seal included
    used: float  # last use (see `last_use`)
    owned: bool  # in an area pack writes: `pack cache prune` may remove it


def cache_entries(root: Path) -> Iterator[CacheEntry]:
    """Every entry under the cache root `root`, area by area. Left out: names starting with a dot
    (scratch files and staging folders of a write under way) and lock files (removing one another
    process holds would let a second process take the same lock)."""
    if not root.is_dir():
        return
    from pipeline.shared_cache import SHARED_AREAS

    for area in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        yield from _entries_under(area, area.name, area.name in SHARED_AREAS | MACHINE_AREAS)[0]


def _entries_under(folder: Path, area: str, owned: bool) -> tuple[list[CacheEntry], bool]:
    """The entries in `folder`, and whether any is one pack checks (a sealed folder, a file with its
    record). A folder below the area that holds none of those (a folder left by an older pack, a
    model beside its external data) is one entry: it goes whole or not at all."""
    try:
        children = sorted(folder.iterdir())
    except OSError:
        return [], False
    names = {child.name for child in children}
    found: list[CacheEntry] = []
    checked = False
    for child in children:
        if child.name.startswith(".") or child.name.endswith(".lock") or child.is_symlink():
            continue
        if child.is_dir():
            inner, inner_checked = ([], True) if (child / FOLDER_SEAL).is_file() else _entries_under(child, area, owned)
            checked = checked or inner_checked
            if inner_checked and inner:
                found.extend(inner)
                continue
            used = last_use(child) if inner_checked or inner else None
            if used is not None:
                found.append(CacheEntry(child, area, sum(_size(p) for p in child.rglob("*") if p.is_file()), used, owned))
        elif child.name.endswith(_RECORDED_HASH):
            checked = True
            if child.name[: -len(_RECORDED_HASH)] not in names:  # a record alone: its entry is gone
                found.append(CacheEntry(child, area, _size(child), last_use(child) or 0.0, owned))
        else:
            used = last_use(child)
            checked = checked or _recorded_hash_file(child).name in names
            if used is not None:
                found.append(CacheEntry(child, area, _size(child) + _size(_recorded_hash_file(child)), used, owned))
    return found, checked


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def remove_entry(entry: Path, used_before: float) -> bool:
    """Remove the cache entry `entry` (see `cache_entries`) unless it was used at or after
    `used_before` (seconds since the epoch). Held under the folder's entries lock, as commits and
    verdicts are, and the last use read again under it: a reader never sees a file without its
    record (it would call that damage) nor a folder it could take as whole, since a folder's seal goes
    first. A file goes before its record: cut off in between, what is left is a record alone, which
    reads as no entry. False when it was used since, or is gone. Folders stay, with their entries
    lock: removing a lock file another process holds would let a second one take the same lock."""
    with _entries_locked(entry.parent):
        used = last_use(entry)
        if used is None or used >= used_before:
            return False
        if entry.name.endswith(_RECORDED_HASH) and entry.with_name(entry.name[: -len(_RECORDED_HASH)]).exists():
            return False  # a record alone no longer: its entry was committed since
        if entry.is_dir():
            (entry / FOLDER_SEAL).unlink(missing_ok=True)
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
            if not entry.name.endswith(_RECORDED_HASH):
                _recorded_hash_file(entry).unlink(missing_ok=True)
    return True

