"""Keep the brotli encodings of onnxruntime-web's files on this machine across clean clones (CI).

Every build ships the runtime's .wasm and .mjs files with q11 brotli copies; on a cold cache that
compression costs minutes of CPU per release (each .wasm up to a minute), and a clean clone starts
cold. The encodings are a pure function of third-party bytes (cached by their sha256 and quality),
so .ci/run restores them from a folder outside the clone before the suite and saves new ones
after it; so are the parts a runtime file over `[assets] max_file_mib` ships in (the webgpu
bundle's .wasm: two parts of ~13 MB, ~26 s of q11 CPU each here), found through the stored builds' manifests. Nothing else is kept: downloads, conversions, runs and builds stay in the clone's cache,
and the compression path itself still runs for every model file and in test_assets_brotli.py.

Usage: python3 scripts/ci_brotli_seed.py restore|save SEED CACHE   (stdlib only: runs before set-up)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path


def runtime_hashes(cache: Path) -> set[str]:
    """sha256 of every file of every onnxruntime-web release in the cache's runtime folder."""
    found = set()
    for path in (cache / "runtime").glob("*/*/dist/*"):
        if path.is_file():
            digest = hashlib.sha256()
            with path.open("rb") as stream:
                for block in iter(lambda: stream.read(1 << 20), b""):
                    digest.update(block)
            found.add(digest.hexdigest())
    return found


def runtime_part_hashes(cache: Path, runtime: set[str]) -> set[str]:
    """sha256 of the parts of onnxruntime-web files over a package's [assets] max_file_mib, as the
    manifests of the cache's stored builds name them (`split` entries whose whole is a runtime file)."""
    found = set()
    for path in (cache / "builds").glob("*/package/manifest.json"):
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
            for whole in (manifest.get("split") or {}).values():
                if whole["sha256"] in runtime:
                    found.update(manifest["files"][part]["sha256"] for part in whole["parts"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a manifest this script reads: its encodings are simply not kept
    return found


def copy_new(source: Path, target: Path, names: list[str]) -> int:
    """Copy each named file from `source` to `target` unless it is there; written beside and renamed
    so an interrupted copy never leaves a partial encoding under its final name."""
    target.mkdir(parents=True, exist_ok=True)
    copied = 0
    for name in names:
        if (target / name).exists():
            continue
        partial = target / f".{name}.partial"
        shutil.copyfile(source / name, partial)
        partial.replace(target / name)
        copied += 1
    return copied


def with_records(folder: Path, names: list[str]) -> list[str]:
    """Each encoding with the sha256 recorded beside it (`<name>.sha256`, which pack checks it
    against on read: pipeline/cache.py), the record first; encodings without one are left out."""
    return [name for encoding in names if (folder / f"{encoding}.sha256").is_file() for name in (f"{encoding}.sha256", encoding)]


def main(mode: str, seed: Path, cache: Path) -> None:
    if mode == "restore":
        if (seed / "brotli").is_dir():
            names = with_records(seed / "brotli", [p.name for p in (seed / "brotli").iterdir() if p.name.endswith(".br")])
            print(f"brotli seed: {copy_new(seed / 'brotli', cache / 'brotli', names) // 2} runtime encodings restored from {seed.name}")
    else:
        hashes = runtime_hashes(cache)
        hashes |= runtime_part_hashes(cache, hashes)
        names = with_records(cache / "brotli", [p.name for p in (cache / "brotli").glob("*.br") if p.name.split(".")[0] in hashes])
        print(f"brotli seed: {copy_new(cache / 'brotli', seed / 'brotli', names) // 2} new runtime encodings kept")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Keep the brotli encodings of onnxruntime-web's files across clean clones.")
    parser.add_argument("mode", choices=["restore", "save"])
    parser.add_argument("seed", type=Path, help="the folder kept outside the clone")
    parser.add_argument("cache", type=Path, help="the clone's PACK_CACHE_DIR")
    arguments = parser.parse_args()
    main(arguments.mode, arguments.seed, arguments.cache)
