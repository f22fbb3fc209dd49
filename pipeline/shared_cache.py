"""A shared store behind the local cache: `--cache-url` (or `PACK_CACHE_URL`, which the command
line reads) names an S3 or R2 prefix (`s3://BUCKET/PREFIX`, endpoint and credentials as boto3 reads them, e.g.
`AWS_ENDPOINT_URL`) or a folder (a path or `file://` URL), and builds on other machines (a CI
matrix, tomorrow's run) read what one machine made instead of making it again.

Read-through, write-back, per entry: the command line opens a `StoreSession` (`open_session`) and
hands it to the cache (pipeline/cache.py `reading_through`), which calls it: a local miss asks the
store; an entry this machine commits is put there too. A session keeps its own state (a dropped
store, bad objects, traffic); nothing here is process-wide. Only the areas whose entries are named by the one key
function (pipeline/keys.py: code, libraries, settings and inputs) or by their own sha256 are
shared; what describes this machine (file digests by inode, locks, Mesa's shader cache, memos of a
bucket's listing) never is. So a shared entry is trusted exactly as far as its key covers.

Every object carries its sha256 (S3 object metadata; in a folder store, its first line), and every read is checked against it while it streams: a corrupted or
partial object is discarded and made again, and the copy made here replaces it. Objects are
written once: S3's conditional put (`If-None-Match: *`) where the store supports it, an exclusive
link in a folder; with many concurrent writers the first one wins and the rest keep theirs
locally. A folder entry (a stored build, an installed runtime) travels as a listing of its files
and their sha256, each file a blob named by its sha256: content-addressed, so the runtime that
every package ships, or a model's unchanged weights, is stored and read once.
A store that stops answering mid-build costs speed, never the build: one warning, then local only.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import unquote, urlsplit

from pipeline.errors import PackError, warn
from pipeline.urls import mask_url

# How messages name the store's setting: the command line reads it (--cache-url's envvar), nothing here does.
URL_SETTING = "PACK_CACHE_URL"
# Cache areas (first folder under the cache root) whose entries are keyed by what decides them or
# named by their sha256: safe on any machine with the same key.
SHARED_AREAS = frozenset({"brotli", "builds", "downloads", "external-data-names", "host-runs", "packages", "runtime", "runtime-probes", "stages", "webgpu-runs", "work"})
FOLDER_SUFFIX = ".listing.json"  # a folder entry's object: the listing of its files
BLOBS = "blobs"  # the files of folder entries, named by their sha256
_HEX64 = re.compile(r"[0-9a-f]{64}")
_SHA_META = "sha256"


@dataclass
class StoredObject:
    name: str  # relative to the store's root: <area>/<entry>[.tar]
    size: int
    modified: float  # seconds since the epoch


@dataclass
class Traffic:
    """What this process moved through the store (the build's summary line)."""

    read: int = 0
    read_bytes: int = 0
    written: int = 0
    written_bytes: int = 0
    discarded: list[str] = field(default_factory=list)


class SharedStore:
    """The operations a store backend gives: read an object into a file with its recorded sha256,
    write one once (or over a bad one), list, remove."""

    url: str

    def describe(self) -> str:
        return mask_url(self.url)

    def check(self) -> None:  # raises PackError naming the store's setting
        raise NotImplementedError

    def read(self, name: str, handle) -> str | None:  # the recorded sha256, or None when absent
        raise NotImplementedError

    def write(self, name: str, path: Path, sha256: str, replace: bool) -> bool:  # False: another writer was first
        raise NotImplementedError

    def exists(self, name: str) -> bool:
        raise NotImplementedError

    def mark_used(self, name: str) -> None:
        """Note that a build read the object (S3 keeps no such time: objects age from their write)."""

    def objects(self) -> Iterator[StoredObject]:
        raise NotImplementedError

    def remove(self, name: str) -> None:
        raise NotImplementedError


class FolderStore(SharedStore):
    """A folder as the shared store (a network mount, a CI cache folder carried between runs). An
    object is one file, its sha256 on the first line then its bytes, written under a temporary name
    and linked into place (the link fails when the name exists: written once, never seen half)."""

    _HEADER = 65  # 64 hex digits and a newline

    def __init__(self, url: str, root: Path):
        self.url, self.root = url, root

    def check(self) -> None:
        if not self.root.is_dir():
            raise PackError(f"{URL_SETTING}={self.describe()}: no such folder; create it or fix {URL_SETTING} / --cache-url")
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".pack-probe-", dir=self.root))
        except OSError as error:
            raise PackError(f"{URL_SETTING}={self.describe()}: cannot write there ({error.strerror or error}); make it writable or fix {URL_SETTING} / --cache-url") from None

    def read(self, name: str, handle) -> str | None:
        try:
            with (self.root / name).open("rb") as source:
                header = source.read(self._HEADER)
                shutil.copyfileobj(source, handle, 1 << 20)
        except FileNotFoundError:
            return None
        return header[:-1].decode("ascii", "replace") if header.endswith(b"\n") else "missing"

    def write(self, name: str, path: Path, sha256: str, replace: bool) -> bool:
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "wb") as handle, path.open("rb") as source:
                handle.write(f"{sha256}\n".encode("ascii"))
                shutil.copyfileobj(source, handle, 1 << 20)
            os.chmod(scratch, 0o644)
            if replace:
                os.replace(scratch, target)
                return True
            try:
                os.link(scratch, target)  # exclusive: the first writer wins
            except FileExistsError:
                return False
            return True
        finally:
            Path(scratch).unlink(missing_ok=True)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def mark_used(self, name: str) -> None:
        try:
            os.utime(self.root / name)  # its last use: `pack cache prune` keeps what builds read
        except OSError:
            pass

    def objects(self) -> Iterator[StoredObject]:
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                state = path.stat()
                yield StoredObject(path.relative_to(self.root).as_posix(), max(state.st_size - self._HEADER, 0), state.st_mtime)

    def remove(self, name: str) -> None:
        (self.root / name).unlink(missing_ok=True)


