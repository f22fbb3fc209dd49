"""package.json of a package: the same folder is an npm package, so `npm install ./dist/<name>` (or
a registry publish) gives `import { load } from '<name>'` with its types in any bundler.

The fields follow the manifest: the name is the package name (recipe names are already valid npm
names), `exports` maps the package root to loader.js with loader.d.ts as its types, and `files`
lists exactly the package's files (nothing globbed), one body each (the decoded file, or the `.br`
body alone in an export for a brotli-serving host), so `npm pack` ships what `pack publish` uploads.
The version is `0.0.0-<12 hex>` of the content-hashed files (models, sample, runtime): it changes
when they do and a rebuild of unchanged inputs gives the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re

from pipeline.errors import PackError
from pipeline.manifest import stored_body

PACKAGE_JSON = "package.json"
NPM_NAME_MAX = 214  # npm's limit
# Written after the loader files are rendered (pipeline/build.py), listed in `files` already.
# report.json is not: like report.html it is the build's record, not part of the package apps load.
LATER_FILES = ("manifest.json",)
_SPDX_ID = re.compile(r"^[A-Za-z0-9.+-]+$")


def npm_name(name: str) -> str:
    """The npm name of a package; PackError when npm would refuse it."""
    if len(name) > NPM_NAME_MAX or not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", name):
        raise PackError(f"manifest.json name {name!r}: not a valid npm package name (lowercase letters, digits, . _ -, at most {NPM_NAME_MAX}); rename the recipe")
    return name


def content_version(manifest: dict) -> str:
    """`0.0.0-<12 hex>`: sha256 over the sorted `path sha256` lines of the content-hashed files."""
    lines = "".join(f"{path} {entry['sha256']}\n" for path, entry in sorted(manifest["files"].items()) if entry.get("cache", "immutable") == "immutable")
    return "0.0.0-" + hashlib.sha256(lines.encode()).hexdigest()[:12]


def package_json(manifest: dict, rendered: list[str]) -> bytes:
    """package.json for `manifest` whose loader files are `rendered` (package paths)."""
    files = sorted({stored_body(path, entry) for path, entry in manifest["files"].items()} | set(rendered) | {PACKAGE_JSON, *LATER_FILES})
    data: dict = {
        "name": npm_name(manifest["name"]),
        "version": content_version(manifest),
        "description": manifest.get("description") or f"{manifest['name']}, packaged by pack",
    }
    license_ = manifest.get("license")
    if license_:
        # npm wants an SPDX expression; a prose licence points at the manifest that states it.
        data["license"] = license_ if _SPDX_ID.match(license_) else "SEE LICENSE IN manifest.json"
    data.update({
        "type": "module",
        "main": "./loader.js",
        "types": "./loader.d.ts",
        "exports": {
            ".": {"types": "./loader.d.ts", "default": "./loader.js"},
            "./manifest.json": "./manifest.json",
            "./package.json": "./package.json",
        },
        "sideEffects": False,
        "files": files,
    })
    return (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
