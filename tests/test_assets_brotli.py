"""Brotli copies: made once per cache even when builds sharing it compress the same file at once,
and the same bytes whether compressed alone or beside others."""

from __future__ import annotations

import hashlib
import threading
import time

import brotli

from pipeline.assets import files
from pipeline.progress import Progress


def test_two_builds_compressing_one_file_at_once_compress_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real_compress = files._compress

    def slow_compress(data, quality, label, progress):
        calls.append(label)
        time.sleep(0.5)  # long enough for the other build to reach the lock
        return real_compress(data, quality, label, progress)

    monkeypatch.setattr(files, "_compress", slow_compress)
    data = b"ort wasm " * 50_000
    sha = hashlib.sha256(data).hexdigest()
    results: list[bytes] = []

    def build(name: str) -> None:
        results.append(files.brotli_encode(data, sha, ".wasm", name, Progress.quiet()))

    workers = [threading.Thread(target=build, args=(name,)) for name in ("first", "second")]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len(calls) == 1
    assert results[0] == results[1] and brotli.decompress(results[0]) == data


def test_files_compressed_together_are_the_bytes_each_gives_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    items = [(f"ort/part{i}", ".wasm", bytes(range(256)) * (2000 + 300 * i)) for i in range(3)]
    together = files.add_hashed_files(tmp_path / "together", items, None, "brotli", Progress.quiet())
    for (stem, suffix, data), written in zip(items, together):
        alone = brotli.compress(data, quality=11)
        assert (tmp_path / "together" / written.encoded_path).read_bytes() == alone
        assert written.path == files.hashed_name(stem, hashlib.sha256(data).hexdigest(), suffix)