class S3Store(SharedStore):
    """An S3 or R2 prefix as the shared store (pipeline/s3.py's client: R2-safe settings)."""

    def __init__(self, url: str, bucket: str, prefix: str):
        from pipeline.s3 import Target

        self.url, self.bucket, self.prefix = url, bucket, prefix
        self.target = Target(bucket=bucket, prefix=prefix, endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None)
        self._client = None
        self._conditional = True  # until the store says it has no conditional put
        self._lock = threading.Lock()

    @property
    def client(self):
        with self._lock:
            if self._client is None:
                from pipeline.s3 import make_client

                try:
                    self._client = make_client(self.target)
                except PackError as error:
                    raise PackError(f"{URL_SETTING}={self.describe()}: {error}") from None
            return self._client

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def check(self) -> None:
        from pipeline.s3 import check_bucket

        try:
            check_bucket(self.client, self.target)
        except PackError as error:
            raise PackError(f"{URL_SETTING}={self.describe()}: {error}; fix {URL_SETTING} / --cache-url or the credentials") from None

    def read(self, name: str, handle) -> str | None:
        import botocore.exceptions

        try:
            answer = self.client.get_object(Bucket=self.bucket, Key=self._key(name))
        except botocore.exceptions.ClientError as error:
            if str(error.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey"):
                return None
            raise
        body = answer["Body"]
        for block in iter(lambda: body.read(1 << 20), b""):
            handle.write(block)
        return answer.get("Metadata", {}).get(_SHA_META, "missing")

    def write(self, name: str, path: Path, sha256: str, replace: bool) -> bool:
        import botocore.exceptions

        arguments = {"Bucket": self.bucket, "Key": self._key(name), "Metadata": {_SHA_META: sha256}}
        with path.open("rb") as body:
            if replace or not self._conditional:
                self.client.put_object(Body=body, **arguments)
                return True
            try:
                self.client.put_object(Body=body, IfNoneMatch="*", **arguments)
                return True
            except botocore.exceptions.ClientError as error:
                code = str(error.response.get("Error", {}).get("Code"))
                if code in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    return False  # another machine wrote it first
                if code not in ("NotImplemented", "501"):
                    raise
            # a store without conditional puts: the same key holds the same result, so a second
            # writer only rewrites what the first wrote
            self._conditional = False
            body.seek(0)
            self.client.put_object(Body=body, **arguments)
            return True

    def exists(self, name: str) -> bool:
        import botocore.exceptions

        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(name))
            return True
        except botocore.exceptions.ClientError as error:
            if str(error.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def objects(self) -> Iterator[StoredObject]:
        paginator = self.client.get_paginator("list_objects_v2")
        start = f"{self.prefix}/" if self.prefix else ""
        for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
            for item in page.get("Contents", []):
                yield StoredObject(item["Key"][len(start):], int(item["Size"]), item["LastModified"].timestamp())

    def remove(self, name: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self._key(name))


def store_from_url(url: str) -> SharedStore:
    """The store a `PACK_CACHE_URL` names; a malformed one is bad input (exit 2)."""
    parts = urlsplit(url)
    if parts.scheme == "s3":
        if not parts.netloc or "@" in parts.netloc or parts.query or parts.fragment:
            raise PackError(f"{URL_SETTING}={mask_url(url)}: give s3://BUCKET/PREFIX (the endpoint and credentials come from AWS_ENDPOINT_URL and AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)")
        return S3Store(url, parts.netloc, "/".join(part for part in parts.path.split("/") if part))
    if parts.scheme == "file":
        return FolderStore(url, Path(unquote(parts.path)))
    if parts.scheme == "" and url:
        return FolderStore(url, Path(url).expanduser().absolute())
    raise PackError(f"{URL_SETTING}={mask_url(url)}: not a shared cache URL; give s3://BUCKET/PREFIX (S3 or R2) or a folder")


def open_session(url: str | None, root: Path) -> "StoreSession | None":
    """The session on the store `url` names (the command line's --cache-url), behind the local
    cache at `root`, checked before any work (exit 2 when unusable); None when no store is named."""
    if not url or not url.strip():
        return None
    store = store_from_url(url.strip())
    store.check()
    return StoreSession(store, root)


def object_name(root: Path, path: Path, folder: bool = False) -> str | None:
    """The store's name for the local entry `path` under cache root `root`; None when the entry's
    area is not shared."""
    try:
        relative = path.absolute().relative_to(root.absolute())
    except ValueError:
        return None
    if not relative.parts or relative.parts[0] not in SHARED_AREAS:
        return None
    return relative.as_posix() + (FOLDER_SUFFIX if folder else "")


class StoreSession:
    """One command's use of a shared store behind one local cache: the store, and what this use
    learns as it goes (that the store stopped answering, which objects were bad, what moved).
    The command line builds it once from --cache-url and hands it to the cache
    (pipeline/cache.py `reading_through`); two sessions share nothing, so two builds in one
    process each count their own traffic."""

    def __init__(self, store: SharedStore, root: Path):
        self.store = store
        self.root = root.absolute()  # the local cache it stands behind: entries elsewhere are not shared
        self.dropped = False  # the store failed mid-build: local only from then on
        self.bad: set[str] = set()  # objects found corrupted: the next write replaces them
        self.traffic = Traffic()
        self._lock = threading.Lock()  # entries are read and written from worker threads too

    def describe(self) -> str:
        return self.store.describe()

    def object_name(self, path: Path, folder: bool = False) -> str | None:
        """The store's name for the local entry `path`; None when it is not shared (or the store was dropped)."""
        return None if self.dropped else object_name(self.root, path, folder)

    def traffic_line(self) -> str | None:
        """One line on what this session read from and wrote to the store, when it did."""
        traffic = self.traffic
        if not (traffic.read or traffic.written or traffic.discarded):
            return None
        mb = lambda size: f"{size / 1e6:.1f} MB"  # noqa: E731
        line = f"shared cache {self.describe()}: {traffic.read} entries read ({mb(traffic.read_bytes)}), {traffic.written} written ({mb(traffic.written_bytes)})"
        return line + (f", {len(traffic.discarded)} discarded" if traffic.discarded else "")

    def _drop(self, error: BaseException) -> None:
        """A store that fails mid-build: one warning, then this session goes on with the local cache."""
        with self._lock:
            if self.dropped:
                return
            self.dropped = True
        from pipeline.s3 import describe_error

        warn(f"shared cache {self.describe()}: {describe_error(error, 'stopped answering')}; going on with the local cache only", local=True)

    def fetch_file(self, name: str, scratch: Path, expected_sha256: str | None) -> str | None:
        """Read object `name` into the file `scratch`; its sha256 when the bytes match the recorded
        one (and `expected_sha256`, for an entry named by its hash), else None (absent, or discarded)."""
        if self.dropped:
            return None
        digest = hashlib.sha256()
        try:
            with scratch.open("wb") as handle:
                recorded = self.store.read(name, _Hashing(handle, digest))
        except Exception as error:  # noqa: BLE001 - any store failure: local only from here on
            self._drop(error)
            return None
        if recorded is None:
            return None
        actual = digest.hexdigest()
        if recorded != actual or (expected_sha256 is not None and actual != expected_sha256):
            self.discard_object(name, "its bytes do not match their recorded sha256")
            return None
        with self._lock:
            self.traffic.read += 1
            self.traffic.read_bytes += scratch.stat().st_size
        self.store.mark_used(name)
        return actual

    def discard_object(self, name: str, fault: str) -> None:
        """A shared object that failed its check: never used; the copy this machine makes replaces it."""
        with self._lock:
            self.bad.add(name)
            self.traffic.discarded.append(name)
        warn(f"shared cache {self.describe()}: {name}: {fault}; discarded, it is made again here and replaced", local=True)

    def put_file(self, name: str, path: Path, sha256: str) -> None:
        """Write the local entry `path` (sha256 known) as object `name`, once."""
        if self.dropped:
            return
        try:
            if self.store.write(name, path, sha256, replace=name in self.bad):
                with self._lock:
                    self.traffic.written += 1
                    self.traffic.written_bytes += path.stat().st_size
            with self._lock:
                self.bad.discard(name)
        except Exception as error:  # noqa: BLE001 - a store failure costs the other machines time, not this build
            self._drop(error)

    def put_folder(self, name: str, folder: Path, files: dict[str, str]) -> None:
        """Write a sealed folder entry: each file as a blob named by its sha256 (stored once however
        many entries hold it: every package ships the same runtime), then the entry's listing.
        `files`: every file of the entry (its seal included), relative, with its sha256."""
        if self.dropped:
            return
        files = dict(sorted(files.items()))
        try:
            for relative, sha256 in files.items():
                blob = f"{BLOBS}/{sha256}"
                if blob in self.bad or not self.store.exists(blob):
                    self.put_file(blob, folder / relative, sha256)
        except Exception as error:  # noqa: BLE001 - a store failure costs the other machines time, not this build
            self._drop(error)
            return
        listing = json.dumps({"files": files}, sort_keys=True, indent=0).encode()
        with tempfile.TemporaryDirectory(prefix="pack-share-") as scratch:
            path = Path(scratch) / "listing.json"
            path.write_bytes(listing)
            self.put_file(name, path, hashlib.sha256(listing).hexdigest())

    def fetch_folder(self, name: str, destination: Path) -> bool:
        """Read the folder entry `name` into `destination` (a new scratch folder): its listing, then
        every blob it lists, each checked against its sha256. False when any part is absent or bad."""
        with tempfile.TemporaryDirectory(prefix="pack-share-") as scratch:
            listing = Path(scratch) / "listing.json"
            if self.fetch_file(name, listing, None) is None:
                return False
            try:
                files = json.loads(listing.read_text(encoding="utf-8"))["files"]
                assert isinstance(files, dict)
            except (ValueError, KeyError, TypeError, AssertionError, UnicodeDecodeError):
                self.discard_object(name, "its listing is not one pack wrote")
                return False
        for relative, sha256 in sorted(files.items()):
            target = destination / relative
            if Path(relative).is_absolute() or ".." in Path(relative).parts or not _HEX64.fullmatch(str(sha256)):
                self.discard_object(name, f"its listing names {relative!r}, which is not a file of an entry")
                return False
            target.parent.mkdir(parents=True, exist_ok=True)
            if self.fetch_file(f"{BLOBS}/{sha256}", target, sha256) is None:
                return False
        return True


class _Hashing(io.RawIOBase):
    """A write-only file that hashes what passes through it."""

    def __init__(self, handle, digest):
        self._handle, self._digest = handle, digest

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._digest.update(data)
        self._handle.write(data)
        return len(data)


def listed_blobs(store: SharedStore, name: str) -> set[str]:
    """The blobs (object names) a folder entry's listing lists; none for a listing that is not one
    pack wrote (readers discard it)."""
    buffer = io.BytesIO()
    if store.read(name, buffer) is None:
        return set()
    try:
        files = json.loads(buffer.getvalue().decode("utf-8"))["files"]
        return {f"{BLOBS}/{sha256}" for sha256 in files.values() if _HEX64.fullmatch(str(sha256))}
    except (ValueError, KeyError, TypeError, AttributeError):
        return set()


def object_area(name: str) -> str:
    """The area of an object name: the cache area it mirrors, or `blobs`."""
    return name.split("/", 1)[0]


@dataclass
class StorePrune:
    """What a prune of the store removed (or, dry, would): entries first, then blobs."""

    entries: list[StoredObject]
    blobs: list[StoredObject]  # blobs no remaining listing lists
    total_bytes: int  # the store before the prune


def prune_store(store: SharedStore, choose: Callable[[list[StoredObject], int, Callable[[str], int]], list[str]], recent: float, dry_run: bool) -> StorePrune:
    """Entries (file objects and folder entries' listings) as `choose(entries, bytes, freed_with)`
    picks them (names), then the blobs that no remaining listing lists. `bytes` counts the store
    without the blobs already unlisted; `freed_with(name)` is what removing that listing frees in
    blobs besides itself (call it once per chosen entry). Listings go first, so no listing is ever
    left naming a blob the prune removed; a blob written at or after `recent` stays (its writer may
    not have put its listing yet). A store that fails is one PackError naming it."""
    try:
        objects = list(store.objects())
        blobs = {stored.name: stored for stored in objects if object_area(stored.name) == BLOBS}
        entries = [stored for stored in objects if stored.name not in blobs]
        listed = {stored.name: listed_blobs(store, stored.name) for stored in entries if stored.name.endswith(FOLDER_SUFFIX)}
        holders: dict[str, int] = {}
        for names in listed.values():
            for name in names:
                holders[name] = holders.get(name, 0) + 1
        unlisted = sum(blob.size for name, blob in blobs.items() if not holders.get(name) and blob.modified < recent)

        def freed_with(entry: str) -> int:
            freed = 0
            for name in listed.get(entry, ()):
                holders[name] -= 1
                if holders[name] == 0 and name in blobs and blobs[name].modified < recent:
                    freed += blobs[name].size
            return freed

        total = sum(stored.size for stored in objects)
        gone = set(choose(entries, total - unlisted, freed_with))
        chosen = [stored for stored in entries if stored.name in gone]
        kept_listed = {name for listing, names in listed.items() if listing not in gone for name in names}
        free = [blob for name, blob in sorted(blobs.items()) if name not in kept_listed and blob.modified < recent]
        if not dry_run:
            for stored in chosen:
                store.remove(stored.name)
            if free:
                # a listing another machine put while this ran may list a blob that looked free
                newer = {name for stored in store.objects() if stored.name.endswith(FOLDER_SUFFIX) and stored.name not in gone and stored.name not in listed
                         for name in listed_blobs(store, stored.name)}
                free = [blob for blob in free if blob.name not in newer]
                for blob in free:
                    store.remove(blob.name)
    except PackError:
        raise
    except Exception as error:  # noqa: BLE001 - any store failure: one line naming the store
        from pipeline.s3 import describe_error

        raise PackError(f"shared cache {store.describe()}: {describe_error(error, 'stopped answering')}; run the prune again (it removes only what is still there)") from None
    return StorePrune(chosen, free, total)
