"""Real third-party models shipped inside registry packages (named in README.md)."""

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.manifest import variant_files

pytestmark = pytest.mark.network_registry
runner = CliRunner()


def _build(recipe: str, out) -> tuple[int, dict, dict]:
    result = runner.invoke(app, ["build", recipe, "--no-browser", "--json", "--out", str(out)])
    assert result.exit_code in (0, 1), result.output
    package = out / recipe
    return result.exit_code, json.loads((package / "report.json").read_text()), json.loads((package / "manifest.json").read_text())


def test_gtcrn_from_pypi_converts_and_verifies_on_the_host(tmp_path):
    code, report, manifest = _build("gtcrn", tmp_path)
    assert code == 0 and report["passed"], [c for c in report["checks"] if c["status"] != "passed"]
    assert report["source"]["precision"] == "fp32"
    assert set(manifest["variants"]) == {"fp16", "fp32"}
    enh = [c for c in report["checks"] if c["stage"] == "host" and c["variant"] == "fp16" and c["output"] == "enh"][0]
    assert enh["metrics"]["snr_db"] >= enh["threshold"]["snr_db"]
    fp16 = next(p for p in manifest["files"] if p.startswith("model.fp16"))
    fp32 = next(p for p in manifest["files"] if p.startswith("model.fp32"))
    assert manifest["files"][fp16]["size"] < 0.85 * manifest["files"][fp32]["size"]


@pytest.mark.slow
def test_isnet_fp16_is_handled_as_already_fp16(tmp_path, monkeypatch):
    # ISNet at 1024² is over the whole-run limit: its node audit takes about a minute even with
    # warm caches, so it is timed by scripts/bench/bench_node_audit.py, not here (tests/test_verify_node_audit.py
    # covers the audit on small graphs)
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    code, report, manifest = _build("isnet-fp16", tmp_path)
    assert report["source"]["precision"] == "fp16"
    assert any("already fp16" in r.get("what", "") for s in report["steps"] for r in s["records"])
    assert manifest["variants"]["fp16"]["requires"] == ["shader-f16"]
    assert manifest["variants"]["fp32"]["precision"] == "fp32"  # upcast fallback
    # the recipe lists no variants: fp16w by default (its weights are the whole model), the fp16
    # bytes as they are, widened to fp32 for the wasm EP and GPUs without shader-f16
    assert manifest["variants"]["fp16w"]["widen"] == "fp16-initializers"
    assert manifest["variantFor"] == {"webgpu": ["fp16", "fp16w", "fp32"], "wasm": ["fp16w", "fp32"]}
    host = {(c["variant"], c["status"]) for c in report["checks"] if c["stage"] == "host"}
    assert host == {("fp16", "passed"), ("fp16w", "passed"), ("fp32", "passed")}, host
    visits = report["delivery"]["first_visit"]
    assert visits["apple-mobile"]["variant"] == visits["desktop"]["without_features"]["variant"] == "fp16w"
    model_bytes = {v: sum(manifest["files"][path]["size"] for path in variant_files(manifest["variants"][v])) for v in ("fp16w", "fp32")}
    assert 0.49 < model_bytes["fp16w"] / model_bytes["fp32"] < 0.51, model_bytes
    assert code == 0


@pytest.mark.slow
def test_isnet_uint8_is_handled_as_quantized(tmp_path):
    code, report, manifest = _build("isnet-uint8", tmp_path)
    assert report["source"]["precision"] == "quantized"
    assert list(manifest["variants"]) == ["quantized"] and manifest["variantFor"] == {"wasm": ["quantized"]}
    assert not any(s["name"] == "fp16_convert" and s["changed"] for s in report["steps"])
    # judged against its dequantized twin (ConvInteger -> Conv), not itself: figures, not just "runs"
    assert any(s["name"] == "fp32_reference" and s["changed"] for s in report["steps"])
    host = [c for c in report["checks"] if c["stage"] == "host"]
    # every output's figures (and the matte's mask decision beside them) passed
    assert host and all(c["status"] == "passed" for c in host) and all("rel_l2" in c["metrics"] for c in host if "mask_agreement" not in c["metrics"])
    kernels = [c for c in report["checks"] if c["stage"] == "webgpu-kernels"]
    assert [(c["status"], c["detail"]) for c in kernels] == [("skipped", "no platform chain runs it on WebGPU")]
    assert code == 0
