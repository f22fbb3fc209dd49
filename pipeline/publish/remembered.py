"""What this machine has read of a bucket, so that a re-publish of an unchanged package is one
listing, not a HEAD per object.

A listing (ListObjectsV2) shows each key's ETag, size and LastModified, but not the sha256
metadata and headers that decide whether an object is current (pipeline/publish/transfer.py). So
pack remembers, per endpoint, bucket and package folder, what each HEAD it made showed: the
ETag, size, sha256 metadata and headers, and the server's time of the answer (its Date). A later
listing vouches for those headers when it shows the same ETag and size and a LastModified in an
earlier second than that answer: any write to the key after the answer (a PUT, a copy that
replaces the headers, a delete and re-create) is stamped with a LastModified no earlier than the
answer's second. A write in that very second cannot be told apart by a listing (S3 lists
LastModified to the second), so such an object is read with HEAD again, as is every key this
machine has not read, one whose listing differs, or all of them when the cache is unusable.

Objects are remembered when read, not when uploaded: an upload is answered in the second its
object is stamped, so the listing could not tell it from a later rewrite in that second. A
package published from this machine is therefore listed only from its second re-publish on;
the first one after an upload reads the uploaded objects with HEAD.

Kept in $PACK_CACHE_DIR/published/, one small JSON file per package folder.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pipeline.cache import atomic_write, cache_dir, cached_entry
from pipeline.errors import PackError

_VERSION = 1


@dataclass(frozen=True)
class Listed:
    """One key as ListObjectsV2 shows it."""

    size: int
    etag: str
    modified: int  # LastModified, whole seconds since the epoch


@dataclass(frozen=True)
class Headers:
    """What a listing cannot show: the sha256 metadata and the headers an object carries."""

    sha256: str | None
    body_sha256: str | None
    content_type: str | None
    content_encoding: str | None
    cache_control: str | None


@dataclass(frozen=True)
class Seen:
    """What one HEAD showed, and the server's time of its answer (whole seconds since the epoch)."""

    etag: str
    size: int
    answered: int
    headers: Headers


class Memory:
    """The remembered objects of one package folder in one bucket."""

    def __init__(self, path: Path | None, identity: list[str], entries: dict[str, Seen]):
        self._path = path
        self._identity = identity
        self._entries = entries
        self._changed = False

    @classmethod
    def load(cls, endpoint: str, bucket: str, prefix: str) -> "Memory":
        identity = [endpoint.rstrip("/"), bucket, prefix]
        try:
            name = hashlib.sha256("\0".join(identity).encode()).hexdigest()[:32]
            path = cache_dir("published") / f"{name}.json"
        except PackError:
            return cls(None, identity, {})
        entries: dict[str, Seen] = {}
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if cached_entry(path) else {}
            if data.get("version") == _VERSION and data.get("identity") == identity:
                for key, entry in data["objects"].items():
                    entries[key] = Seen(**{**entry, "headers": Headers(**entry["headers"])})
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            entries = {}  # none yet, or unreadable: every existing key is read with HEAD
        return cls(path, identity, entries)

    def headers(self, key: str, listed: Listed) -> Headers | None:
        """The headers `key` carries, when the listing shows the object remembered and nothing
        written since (see the module's docstring); else None."""
        seen = self._entries.get(key)
        if seen is None or (seen.etag, seen.size) != (listed.etag, listed.size) or listed.modified >= seen.answered:
            return None
        return seen.headers

    def remember(self, key: str, seen: Seen) -> None:
        if self._entries.get(key) != seen:
            self._entries[key] = seen
            self._changed = True

    def keep_only(self, keys: set[str]) -> None:
        """Forget keys the bucket no longer has (a listing did not show them)."""
        for key in [key for key in self._entries if key not in keys]:
            del self._entries[key]
            self._changed = True

    def save(self) -> None:
        if self._path is None or not self._changed:
            return
        data = {
            "version": _VERSION,
            "identity": self._identity,
            "objects": {key: asdict(seen) for key, seen in sorted(self._entries.items())},
        }
        try:
            atomic_write(self._path, json.dumps(data, separators=(",", ":")).encode("utf-8"), entry=True)
        except OSError:
            return  # a cache that cannot be written only costs the next publish its HEADs
        self._changed = False
