"""What to upload from one package directory: exactly the files its manifest.json lists, and the manifest
(with `--with-report`, the build's reports too: report.json and report.html, which it never lists).

Nothing here talks to a bucket: a package whose manifest is not valid (pipeline/manifest.py),
that names a missing file, or a file whose bytes do not match the manifest, is refused here, before
any request is made. A file in the folder that the manifest does not list is never uploaded.

One object per decoded name: where the manifest lists a `br` encoding, the `.br` bytes are
uploaded under the decoded name with `Content-Encoding: br`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from enum import IntEnum
from pathlib import Path, PurePosixPath
from typing import Any

import brotli

from pipeline.manifest import Manifest, Run, failed_runs, read_manifest
from pipeline.http_headers import SHORT_CACHE, cache_control
from pipeline.media_types import content_type
from pipeline.cache import file_sha256, remembered_digest
from pipeline.errors import PackError
from pipeline.report import REPORT_FILES, REPORT_HTML, REPORT_JSON

_HASHED_NAME = re.compile(r"^.+\.([0-9a-f]{16})\.[^./]+$")
_READ_CHUNK = 1 << 20
LOADER_ENTRY = "loader.js"
DEMO_SCRIPT = "demo.js"  # imported by index.html, imports loader.js


class Stage(IntEnum):
    """Upload order. Each stage starts only when the previous one fully succeeded, so every
    manifest ever visible in the bucket names objects that are already there, and every file is
    there before a file that imports it: the loader's own modules (and loader.d.ts) before
    loader.js, loader.js before the demo script, the demo script before the page (the build's
    reports, with --with-report, go with the page)."""

    HASHED = 0
    MANIFEST = 1
    SUPPORT = 2
    LOADER = 3
    DEMO = 4
    PAGE = 5


def stage_of(path: str, cache: str) -> Stage:
    if cache == "immutable":
        return Stage.HASHED
    if path == LOADER_ENTRY:
        return Stage.LOADER
    if path == DEMO_SCRIPT:
        return Stage.DEMO
    if path.endswith(".html"):
        return Stage.PAGE
    return Stage.SUPPORT


@dataclass(frozen=True)
class PlannedObject:
    """One object to put at `<prefix>/<package>/<path>`."""

    path: str  # package path = decoded name (the key suffix)
    source: Path  # the file whose bytes are uploaded (the .br file when encoded)
    size: int  # stored bytes
    sha256: str  # of the decoded bytes (what browsers see; matches the manifest)
    body_sha256: str  # of the stored bytes
    content_type: str
    content_encoding: str | None
    cache_control: str
    stage: Stage

    @property
    def metadata(self) -> dict[str, str]:
        meta = {"sha256": self.sha256}
        if self.content_encoding:
            meta["body-sha256"] = self.body_sha256
        return meta


@dataclass(frozen=True)
class PackagePlan:
    name: str
    root: Path
    objects: tuple[PlannedObject, ...]
    manifest: Manifest
    unlisted: tuple[str, ...] = ()  # files in the folder that the manifest does not list: not uploaded

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(obj.path for obj in self.objects)

    @property
    def failed(self) -> list[Run]:
        return failed_runs(self.manifest)

    @property
    def browser_verified(self) -> bool:
        return self.manifest["verification"]["browser"]


def find_packages(dist: Path) -> list[Path]:
    """`dist` itself when it is a package, else its package subfolders (sorted)."""
    if not dist.is_dir():
        raise PackError(f"{dist}: not a directory; pass a package folder (dist/<name>) or dist/")
    if (dist / "manifest.json").is_file():
        return [dist]
    found = sorted(p for p in dist.iterdir() if (p / "manifest.json").is_file())
    if not found:
        raise PackError(
            f"{dist}: not a package (no manifest.json in it or its subfolders); run `pack build` first"
        )
    return found


def plan_package(root: Path) -> PackagePlan:
    """Validate the package at `root` and list its objects in upload order: exactly the files its
    manifest lists, then manifest.json itself."""
    manifest = read_manifest(root)
    files = manifest["files"]
    objects = [_plan_listed_file(root, path, entry) for path, entry in files.items()]
    manifest_file = root / "manifest.json"
    sha256, size = _sha256_file(manifest_file)
    objects.append(PlannedObject("manifest.json", manifest_file, size, sha256, sha256, content_type("manifest.json", None), None, SHORT_CACHE, Stage.MANIFEST))
    objects.sort(key=lambda obj: (obj.stage, obj.path))
    return PackagePlan(name=manifest["name"], root=root, objects=tuple(objects), manifest=manifest, unlisted=tuple(_unlisted(root, files)))


def with_report(plan: PackagePlan) -> PackagePlan:
    """`plan` plus the build's reports (`pack publish --with-report`): report.json (the build's
    record) and report.html (its page), short cache, uploaded last like index.html. Neither is in
    manifest.files (pipeline/report says why); a package of an earlier pack that lists report.json
    uploads it as a listed file already."""
    added = []
    for name in (REPORT_JSON, REPORT_HTML):
        if name in plan.paths:
            continue
        path = plan.root / name
        if not path.is_file():
            how = f"make it with `pack report {plan.root}`" if name == REPORT_HTML else "rebuild the package with `pack build`"
            raise PackError(f"{path}: not found; {how}, or publish without --with-report")
        sha256, size = _sha256_file(path)
        added.append(PlannedObject(name, path, size, sha256, sha256, content_type(name, None), None, SHORT_CACHE, Stage.PAGE))
    objects = sorted((*plan.objects, *added), key=lambda obj: (obj.stage, obj.path))
    return replace(plan, objects=tuple(objects), unlisted=tuple(p for p in plan.unlisted if p not in (REPORT_JSON, REPORT_HTML)))


def _unlisted(root: Path, files: dict[str, Any]) -> list[str]:
    """Package paths on disk that neither the manifest nor one of its encodings names (the build
    report's files are not counted: they are never listed, and published only on request)."""
    known = {"manifest.json", *files, *REPORT_FILES}
    for entry in files.values():
        known.update(encoding["path"] for encoding in entry["encodings"].values())
    on_disk = (path.relative_to(root).as_posix() for path in root.rglob("*") if path.is_file() or path.is_symlink())
    return sorted(path for path in on_disk if path not in known)


def _safe_path(root: Path, path: str) -> Path:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(part in ("", ".", "..") for part in parts):
        raise PackError(f"{root / 'manifest.json'}: file path {path!r} is not a plain relative path")
    return root.joinpath(*parts)


def _plan_listed_file(root: Path, path: str, entry: Any) -> PlannedObject:
    where = f"{root / 'manifest.json'}: files[{path!r}]"
    if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
        raise PackError(f"{where} has no sha256; rebuild the package")
    decoded = _safe_path(root, path)
    if entry.get("stored"):
        # An export that holds only the encoded body: the decoded bytes are checked below, from it.
        sha256, size = entry["sha256"], entry["size"]
    elif not decoded.is_file():
        raise PackError(f"{decoded}: listed in manifest.json but missing; rebuild the package")
    else:
        sha256, size = _sha256_file(decoded)
    if sha256 != entry["sha256"] or size != entry.get("size", size):
        raise PackError(
            f"{decoded}: content differs from manifest.json (sha256 {sha256[:16]}…, expected "
            f"{entry['sha256'][:16]}…); the package was modified after build, rebuild it"
        )
    match = _HASHED_NAME.match(PurePosixPath(path).name)
    if match and match.group(1) != sha256[:16]:
        raise PackError(
            f"{decoded}: the name says content hash {match.group(1)} but the file hashes to "
            f"{sha256[:16]}; rebuild the package"
        )
    if entry["cache"] == "immutable" and not match:
        raise PackError(f"{where}: cache 'immutable' but the name carries no content hash; rebuild the package")
    media = content_type(path, entry.get("mediaType"))
    cache = cache_control(entry["cache"])
    stage = stage_of(path, entry["cache"])

    brotli_entry = (entry.get("encodings") or {}).get("br")
    if not brotli_entry:
        return PlannedObject(path, decoded, size, sha256, sha256, media, None, cache, stage)
    encoded = _safe_path(root, brotli_entry.get("path") or f"{path}.br")
    if not encoded.is_file():
        raise PackError(f"{encoded}: listed as the br encoding of {path} but missing; rebuild the package")
    body_sha256, body_size = _sha256_file(encoded)
    if "size" in brotli_entry and body_size != brotli_entry["size"]:
        raise PackError(f"{encoded}: {body_size} bytes, manifest.json says {brotli_entry['size']}; rebuild")
    if remembered_digest(encoded, "br-decoded-sha256", _brotli_decoded_sha256) != sha256:
        raise PackError(f"{encoded}: does not decode to {path}; rebuild the package")
    return PlannedObject(path, encoded, body_size, sha256, body_sha256, media, "br", cache, stage)


def _sha256_file(path: Path) -> tuple[str, int]:
    # Remembered per file state: a re-publish of an unchanged package reads no file again.
    return remembered_digest(path, "sha256", file_sha256) or "", path.stat().st_size


def _brotli_decoded_sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    decoder = brotli.Decompressor()
    try:
        with path.open("rb") as stream:
            while chunk := stream.read(_READ_CHUNK):
                digest.update(decoder.process(chunk))
        if not decoder.is_finished():
            return None
    except brotli.error:
        return None
    return digest.hexdigest()
