"""`pack cache`: what the local cache and the shared store behind it hold, and pruning them by age
or size (docs/cache.md). Light: boto3 loads only when a shared store on S3 is named."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import Annotated, Callable, Iterable, Optional

import typer

from pipeline.commands.common import CACHE_URL_ENV, CacheUrlOption, cli_errors, open_shared_store, print_json
from pipeline.errors import PackError

CACHE_EXAMPLES = """Examples:

  pack cache

  pack cache prune --older-than 30d --max-size 5G --dry-run

  pack cache prune --shared --older-than 14d --cache-url s3://my-bucket/pack-cache
"""

# Nothing used or written in the last hour is removed: a build may be reading it, or (in the shared
# store) a writer may have put a folder entry's blobs and not yet its listing.
GRACE_S = 3600
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SIZE_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_AGE = re.compile(r"(\d+(?:\.\d+)?)\s*([smhd])")
_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)B?", re.IGNORECASE)


class Action(str, Enum):
    show = "show"
    prune = "prune"


def cache(
    action: Annotated[Action, typer.Argument(help="show: what the caches hold (the default); prune: remove entries by age and/or size.")] = Action.show,
    older_than: Annotated[Optional[str], typer.Option("--older-than", help="prune: remove entries last used longer ago than this: a number and s, m, h or d (30d).")] = None,
    max_size: Annotated[Optional[str], typer.Option("--max-size", help="prune: then remove the least recently used entries until the cache is at most this: a number and K, M, G or T (10^3 .. 10^12 bytes; 5G).")] = None,
    shared: Annotated[bool, typer.Option("--shared", help="prune: prune the shared store (--cache-url / PACK_CACHE_URL) instead of the local cache; with --local, both.")] = False,
    local: Annotated[bool, typer.Option("--local", help="prune: prune the local cache as well when --shared is given (the default without --shared).")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="prune: list what would be removed, remove nothing.")] = False,
    cache_url: CacheUrlOption = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Show what the local cache (PACK_CACHE_DIR) and the shared store hold, and prune them by age or size.

    Local entries age from their last use (a read marks it), shared objects from when they were
    written. Nothing used or written in the last hour is removed. Exit code 2 on bad input.
    """
    with cli_errors():
        if action is Action.show:
            given = [name for name, value in (("--older-than", older_than), ("--max-size", max_size), ("--shared", shared), ("--local", local), ("--dry-run", dry_run)) if value]
            if given:
                raise PackError(f"{given[0]}: only for `pack cache prune`; run `pack cache prune {given[0]} ...`")
            _show(_store(cache_url), json_output)
            return
        if older_than is None and max_size is None:
            raise PackError("pack cache prune: give --older-than (e.g. 30d) and/or --max-size (e.g. 5G)")
        age_s = parse_age(older_than) if older_than is not None else None
        limit = parse_size(max_size) if max_size is not None else None
        store = _store(cache_url) if shared else None  # a local prune needs no store, reachable or not
        if shared and store is None:
            raise PackError(f"--shared: no shared store named; give --cache-url s3://BUCKET/PREFIX (or a folder) or set {CACHE_URL_ENV}")
        _prune(store if shared else None, local or not shared, age_s, limit, dry_run, json_output)


def parse_age(text: str) -> float:
    match = _AGE.fullmatch(text.strip())
    if not match:
        raise PackError(f"--older-than {text}: not an age; give a number and s, m, h or d (e.g. 30d, 12h)")
    return float(match[1]) * _AGE_UNITS[match[2]]


