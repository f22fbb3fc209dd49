"""`pack cache`: what the local cache and the shared store hold, and pruning them by age and size
(entries written with pipeline/cache.py's own functions; the shared store on moto S3 and in a folder)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pipeline.commands.cache as cache_command
from pipeline.cache import FOLDER_SEAL, atomic_write, cache_root, cached_entry, remove_entry, sealed_folder
from pipeline.cli import app
from test_shared_cache import _folder_entry, machine, moto, objects, store_url

FIXTURES = (machine, moto, store_url)  # test_shared_cache's: a moto S3 server, a store of each kind, machines with their own cache and session
runner = CliRunner()
DAY = 86400
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def local(machine, monkeypatch) -> Path:
    """An empty local cache and no shared store."""
    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    return machine("local")


def entry(area: str, name: str, size: int, days: float) -> Path:
    """A file entry of `size` bytes, last used `days` ago (its record carries the last use)."""
    path = cache_root() / area / name
    atomic_write(path, os.urandom(size), entry=True)
    age(path, days)
    return path


def age(path: Path, days: float) -> None:
    then = time.time() - days * DAY
    for mark in (path, path.with_name(path.name + ".sha256"), path / FOLDER_SEAL):
        if mark.exists():
            os.utime(mark, (then, then))


def invoke(*args: str):
    result = runner.invoke(app, ["cache", *args])
    return result, (json.loads(result.stdout) if "--json" in args and result.exit_code == 0 else None)


def test_show_counts_each_area_with_its_bytes_and_last_uses(local):
    entry("host-runs", "a.npz", 1000, 3)
    entry("host-runs", "b.npz", 500, 1)
    atomic_write(cache_root() / "digests" / "memo", b"x" * 80)  # a memo: no record
    folder = _folder_entry("k1", {"package/manifest.json": b"{}", "package/model.onnx": b"m" * 2000})
    age(folder, 2)
    (cache_root() / "test-tools" / "tool").mkdir(parents=True)
    (cache_root() / "test-tools" / "tool" / "index.js").write_bytes(b"js")
    result, document = invoke("--json")
    assert result.exit_code == 0, result.output
    areas = document["local"]["areas"]
    assert set(areas) == {"host-runs", "digests", "builds", "test-tools"}
    assert areas["host-runs"]["entries"] == 2 and areas["host-runs"]["bytes"] == 1500 + 2 * 65  # records included
    assert areas["builds"]["entries"] == 1 and areas["builds"]["bytes"] > 2002
    memos = list((cache_root() / "digests").iterdir())  # the memo, and the digests sealing remembered
    assert areas["digests"] == {**areas["digests"], "entries": len(memos), "bytes": sum(p.stat().st_size for p in memos), "shared": False, "pruned": True}
    assert areas["test-tools"]["pruned"] is False and areas["builds"]["shared"] is True
    day = lambda iso: round((time.time() - datetime.fromisoformat(iso).timestamp()) / DAY)  # noqa: E731
    assert (day(areas["host-runs"]["oldest"]), day(areas["host-runs"]["newest"]), day(areas["builds"]["newest"])) == (3, 1, 2)
    assert document["local"]["total"]["entries"] == 4 + len(memos) and document["shared"] is None
    human, _ = invoke("show")
    lines = human.stdout.splitlines()
    assert human.exit_code == 0 and lines[0].startswith(f"local cache {cache_root()}")
    assert [line.split()[0] for line in lines[1:]] == ["builds", "digests", "host-runs", "test-tools", "total"]
    assert "3 d ago .. 1 d ago" in lines[3] and "(this machine only)" in lines[2] and "never pruned" in lines[4]


def test_prune_by_age_removes_entries_with_their_records_and_the_next_reader_makes_them_again(local, capsys):
    old = entry("host-runs", "old.npz", 100, 40)
    used = entry("host-runs", "used.npz", 100, 40)
    recent = entry("brotli", "recent.br", 100, 10)
    folder = _folder_entry("k2", {"package/model.onnx": b"m" * 300})
    age(folder, 45)
    atomic_write(cache_root() / "digests" / "memo", b"x")
    age(cache_root() / "digests" / "memo", 50)
    (cache_root() / "test-tools" / "tool").mkdir(parents=True)
    (cache_root() / "test-tools" / "tool" / "index.js").write_bytes(b"js")
    age(cache_root() / "test-tools" / "tool" / "index.js", 99)
    assert cached_entry(used) == used  # a read marks the entry used
    result, document = invoke("prune", "--older-than", "30d", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(item["name"] for item in document["local"]["removed"]) == ["builds/k2", "digests/memo", "host-runs/old.npz"]
    assert not old.exists() and not old.with_name("old.npz.sha256").exists() and not folder.exists()
    assert used.exists() and recent.exists() and (cache_root() / "test-tools" / "tool" / "index.js").exists()
    capsys.readouterr()
    assert cached_entry(old) is None and sealed_folder(folder) is False
    assert capsys.readouterr().err == ""  # gone, not damaged: no warning


def test_prune_by_size_removes_the_least_recently_used_first_and_dry_run_removes_nothing(local, tmp_path, monkeypatch):
    paths = [entry("webgpu-runs", f"{name}.npz", 935, days) for name, days in (("c", 3), ("a", 5), ("d", 2), ("b", 4))]  # 1000 bytes each with the record
    dry, document = invoke("prune", "--max-size", "2.5K", "--dry-run", "--json")
    assert dry.exit_code == 0 and document["dry_run"] is True
    assert [item["name"] for item in document["local"]["removed"]] == ["webgpu-runs/a.npz", "webgpu-runs/b.npz"]
    assert all(path.exists() for path in paths)
    listed, _ = invoke("prune", "--max-size", "2.5K", "--dry-run")
    assert listed.stdout.splitlines()[0].startswith("would remove webgpu-runs/a.npz (1.0 KB, last used 5 d ago)")
    monkeypatch.setenv("PACK_CACHE_URL", str(tmp_path / "no-such-store"))  # a local prune never opens the shared store
    real, _ = invoke("prune", "--max-size", "2.5K")
    assert real.exit_code == 0 and "removed 2 entries (2.0 KB); 2.0 KB left" in real.stdout
    assert sorted(p.name for p in paths if p.exists()) == ["c.npz", "d.npz"]


def test_what_was_used_in_the_last_hour_is_kept_and_a_use_after_listing_stops_the_removal(local):
    fresh = entry("host-runs", "fresh.npz", 100, 0)
    result, document = invoke("prune", "--older-than", "0s", "--max-size", "0", "--json")
    assert result.exit_code == 0 and document["local"]["removed"] == [] and document["local"]["kept_recent"] == 1
    assert fresh.exists()
    stale = entry("host-runs", "stale.npz", 100, 40)
    listed_use = time.time() - 40 * DAY + 1
    assert cached_entry(stale) == stale  # read after the prune listed it
    assert remove_entry(stale, listed_use) is False and stale.exists()


def test_the_shared_store_loses_listings_first_and_only_blobs_no_listing_lists(machine, store_url, tmp_path, monkeypatch):
    machine("a")
    runtime = b"the same runtime in every package"
    k5 = _folder_entry("k5", {"package/manifest.json": b"{}", "package/ort.wasm": runtime})
    _folder_entry("k6", {"package/manifest.json": b"{ }", "package/ort.wasm": runtime})
    atomic_write(cache_root() / "host-runs" / "k7.npz", b"outputs", entry=True)
    if not store_url.startswith("s3://"):  # a folder store keeps the times it is given; S3's are the writes'
        for name, days in (("builds/k5.listing.json", 3), ("builds/k6.listing.json", 2), ("host-runs/k7.npz", 1)):
            age(Path(store_url) / name, days)
    monkeypatch.setattr(cache_command, "GRACE_S", 0)  # S3 stamps objects with now
    before = objects(store_url)
    k5_only = {f"blobs/{hashlib.sha256(data).hexdigest()}" for data in (b"{}", (k5 / FOLDER_SEAL).read_bytes())}  # its manifest and seal
    shown, document = invoke("--json", "--cache-url", store_url)
    assert shown.exit_code == 0 and document["shared"]["areas"]["blobs"]["entries"] == 5
    assert document["shared"]["total"] == {"entries": len(before), "bytes": sum(before.values())}
    dry, _ = invoke("prune", "--shared", "--max-size", str(sum(before.values()) - 1), "--dry-run")
    assert dry.exit_code == 0 and objects(store_url) == before
    result, document = invoke("prune", "--shared", "--max-size", str(sum(before.values()) - 1), "--json")
    assert result.exit_code == 0, result.output
    assert document["local"] is None and document["shared"]["blobs"] == 2  # k5's manifest and seal; the runtime stays
    after = objects(store_url)
    assert set(before) - set(after) == {"builds/k5.listing.json", *k5_only} and set(after) <= set(before)
    b = machine("b")
    assert sealed_folder(b / "builds" / "k6") and (b / "builds" / "k6" / "package" / "ort.wasm").read_bytes() == runtime
    assert not sealed_folder(b / "builds" / "k5")
    everything, _ = invoke("prune", "--shared", "--local", "--older-than", "0s")
    assert everything.exit_code == 0 and objects(store_url) == {}
    assert "shared cache" in everything.stdout and "local cache" in everything.stdout


@pytest.mark.parametrize("args, says", [
    (["prune", "--older-than", "3 weeks"], "error: --older-than 3 weeks: not an age"),
    (["prune", "--max-size", "lots"], "error: --max-size lots: not a size"),
    (["prune"], "error: pack cache prune: give --older-than"),
    (["prune", "--shared", "--older-than", "1d"], "error: --shared: no shared store named"),
    (["--max-size", "5G"], "error: --max-size: only for `pack cache prune`"),
    (["--cache-url", "ftp://host/x"], "error: PACK_CACHE_URL=ftp://host/x: not a shared cache URL"),
])
def test_bad_options_are_one_line_naming_the_option_and_exit_2(local, args, says):
    entry("host-runs", "kept.npz", 10, 90)
    result = runner.invoke(app, ["cache", *args])
    assert result.exit_code == 2 and result.stderr.startswith(says) and len(result.stderr.splitlines()) == 1, result.output
    assert (cache_root() / "host-runs" / "kept.npz").exists()


def test_an_entry_named_by_its_sha256_gets_a_record_on_its_first_read_and_ages_from_it(local):
    data = b"a downloaded model"
    sha256 = hashlib.sha256(data).hexdigest()
    download = cache_root() / "downloads" / sha256
    download.parent.mkdir(parents=True)
    download.write_bytes(data)  # as pipeline/source/download.py leaves it: named by its hash, no record
    age(download, 40)
    before = download.stat()
    assert cached_entry(download, sha256) == download
    assert download.with_name(f"{sha256}.sha256").read_text().strip() == sha256
    assert (download.stat().st_mtime_ns, download.stat().st_ctime_ns) == (before.st_mtime_ns, before.st_ctime_ns)  # its remembered digest still holds
    result, document = invoke("prune", "--older-than", "30d", "--json")
    assert result.exit_code == 0 and document["local"]["removed"] == [] and download.exists()


READER = """
import os, shutil, sys, time
from pipeline.cache import atomic_write, cache_root, cached_entry, folder_commit, seal_folder, sealed_folder
end, root = time.time() + float(sys.argv[1]), cache_root()
while time.time() < end:
    for i in range(10):
        path = root / "host-runs" / f"e{i}.npz"
        if cached_entry(path) is None:
            atomic_write(path, b"%d" % i * 1000, entry=True)
        folder = root / "builds" / f"k{i}"
        if not sealed_folder(folder):
            scratch = root / "builds" / f".k{i}.{os.getpid()}"
            (scratch / "package").mkdir(parents=True, exist_ok=True)
            (scratch / "package" / "model.onnx").write_bytes(b"%d" % i * 1000)
            seal_folder(scratch)
            with folder_commit(folder):
                if not folder.is_dir():
                    os.rename(scratch, folder)
            shutil.rmtree(scratch, ignore_errors=True)
