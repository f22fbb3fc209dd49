"""The response headers a package is served with, one table for every server and host: the S3/R2
objects `pack publish` writes, the local servers (`pack serve`, the browser checks) and the host
configurations `pack export --host` writes. Content types come from pipeline/media_types.py.
"""

from __future__ import annotations

# Content-hashed names (`name.<16 hex>.ext`) never change content: cached for a year, never revalidated.
IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
# Short so that a new manifest/loader reaches browsers within a minute; must-revalidate keeps
# caches from serving a stale manifest that could name objects a later --prune removed.
SHORT_CACHE = "public, max-age=60, must-revalidate"

# What makes a page cross-origin isolated (crossOriginIsolated, SharedArrayBuffer: wasm threads).
# They must be on the page's own response; the package's files need only be same-origin or carry CORP.
PAGE_ISOLATION = {
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Embedder-Policy": "require-corp",
}
# Lets an isolated page on another origin load the package's files (COEP require-corp asks for it).
RESOURCE_POLICY = {"Cross-Origin-Resource-Policy": "cross-origin"}
ISOLATION_HEADERS = {**PAGE_ISOLATION, **RESOURCE_POLICY}


def cache_control(cache: str) -> str:
    """The Cache-Control of a manifest `files` entry's `cache` ("immutable" or "short")."""
    return IMMUTABLE_CACHE if cache == "immutable" else SHORT_CACHE
