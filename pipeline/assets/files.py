"""Content-hashed package files with brotli copies, and their manifest entries."""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import brotli

from pipeline.keys import stage_key
from pipeline.cache import atomic_write, cache_dir, cached_entry, carrying_shared_store, file_sha256, made_once, remember_digest
from pipeline.manifest import FileEntry
from pipeline.media_types import media_type
from pipeline.progress import Progress

HASH_CHARS = 16
# Keep a .br copy only when it saves at least this fraction: a copy that saves less costs a
# request-time decision and bucket space for nothing.
MIN_SAVING = 0.02


# Byte-plane coded weight chunks (pipeline/assets/chunks.py), measured by scripts/bench/bench_coding.py on
# GTCRN, ISNet fp16/fp32 and the LaMa export: q6-q9 gain at most 0.1 point of raw at 1.1-10x the
# time, q11 2 points at under 1 MB/s, q1-q3 lose 0.5-1 point; q4 and q5 run at the same speed and
# differ by under 0.7 point either way (q5 smaller on fp16, the precision most weights ship in).
WEIGHTS_QUALITY = 5


def _brotli_quality(size: int, suffix: str, kind: str | None = None) -> int:
    if kind == "weights":
        return WEIGHTS_QUALITY
    # Measured here: q11 runs at ~0.1-0.5 MB/s, q5 at ~16 MB/s. Code (the runtime's .wasm/.mjs,
    # same bytes for every package, so compressed once per machine) and small files get q11
    # (the wasm shrinks to 15 %); model weights gain under 1 % from q11, so large ones get q5.
    # kind "code": the parts of a runtime file split for a host's cap (pipeline/assets/chunks.py `write_split`).
    code = kind == "code" or suffix in (".wasm", ".mjs", ".js")
    return 11 if size <= 4 << 20 or (code and size <= 64 << 20) else 5


def _compress(data: bytes, quality: int, label: str, progress: Progress) -> bytes:
    """Streamed in fixed 1 MiB chunks (deterministic output) so the bar moves on large files."""
    compressor = brotli.Compressor(quality=quality)
    chunks = []
    with progress.task(label, len(data), "bytes") as task:
        for start in range(0, len(data), 1 << 20):
            chunk = data[start : start + (1 << 20)]
            chunks.append(compressor.process(chunk))
            task.advance(len(chunk))
        chunks.append(compressor.finish())
    return b"".join(chunks)


def brotli_encode(data: bytes, sha256: str, suffix: str, label: str, progress: Progress, kind: str | None = None) -> bytes:
    """Brotli bytes, cached by content hash so unchanged files are never recompressed."""
    quality = _brotli_quality(len(data), suffix, kind)
    # the encoding is the brotli library's alone: keyed by its version, the quality and the bytes
    cached = cache_dir("brotli") / f"{stage_key('brotli', {'quality': quality}, {'file': sha256}, libraries=('brotli',))}.br"
    if cached_entry(cached):
        return cached.read_bytes()
    with made_once(cached):  # the runtime's .wasm takes a minute at q11: compress it once per cache
        if cached_entry(cached):
            return cached.read_bytes()
        encoded = _compress(data, quality, label, progress)
        atomic_write(cached, encoded, entry=True)
    return encoded


@dataclass
class PackageFile:
    path: str  # relative to the package root
    sha256: str
    size: int
    encoded_path: str | None
    encoded_size: int | None
    cache: str = "immutable"  # immutable: the name carries the content hash; short: it does not

    def manifest_entry(self) -> FileEntry:
        integrity = "sha256-" + base64.b64encode(bytes.fromhex(self.sha256)).decode()
        encodings = {"br": {"path": self.encoded_path, "size": self.encoded_size}} if self.encoded_path else {}
        return {"sha256": self.sha256, "integrity": integrity, "size": self.size, "mediaType": media_type(self.path), "encodings": encodings, "cache": self.cache}  # type: ignore[typeddict-item]


def hashed_name(stem: str, sha256: str, suffix: str) -> str:
    return f"{stem}.{sha256[:HASH_CHARS]}{suffix}"


def add_hashed_file(
    root: Path, stem: str, suffix: str, data: bytes, progress: Progress, kind: str | None = None, encoded: bytes | None = None, sha256: str | None = None,
    with_br: bool = True,
) -> PackageFile:
    """Write `<stem>.<hash><suffix>` (stem may include a folder) and its .br copy where it pays
    (`encoded` and `sha256`: already computed for `data`; `with_br` False: no .br copy)."""
    sha256 = sha256 or hashlib.sha256(data).hexdigest()
    path = hashed_name(stem, sha256, suffix)
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    remember_digest(target, "sha256", sha256)  # `pack publish` validates the package without reading it again
    if not with_br:
        return PackageFile(path, sha256, len(data), None, None)
    if encoded is None:
        encoded = brotli_encode(data, sha256, suffix, f"brotli {Path(path).name}", progress, kind)
    if len(encoded) <= len(data) * (1 - MIN_SAVING):
        (root / f"{path}.br").write_bytes(encoded)
        remember_digest(root / f"{path}.br", "br-decoded-sha256", sha256)
        return PackageFile(path, sha256, len(data), f"{path}.br", len(encoded))
    return PackageFile(path, sha256, len(data), None, None)


def add_hashed_files(root: Path, items: list[tuple[str, str, bytes]], kind: str | None, label: str, progress: Progress) -> list[PackageFile]:
    """add_hashed_file for each (stem, suffix, data), compressed in parallel across cores (brotli
    releases the GIL while it works) under one progress bar; the results are in `items`' order and
    each is the same bytes as compressing alone, so builds stay reproducible."""
    quiet = Progress.quiet()
    advancing = threading.Lock()
    with progress.task(label, sum(len(data) for _, _, data in items), "bytes") as task:

        def encode(item: tuple[str, str, bytes]) -> tuple[str, bytes]:
            stem, suffix, data = item
            sha256 = hashlib.sha256(data).hexdigest()
            encoded = brotli_encode(data, sha256, suffix, stem, quiet, kind)
            with advancing:
                task.advance(len(data))
            return sha256, encoded

        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            done = list(pool.map(carrying_shared_store(encode), items))  # each encoding read through the build's store
    return [add_hashed_file(root, stem, suffix, data, progress, kind, blob, sha256) for (stem, suffix, data), (sha256, blob) in zip(items, done)]


def describe_file(root: Path, path: str) -> PackageFile:
    """A file already in the package whose name carries no hash (loader files, demo page):
    listed with a short cache lifetime and no encoded copy."""
    target = root / path
    return PackageFile(path, file_sha256(target), target.stat().st_size, None, None, cache="short")
