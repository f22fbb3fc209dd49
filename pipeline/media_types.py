"""Media types of package files: the one table behind the manifest's `mediaType`, the local
servers (`pack serve`, the browser checks) and `pack publish`.

Browsers refuse a module script or a .wasm of another type (WebAssembly.instantiateStreaming needs
application/wasm), so for those few the extension decides whatever a manifest says.
"""

from __future__ import annotations

from pathlib import PurePosixPath

DEFAULT = "application/octet-stream"
MEDIA_TYPES = {
    ".onnx": DEFAULT,
    ".bin": DEFAULT,
    ".data": DEFAULT,
    ".wasm": "application/wasm",
    ".mjs": "text/javascript",
    ".js": "text/javascript",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
    ".css": "text/css",
    ".ts": "text/plain; charset=utf-8",  # loader.d.ts: for people reading it, not for browsers
    ".txt": "text/plain; charset=utf-8",
}
STRICT = frozenset({".wasm", ".mjs", ".js", ".json", ".html"})


def media_type(name: str) -> str:
    """The type a file of this name is listed with in a manifest."""
    return MEDIA_TYPES.get(PurePosixPath(name).suffix, DEFAULT)


def content_type(name: str, declared: object = None) -> str:
    """The Content-Type a file is served and published with: the extension's for the types
    browsers are strict about, else the type the manifest declares, else the extension's."""
    suffix = PurePosixPath(name).suffix
    if suffix in STRICT:
        return MEDIA_TYPES[suffix]
    if isinstance(declared, str) and declared:
        return declared
    return MEDIA_TYPES.get(suffix, DEFAULT)
