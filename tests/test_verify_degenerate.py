"""No vacuous verdict (issue 28): a degenerate fp32 reference makes its checks not-verifiable, never
passed; an exact match reads "identical"; and the summary, report.json, report.html, the manifest
and the exit code give one verdict, read from one field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.manifest import package_verdict
from pipeline.verify.judgement.checks import output_checks, output_failures, refused_by_build
from pipeline.verify.judgement.metrics import compare, degenerate_reference, format_metrics, verdict
from build_helpers import conv_model, model_from_text, save

runner = CliRunner()
BOUNDS = {"max_abs_of_range": 1e-3, "rel_l2": 1e-3}
# y is the input scaled by zero: its reference is all zeros, whatever the sample
ZEROED = """
<ir_version: 8, opset_import: ["" : 17]>
zeroed (float[2, 8] x) => (float[2, 8] y, float[2, 8] z) <float zero = {0.0}> {
  y = Mul (x, zero)
  z = Relu (x)
}
"""


@pytest.mark.parametrize(("reference", "why"), [
    (np.zeros((4, 4), np.float32), "all 16 of its values are 0"),
    (np.full(6, -0.75, np.float32), "all 6 of its values are -0.75 (constant)"),
    (np.float32(1000) + np.float32(1000 * 2**-23) * np.arange(5, dtype=np.float32), "as good as constant"),
    (np.zeros(1, np.float32), "all 1 of its values are 0"),
    (np.full(3, 1e-40, np.float32), "below fp32's normal range"),
    (np.array([1.0, np.nan, 2.0], np.float32), "1 of its 3 values are NaN or Inf"),
])
def test_degenerate_references_say_why(reference, why):
    found = degenerate_reference(reference)
    assert found is not None and why in found


@pytest.mark.parametrize("reference", [
    np.full(1, 3.5, np.float32),  # one value: judged against its magnitude
    np.linspace(-1, 1, 50, dtype=np.float32),
    np.zeros(8, np.int64),  # ids compared exactly: equality means something
])
def test_references_that_can_tell_right_from_wrong(reference):
    assert degenerate_reference(reference) is None


def test_a_degenerate_reference_is_not_verifiable_whatever_the_figures_but_a_broken_output_fails():
    zeros = np.zeros((2, 8), np.float32)
    for actual in (zeros, zeros + 1e-6, np.full_like(zeros, 5.0)):  # right, near, wildly off: no reference can tell
        metrics, status, why = verdict(zeros, actual, "tensor", BOUNDS)
        assert status == "not-verifiable" and why.startswith("degenerate fp32 reference: all 16 of its values are 0"), (status, why)
        assert "give a sample that exercises the model (--inputs)" in why
    broken = zeros.copy()
    broken[1, 3] = np.nan
    assert verdict(zeros, broken, "tensor", BOUNDS)[1] == "failed"
    assert verdict(zeros, zeros[:1], "tensor", BOUNDS)[1] == "failed"
    signal = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    assert verdict(signal, signal, "tensor", BOUNDS)[1] == "passed"
    assert verdict(signal, signal + 0.1, "tensor", BOUNDS)[1] == "failed"


def test_checks_and_the_fp16_search_see_a_degenerate_output_as_not_verifiable():
    reference = {"y": np.zeros((2, 8), np.float32), "z": np.linspace(0, 1, 16, dtype=np.float32).reshape(2, 8)}
    outputs = {"y": np.full((2, 8), 0.5, np.float32), "z": reference["z"].copy()}
    checks = output_checks({"stage": "host", "ep": "cpu", "variant": "fp16"}, reference, outputs, {"y": BOUNDS, "z": BOUNDS}, {})
    assert [(c["output"], c["status"]) for c in checks] == [("y", "not-verifiable"), ("z", "passed")]
    assert output_failures(reference, outputs, {"y": BOUNDS, "z": BOUNDS}, {}) == {}  # blocks no candidate


def test_identical_outputs_read_identical_not_a_ceiling_figure():
    signal = np.sin(np.linspace(0, 20, 600)).astype(np.float32)
    for kind, figure in (("audio", "snr_db"), ("image", "psnr_db")):
        metrics = compare(signal, signal, kind)
        assert metrics["identical"] is True and figure not in metrics and 999.0 not in metrics.values()
        assert format_metrics(metrics, {figure: 50.0, "max_abs_of_range": 1e-3}) == "identical to the reference"
        assert verdict(signal, signal, kind, {figure: 50.0})[1] == "passed"
    off = compare(signal, signal + 1e-3, "audio")
    assert off["identical"] is False and "snr_db" in off and "identical" not in format_metrics(off, {"snr_db": 50.0})


def test_the_package_rule_says_which_run_could_not_verify():
    runs = [{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp32", "status": "not-verifiable", "detail": "y: degenerate fp32 reference: all 16 of its values are 0"}]
    manifest = {"verification": {"runs": runs}, "executionProviders": {"desktop": ["wasm"]}, "variantFor": {"wasm": ["fp32"]}}
    passed, problems = package_verdict(manifest)
    assert not passed and "degenerate fp32 reference" in problems[0]


def test_pack_verify_marks_failures_on_triples_the_build_refused():
    runs = [{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "failed", "detail": "y: rel_l2 0.3 > 0.01"},
            {"stage": "webgpu-kernels", "bundle": "*", "ep": "webgpu", "variant": "fp16w", "status": "failed", "detail": "y: snr"}]
    manifest = {"verification": {"runs": runs}}
    checks = [
        {"stage": "browser", "ep": "webgpu", "variant": "fp16", "bundle": "webgpu", "output": "y", "status": "failed", "detail": "rel_l2 0.3 > 0.01"},
        {"stage": "webgpu-kernels", "ep": "webgpu", "variant": "fp16w", "output": "y", "status": "failed", "detail": "snr_db 3 < 25"},
        {"stage": "browser", "ep": "wasm", "variant": "fp16w", "bundle": "webgpu", "output": "y", "status": "failed", "detail": "new"},
        {"stage": "browser", "ep": "wasm", "variant": "fp32", "bundle": "webgpu", "output": "y", "status": "passed"},
    ]
    marked = refused_by_build(checks, manifest)
    assert [c["status"] for c in marked] == ["refused", "refused", "failed", "passed"]
    assert marked[0]["detail"].startswith("refused by the build (host fp16 (any bundle, any EP): failed: y: rel_l2 0.3 > 0.01)")
    assert marked[0]["detail"].endswith("here: rel_l2 0.3 > 0.01")


def _badge(package: Path) -> str:
    return re.search(r'id="verdict">(\w+)<', (package / "report.html").read_text(encoding="utf-8")).group(1)


def _verdicts(result, package: Path) -> dict:
    """Every place a build states its verdict, read back."""
    report = json.loads((package / "report.json").read_text())
    manifest = json.loads((package / "manifest.json").read_text())
    summary = next(line for line in result.output.splitlines() if re.match(r"^(PASSED|FAILED): ", line))
    return {"exit": result.exit_code == 0, "report.json": report["passed"], "manifest": manifest["verification"]["passed"],
            "report.html": _badge(package) == "PASSED", "summary": summary.startswith("PASSED")}


def test_a_degenerate_output_fails_the_package_everywhere_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    model = save(model_from_text(ZEROED), tmp_path / "zeroed.onnx")
    result = runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(tmp_path / "dist")])
    package = tmp_path / "dist" / "zeroed"
    assert _verdicts(result, package) == dict.fromkeys(("exit", "report.json", "manifest", "report.html", "summary"), False), result.output
    assert result.exit_code == 1
    report = json.loads((package / "report.json").read_text())
    host_y = [c for c in report["checks"] if c["stage"] == "host" and c.get("output") == "y"]
    assert host_y and all(c["status"] == "not-verifiable" and "all 16 of its values are 0" in c["detail"] for c in host_y)
    assert any(c["status"] == "passed" for c in report["checks"] if c.get("output") == "z")
    assert "degenerate fp32 reference" in " ".join(report["verdict"])
    assert re.search(r"n/v  host +cpu/fp32 +y  .*degenerate fp32 reference: all 16 of its values are 0", result.output), result.output


def test_a_refused_variant_leaves_one_passed_verdict_everywhere(tmp_path, monkeypatch):
    """fp16 misses an impossible bound and is refused (failed checks), fp32 serves every chain:
    the package passes, and the report.html badge says so as the exit code does."""
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    save(conv_model(), tmp_path / "conv.onnx")
    recipe = tmp_path / "strict.toml"
    recipe.write_text('source.uri = "conv.onnx"\n[outputs.y.fp16]\nmax_abs = 0.0\n[fp16]\nsearch = false\n')
    result = runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "dist")])
    package = tmp_path / "dist" / "strict"
    report = json.loads((package / "report.json").read_text())
    assert any(c["status"] == "failed" for c in report["checks"])  # the refused fp16
    assert _verdicts(result, package) == dict.fromkeys(("exit", "report.json", "manifest", "report.html", "summary"), True), result.output
    # the host fp32 check matches its own reference exactly: "identical", never a 999 dB ceiling
    assert re.search(r"ok   host +cpu/fp32 +y  identical to the reference$", result.output, re.MULTILINE), result.output
    assert " 999" not in result.output
