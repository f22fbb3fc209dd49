"""Host runs in a child process: a crash is a result that names the signal, never a dead build."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import pipeline.verify.engines.host as host
from pipeline.cli import app
from build_helpers import conv_model, save


@pytest.fixture
def crashing_worker(monkeypatch, tmp_path):
    monkeypatch.setattr(host, "WORKER_MODULE", "tests.crashing_session_worker")
    runs = tmp_path / "host-runs"  # an empty run cache: no cached result may hide the crash
    runs.mkdir()
    monkeypatch.setattr(host, "cache_dir", lambda *parts: runs)
    return monkeypatch


def test_crash_at_default_level_retries_lower_and_records_it(crashing_worker, tmp_path):
    crashing_worker.setenv("PACK_TEST_CRASH_LEVELS", "all")
    model = save(conv_model(), tmp_path / "m.onnx")
    run = host.run_model(model, {"x": np.ones((1, 3, 16, 16), np.float32)})
    assert run.outputs is not None and run.level == "extended"
    assert run.crashes == ["all: SIGSEGV"]


def test_crash_at_every_level_is_a_failed_check_naming_the_signal(crashing_worker, tmp_path):
    model = save(conv_model(), tmp_path / "m.onnx")
    crashing_worker.setenv("PACK_TEST_CRASH_LEVELS", "all,extended,basic,disabled")
    run = host.run_model(model, {"x": np.ones((1, 3, 16, 16), np.float32)})
    assert run.outputs is None and "SIGSEGV" in run.error


def test_build_survives_a_crashing_variant(crashing_worker, tmp_path, monkeypatch):
    """The fp32 reference runs; every run after it crashes: the fp16 check fails, the build does not."""
    model = save(conv_model(), tmp_path / "m.onnx")
    calls = {"n": 0}
    real = host._run_uncached

    def reference_then_crash(model_path, feeds):
        calls["n"] += 1
        if calls["n"] > 1:
            monkeypatch.setenv("PACK_TEST_CRASH_LEVELS", "all,extended,basic,disabled")
        return real(model_path, feeds)

    monkeypatch.setattr(host, "_run_uncached", reference_then_crash)
    result = CliRunner().invoke(app, ["build", str(model), "--no-browser", "--json", "--out", str(tmp_path / "d")])
    assert result.exit_code == 0, result.output  # fp16 refused; the fp32 variant serves every chain
    report = json.loads(result.stdout)
    failed = [c for c in report["checks"] if c["status"] == "failed"]
    assert failed and all("SIGSEGV" in c["detail"] for c in failed)
    assert (tmp_path / "d" / "m" / "manifest.json").exists()
