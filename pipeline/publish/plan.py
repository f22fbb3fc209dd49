"""What to upload from one package directory, validated against its manifest.json.

Nothing here talks to a bucket: a package that names a missing file, or a file whose bytes do
not match the manifest, is refused here, before any request is made.

One object per decoded name: where the manifest lists a `br` encoding, the `.br` bytes are
uploaded under the decoded name with `Content-Encoding: br`.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path, PurePosixPath
from typing import Any

import brotli

from pipeline.cache import file_sha256
from pipeline.errors import PackError

IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
# Short so that a new manifest/loader reaches browsers within a minute; must-revalidate keeps
# caches from serving a stale manifest that could name objects a later --prune removed.
SHORT_CACHE = "public, max-age=60, must-revalidate"

# Browsers are strict about these types (WebAssembly.instantiateStreaming needs
# application/wasm, module scripts need a JavaScript type), so the extension decides for them
# even when the manifest says otherwise.
_STRICT_TYPES = {
    ".wasm": "application/wasm",
    ".mjs": "text/javascript; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
}
_TYPES = {
    **_STRICT_TYPES,
    ".ts": "text/plain; charset=utf-8",  # loader.d.ts: for people reading it, not for browsers
    ".onnx": "application/octet-stream",
    ".bin": "application/octet-stream",
}

# Not hashed, published after the hashed files and the manifest (see Stage). report.json is
# deliberately absent: browsers never fetch it and it describes the build machine's run.
_ENTRY_FILES = {"loader.js": "loader", "loader.d.ts": "loader", "index.html": "page"}

_HASHED_NAME = re.compile(r"^.+\.([0-9a-f]{16})\.[^./]+$")
_PACKAGE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_READ_CHUNK = 1 << 20


class Stage(IntEnum):
    """Upload order. Each stage starts only when the previous one fully succeeded, so every
    manifest ever visible in the bucket names objects that are already there."""

    HASHED = 0
    MANIFEST = 1
    LOADER = 2
    PAGE = 3


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

    @property
    def paths(self) -> frozenset[str]:
        return frozenset(obj.path for obj in self.objects)


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
    """Validate the package at `root` and list its objects in upload order."""
    manifest_path = root / "manifest.json"
    manifest = _read_manifest(manifest_path)
    name = manifest["name"]
    files: dict[str, Any] = manifest["files"]
    _check_references(manifest_path, manifest)

    objects = [_plan_listed_file(root, path, entry) for path, entry in sorted(files.items())]
    objects.append(_plan_entry_file(root, "manifest.json", Stage.MANIFEST))
    if not (root / "loader.js").is_file():
        raise PackError(f"{root / 'loader.js'}: missing; rebuild the package with `pack build`")
    for entry_name, kind in _ENTRY_FILES.items():
        if (root / entry_name).is_file():
            stage = Stage.LOADER if kind == "loader" else Stage.PAGE
            objects.append(_plan_entry_file(root, entry_name, stage))
    objects.sort(key=lambda obj: (obj.stage, obj.path))
    return PackagePlan(name=name, root=root, objects=tuple(objects))


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackError(f"{path}: missing; this is not a package, run `pack build` first") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PackError(f"{path}: not valid JSON ({error}); rebuild the package") from None
    if not isinstance(manifest, dict) or manifest.get("schema") != 1:
        raise PackError(f"{path}: not a schema-1 manifest; rebuild the package with this pack version")
    name = manifest.get("name")
    if not isinstance(name, str) or not _PACKAGE_NAME.match(name):
        raise PackError(f"{path}: 'name' must be letters, digits, '.', '_' or '-'; got {name!r}")
    if not isinstance(manifest.get("files"), dict):
        raise PackError(f"{path}: 'files' must be an object of package paths; rebuild the package")
    return manifest


def _check_references(manifest_path: Path, manifest: dict[str, Any]) -> None:
    """Every path the loader may fetch must be listed in `files`, or it would not be published."""
    files = manifest["files"]

    def objects(value: Any) -> list[dict[str, Any]]:
        items = value.values() if isinstance(value, dict) else []
        return [item for item in items if isinstance(item, dict)]

    referenced: list[Any] = [variant.get("model") for variant in objects(manifest.get("variants"))]
    if isinstance(manifest.get("sample"), dict):
        referenced.append(manifest["sample"].get("file"))
    for bundle in objects((manifest.get("runtime") or {}).get("bundles")):
        referenced += [bundle.get("module"), bundle.get("wasm")]
    for path in referenced:
        if path is not None and path not in files:
            raise PackError(
                f"{manifest_path}: references {path!r} which is not listed in 'files'; rebuild the package"
            )


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
    if not decoded.is_file():
        raise PackError(f"{decoded}: listed in manifest.json but missing; rebuild the package")
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
    content_type = _content_type(path, entry.get("mediaType"))
    cache = IMMUTABLE_CACHE if match else SHORT_CACHE

    brotli_entry = (entry.get("encodings") or {}).get("br")
    if not brotli_entry:
        return PlannedObject(path, decoded, size, sha256, sha256, content_type, None, cache, Stage.HASHED)
    encoded = _safe_path(root, brotli_entry.get("path") or f"{path}.br")
    if not encoded.is_file():
        raise PackError(f"{encoded}: listed as the br encoding of {path} but missing; rebuild the package")
    body_sha256, body_size = _sha256_file(encoded)
    if "size" in brotli_entry and body_size != brotli_entry["size"]:
        raise PackError(f"{encoded}: {body_size} bytes, manifest.json says {brotli_entry['size']}; rebuild")
    if _brotli_decoded_sha256(encoded) != sha256:
        raise PackError(f"{encoded}: does not decode to {path}; rebuild the package")
    return PlannedObject(path, encoded, body_size, sha256, body_sha256, content_type, "br", cache, Stage.HASHED)


def _plan_entry_file(root: Path, path: str, stage: Stage) -> PlannedObject:
    source = root / path
    sha256, size = _sha256_file(source)
    return PlannedObject(path, source, size, sha256, sha256, _content_type(path, None), None, SHORT_CACHE, stage)


def _content_type(path: str, media_type: Any) -> str:
    suffix = PurePosixPath(path).suffix
    if suffix in _STRICT_TYPES:
        return _STRICT_TYPES[suffix]
    if isinstance(media_type, str) and media_type:
        return media_type
    return _TYPES.get(suffix, "application/octet-stream")


def _sha256_file(path: Path) -> tuple[str, int]:
    return file_sha256(path), path.stat().st_size


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