"""


def test_builds_reading_and_writing_while_a_prune_removes_their_entries_never_fail_nor_warn(local, monkeypatch):
    # No grace period, so every prune removes what the reader has just read or made: a reader
    # finds each entry whole or gone (made again, no warning), never half-removed.
    monkeypatch.setattr(cache_command, "GRACE_S", 0)
    readers = [subprocess.Popen([sys.executable, "-c", READER, "3"], env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    removed = 0
    while any(reader.poll() is None for reader in readers):
        result, document = invoke("prune", "--max-size", "8K", "--json")
        assert result.exit_code == 0, result.output
        removed += len(document["local"]["removed"])
    assert [(reader.returncode, reader.stderr.read()) for reader in readers] == [(0, ""), (0, "")]
    assert removed > 20


def test_an_entry_removed_while_a_reader_checks_it_reads_as_gone_without_a_warning(local, monkeypatch, capsys):
    # The moment the stress test above can only hit by chance: the prune removes the entry between
    # the reader finding it and hashing its bytes.
    import pipeline.cache

    path = entry("host-runs", "raced.npz", 100, 40)
    folder = _folder_entry("k9", {"package/model.onnx": b"m" * 100})
    age(folder, 40)
    hashing = pipeline.cache.remembered_digest

    def removed_first(file, kind, compute):
        for target in (path, folder):
            assert remove_entry(target, time.time()) in (True, False)
        return hashing(file, kind, compute)

    monkeypatch.setattr(pipeline.cache, "remembered_digest", removed_first)
    capsys.readouterr()
    assert cached_entry(path) is None and not path.exists()
    assert sealed_folder(folder) is False and not folder.exists()
    assert capsys.readouterr().err == ""
