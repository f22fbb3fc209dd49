"""`--prune`: delete objects under the prefix that no published manifest references.

Scope is deliberately narrow: only package folders `<prefix>/<name>/` that hold a readable
manifest.json are pruned, and in them only keys that manifest does not name (its `files` and
itself; a schema-1 manifest, published by an older pack, also implies its loader and page). A
package's report.json and report.html (`--with-report`) are kept, unless the package is published again without them. Keys
outside such folders (a site sharing the bucket, a folder whose first publish was interrupted
before its manifest) are never touched.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.s3 import Target, describe_error
from pipeline.report import REPORT_HTML, REPORT_JSON
from pipeline.publish.transfer import list_keys

# A schema-2 manifest lists every file but itself; schema 1 left its loader and page implied.
_SCHEMA_1_ENTRY_FILES = ("loader.js", "loader.d.ts", "index.html")
_DELETE_BATCH = 1000  # DeleteObjects limit


@dataclass(frozen=True)
class PruneResult:
    deleted: list[tuple[str, int]]  # key, size
    kept_folders_without_manifest: list[str]


def prune(
    client, target: Target, dry_run: bool, progress: Progress, planned: dict[str, set[str]] | None = None
) -> PruneResult:
    """`planned` maps a package name to the paths its (not yet uploaded) manifest will name."""
    planned = planned or {}
    root = f"{target.prefix}/" if target.prefix else ""
    try:
        keys = list_keys(client, target.bucket, root)
    except Exception as error:  # noqa: BLE001
        raise PackError(describe_error(error, f"--prune: listing s3://{target.bucket}/{root}")) from None

    folders: dict[str, dict[str, int]] = defaultdict(dict)
    for key, size in keys.items():
        package, sep, path = key[len(root):].partition("/")
        if sep and path:
            folders[package][path] = size

    doomed: list[tuple[str, int]] = []
    orphans: list[str] = []
    for package, paths in sorted(folders.items()):
        if package in planned:
            referenced: set[str] | None = {"manifest.json"} | planned[package]
        elif "manifest.json" not in paths:
            orphans.append(package)
            continue
        else:
            referenced = _referenced_paths(client, target, package)
        if referenced is None:
            progress.note(f"prune: {package}/manifest.json is not a readable manifest; folder left alone")
            continue
        doomed += [(target.key(package, path), size) for path, size in sorted(paths.items()) if path not in referenced]
    if orphans:
        progress.note(f"prune: left alone (no manifest.json): {', '.join(orphans)}")
    if not dry_run:
        _delete(client, target, [key for key, _ in doomed])
    return PruneResult(deleted=doomed, kept_folders_without_manifest=orphans)


def _referenced_paths(client, target: Target, package: str) -> set[str] | None:
    key = target.key(package, "manifest.json")
    try:
        body = client.get_object(Bucket=target.bucket, Key=key)["Body"].read()
    except Exception as error:  # noqa: BLE001
        raise PackError(describe_error(error, f"--prune: reading s3://{target.bucket}/{key}")) from None
    try:
        manifest = json.loads(body)
        files = manifest["files"]
        implied = _SCHEMA_1_ENTRY_FILES if manifest.get("schema") == 1 else ()
        # a package's reports (published on request, never listed) stay until its next publish
        return {"manifest.json", REPORT_JSON, REPORT_HTML, *implied} | {str(path) for path in files}
    except (ValueError, KeyError, TypeError):
        return None


def _delete(client, target: Target, keys: list[str]) -> None:
    for start in range(0, len(keys), _DELETE_BATCH):
        batch = keys[start : start + _DELETE_BATCH]
        try:
            answer = client.delete_objects(
                Bucket=target.bucket, Delete={"Objects": [{"Key": key} for key in batch], "Quiet": True}
            )
        except Exception as error:  # noqa: BLE001
            raise PackError(describe_error(error, f"--prune: deleting from s3://{target.bucket}")) from None
        errors = answer.get("Errors") or []
        if errors:
            first = errors[0]
            raise PackError(
                f"--prune: could not delete s3://{target.bucket}/{first.get('Key')}: {first.get('Code')} "
                f"{first.get('Message', '')} ({len(errors)} keys failed); check delete permission"
            )