def parse_size(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match:
        raise PackError(f"--max-size {text}: not a size; give a number and K, M, G or T (e.g. 5G, 500M)")
    return int(float(match[1]) * _SIZE_UNITS[match[2].upper()])


def _store(url: str | None):
    """The shared store named by --cache-url / PACK_CACHE_URL, checked (exit 2 when unusable); None when none is named."""
    session = open_shared_store(url)
    return session.store if session is not None else None


# --- what the caches hold ----------------------------------------------------------------------


@dataclass
class Item:
    """One removable thing: a local entry, or a shared object (a file entry, a folder entry's listing, a blob)."""

    name: str  # a path under the local cache root, or an object name in the store
    area: str
    size: int
    used: float  # local: last use; shared: when it was written
    owned: bool = True  # local: in an area pack writes (the others are never pruned)


def _local_items(root: Path) -> list[Item]:
    from pipeline.cache import cache_entries

    return [Item(entry.path.relative_to(root).as_posix(), entry.area, entry.size, entry.used, entry.owned) for entry in cache_entries(root)]


def _shared_item(stored) -> Item:
    from pipeline.shared_cache import object_area

    return Item(stored.name, object_area(stored.name), stored.size, stored.modified)


def _shared_items(store) -> list[Item]:
    return [_shared_item(stored) for stored in store.objects()]


def _summary(items: Iterable[Item], shared_areas: frozenset[str]) -> dict:
    areas: dict[str, dict] = {}
    for item in items:
        area = areas.setdefault(item.area, {"entries": 0, "bytes": 0, "oldest": item.used, "newest": item.used, "shared": item.area in shared_areas, "pruned": item.owned})
        area["entries"] += 1
        area["bytes"] += item.size
        area["oldest"], area["newest"] = min(area["oldest"], item.used), max(area["newest"], item.used)
    total = {"entries": sum(a["entries"] for a in areas.values()), "bytes": sum(a["bytes"] for a in areas.values())}
    return {"areas": dict(sorted(areas.items())), "total": total}


def _dated(summary: dict) -> dict:
    """`summary` with its times as ISO 8601 (UTC), for --json."""
    return {**summary, "areas": {name: {**area, "oldest": _iso(area["oldest"]), "newest": _iso(area["newest"])} for name, area in summary["areas"].items()}}


def _show(store, json_output: bool) -> None:
    from pipeline.cache import cache_root
    from pipeline.shared_cache import SHARED_AREAS

    root = cache_root()
    document = {"local": {"root": str(root), **_summary(_local_items(root), SHARED_AREAS)}, "shared": None}
    if store is not None:
        document["shared"] = {"url": store.describe(), **_summary(_shared_items(store), SHARED_AREAS | {"blobs"})}
    if json_output:
        print_json({"local": _dated(document["local"]), "shared": document["shared"] and _dated(document["shared"])})
        return
    now = time.time()
    typer.echo(f"local cache {root}" + ("" if os.environ.get("PACK_CACHE_DIR") else " (set PACK_CACHE_DIR to move it)"))
    _print_areas(document["local"], now, "last used", note_local=True)
    if store is not None:
        typer.echo(f"shared cache {store.describe()}")
        _print_areas(document["shared"], now, "written", note_local=False)


def _print_areas(summary: dict, now: float, verb: str, note_local: bool) -> None:
    for name, area in summary["areas"].items():
        ages = f"{verb} {_ago(now, area['oldest'])} .. {_ago(now, area['newest'])}"
        mark = "" if not note_local or area["shared"] else "  (this machine only)" if area["pruned"] else "  (not pack's: never pruned)"
        typer.echo(f"  {name:<22} {area['entries']:>7} entries {_bytes(area['bytes']):>10}   {ages}{mark}")
    total = summary["total"]
    typer.echo(f"  {'total':<22} {total['entries']:>7} entries {_bytes(total['bytes']):>10}")


# --- pruning -----------------------------------------------------------------------------------


def _chosen(items: list[Item], now: float, age_s: float | None, limit: int | None, total: int, freed_with: Callable[[Item], int] = lambda item: 0) -> tuple[list[Item], int]:
    """What goes: every item last used longer ago than `age_s`, then the least recently used until
    what is left (of `total` bytes) is at most `limit`; never one used in the grace period.
    `freed_with(item)`: what removing it frees beyond its own bytes (called once per chosen item).
    Returns the chosen items and how many were kept only for the grace period."""
    order = sorted(items, key=lambda item: (item.used, item.name))
    recent = now - GRACE_S
    chosen: list[Item] = []
    kept: set[str] = set()
    left = total

    def take(item: Item) -> None:
        nonlocal left
        if item.used >= recent:
            kept.add(item.name)
            return
        chosen.append(item)
        left -= item.size + freed_with(item)

    for item in order:
        if age_s is not None and item.used < now - age_s:
            take(item)
    taken = {item.name for item in chosen}
    for item in order if limit is not None else ():
        if left <= limit:
            break
        if item.name not in taken:
            take(item)
    return chosen, len(kept)


@dataclass
class Pruned:
    where: str
    removed: list[Item]
    left_bytes: int
    kept_recent: int
    blobs: int | None = None  # shared: how many of `removed` are blobs no remaining listing lists

    def as_json(self) -> dict:
        return {"where": self.where, "removed": [{"name": item.name, "area": item.area, "bytes": item.size, "used": _iso(item.used)} for item in self.removed],
                "removed_bytes": sum(item.size for item in self.removed), "left_bytes": self.left_bytes, "kept_recent": self.kept_recent,
                **({"blobs": self.blobs} if self.blobs is not None else {})}


def _prune(store, local: bool, age_s: float | None, limit: int | None, dry_run: bool, json_output: bool) -> None:
    now = time.time()
    results = {"local": _prune_local(now, age_s, limit, dry_run) if local else None, "shared": _prune_shared(store, now, age_s, limit, dry_run) if store is not None else None}
    if json_output:
        print_json({"dry_run": dry_run, **{key: result.as_json() if result else None for key, result in results.items()}})
        return
    verb = "would remove" if dry_run else "removed"
    for key, result in results.items():
        if result is None:
            continue
        if dry_run:
            for item in result.removed:
                typer.echo(f"would remove {item.name} ({_bytes(item.size)}, {'last used' if key == 'local' else 'written'} {_ago(now, item.used)})")
        entries = len(result.removed) - (result.blobs or 0)
        blobs = f" and {result.blobs} blobs no listing lists" if result.blobs else ""
        kept = f"; kept {result.kept_recent} used or written in the last hour" if result.kept_recent else ""
        freed = sum(item.size for item in result.removed)
        typer.echo(f"{key} cache {result.where}: {verb} {entries} entries{blobs} ({_bytes(freed)}); {_bytes(result.left_bytes)} left{kept}")


def _prune_local(now: float, age_s: float | None, limit: int | None, dry_run: bool) -> Pruned:
    from pipeline.cache import cache_root, remove_entry

    root = cache_root()
    items = _local_items(root)
    total = sum(item.size for item in items)
    chosen, kept = _chosen([item for item in items if item.owned], now, age_s, limit, total)
    # removed only if not used since it was listed (the last use is read again under the lock)
    removed = chosen if dry_run else [item for item in chosen if remove_entry(root / item.name, min(now - GRACE_S, item.used + 1e-3))]
    return Pruned(str(root), removed, total - sum(item.size for item in removed), kept + len(chosen) - len(removed))


def _prune_shared(store, now: float, age_s: float | None, limit: int | None, dry_run: bool) -> Pruned:
    """The store's entries by age and size (this command's rule, as for the local cache); the store
    removes them and then the blobs no remaining listing lists (pipeline/shared_cache.py prune_store)."""
    from pipeline.shared_cache import prune_store

    kept = 0

    def choose(entries, total: int, freed_with: Callable[[str], int]) -> list[str]:
        nonlocal kept
        chosen, kept = _chosen([_shared_item(stored) for stored in entries], now, age_s, limit, total, lambda item: freed_with(item.name))
        return [item.name for item in chosen]

    pruned = prune_store(store, choose, now - GRACE_S, dry_run)
    removed = [_shared_item(stored) for stored in pruned.entries + pruned.blobs]
    return Pruned(store.describe(), removed, pruned.total_bytes - sum(item.size for item in removed), kept, blobs=len(pruned.blobs))


# --- formatting --------------------------------------------------------------------------------


def _bytes(count: int) -> str:
    """Decimal units, as --max-size reads them."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} B"


def _ago(now: float, then: float) -> str:
    seconds = max(now - then, 0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return f"{seconds:.0f} s ago"


def _iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="seconds")
