"""scripts/ci_brotli_seed.py: only the encodings of onnxruntime-web's own files outlive a clean clone."""

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from pipeline.cache import atomic_write, cached_entry

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "ci_brotli_seed.py"


def run(*args: str) -> str:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=True, capture_output=True, text=True).stdout


def test_save_keeps_runtime_encodings_only_and_restore_brings_them_back(tmp_path):
    cache, seed, clean = tmp_path / "cache", tmp_path / "seed", tmp_path / "clean"
    wasm = cache / "runtime" / "onnxruntime-web" / "1.30.0" / "dist" / "ort-wasm-simd-threaded.wasm"
    wasm.parent.mkdir(parents=True)
    wasm.write_bytes(b"\0asm runtime bytes")
    runtime_sha = hashlib.sha256(wasm.read_bytes()).hexdigest()
    atomic_write(cache / "brotli" / f"{runtime_sha}.q11.br", b"runtime encoding", entry=True)
    atomic_write(cache / "brotli" / f"{'0' * 64}.q5.br", b"a model's weights: the project's own, not kept", entry=True)
    (cache / "brotli" / f"{'1' * 64}.q11.br").write_bytes(b"no recorded sha256: not kept")
    assert "1 new runtime encodings kept" in run("save", str(seed), str(cache))
    assert sorted(p.name for p in (seed / "brotli").iterdir()) == [f"{runtime_sha}.q11.br", f"{runtime_sha}.q11.br.sha256"]
    assert "0 new" in run("save", str(seed), str(cache))  # kept once
    assert "1 runtime encodings restored" in run("restore", str(seed), str(clean))
    restored = clean / "brotli" / f"{runtime_sha}.q11.br"
    assert restored.read_bytes() == b"runtime encoding"
    assert cached_entry(restored) == restored  # pack reads it as a whole entry
    assert not list((clean / "brotli").glob(".*"))  # no partial copy left


def test_restore_without_a_seed_does_nothing(tmp_path):
    assert run("restore", str(tmp_path / "none"), str(tmp_path / "cache")) == ""
    assert not (tmp_path / "cache").exists()


def test_save_keeps_the_encodings_of_a_runtime_files_parts(tmp_path):
    """A runtime .wasm over [assets] max_file_mib ships in parts (manifest `split`): their encodings are kept too."""
    cache, seed = tmp_path / "cache", tmp_path / "seed"
    whole = b"\0asm runtime bytes, in two parts"
    wasm = cache / "runtime" / "onnxruntime-web" / "1.30.0" / "dist" / "ort-wasm-simd-threaded.asyncify.wasm"
    wasm.parent.mkdir(parents=True)
    wasm.write_bytes(whole)
    parts = [hashlib.sha256(whole[:16]).hexdigest(), hashlib.sha256(whole[16:]).hexdigest()]
    sample_part = hashlib.sha256(b"a sample part").hexdigest()
    manifest = {
        "files": {"ort/a.part0.bin": {"sha256": parts[0]}, "ort/a.part1.bin": {"sha256": parts[1]}, "sample.part0.bin": {"sha256": sample_part}},
        "split": {
            "ort/a.wasm": {"sha256": hashlib.sha256(whole).hexdigest(), "parts": ["ort/a.part0.bin", "ort/a.part1.bin"]},
            "sample.bin": {"sha256": "1" * 64, "parts": ["sample.part0.bin"]},  # the project's own: not kept
        },
    }
    (cache / "builds" / "k" / "package").mkdir(parents=True)
    (cache / "builds" / "k" / "package" / "manifest.json").write_text(json.dumps(manifest))
    (cache / "builds" / "broken" / "package").mkdir(parents=True)
    (cache / "builds" / "broken" / "package" / "manifest.json").write_text("{not json")
    for sha in (*parts, sample_part):
        atomic_write(cache / "brotli" / f"{sha}.q11.br", b"encoding", entry=True)
    assert "2 new runtime encodings kept" in run("save", str(seed), str(cache))
    assert sorted(p.name for p in (seed / "brotli").iterdir()) == sorted(f"{sha}.q11.br{record}" for sha in parts for record in ("", ".sha256"))
