"""`pack build` records each browser run's status in manifest.verification.runs, and the shipped
loader reads it (info.verified). A real build of a tiny conv model, browser checks on SwiftShader."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loader_helpers import LOAD_AND_RUN, TEST_PREFIX, blank_pages_dir
from pipeline.cli import app
from pipeline.verify.engines.browser.chromium import launch_browser
from pipeline.package_server import running_server
from build_helpers import conv_model, save

runner = CliRunner()


def _build(model: Path, out: Path, *flags: str) -> tuple[int, dict, dict]:
    result = runner.invoke(app, ["build", str(model), "--out", str(out), "--json", *flags])
    assert result.exit_code in (0, 1), result.output
    package = out / model.stem
    return result.exit_code, json.loads((package / "manifest.json").read_text()), json.loads(result.stdout)


@pytest.mark.browser
def test_browser_build_records_every_run_and_the_loader_reports_it(tmp_path):
    model = save(conv_model(channels=4, size=8), tmp_path / "tiny-verified.onnx")
    code, manifest, report = _build(model, tmp_path / "dist")
    runs = [r for r in manifest["verification"]["runs"] if r["stage"] == "browser"]
    # One entry per browser run, exactly the report's, in (bundle, ep, variant) order.
    assert [{k: r[k] for k in ("bundle", "ep", "variant", "status")} for r in runs] == sorted(
        ({"bundle": r["bundle"], "ep": r["ep"], "variant": r["variant"], "status": r["status"]} for r in report["browser"]["runs"]),
        key=lambda r: (r["bundle"], r["ep"], r["variant"]),
    )
    host = [r for r in manifest["verification"]["runs"] if r["stage"] == "host"]
    assert host == [{"stage": "host", "bundle": "*", "ep": "*", "variant": v, "status": "passed"} for v in ("fp16", "fp32")]
    # the bounds every check used are the manifest's
    for check in report["checks"]:
        if check.get("threshold"):
            assert manifest["thresholds"][check["ep"]][check["variant"]][check["output"]] == check["threshold"], check
    # the build's browser times, per passed run, as the loader's priors
    measured = {(m["bundle"], m["ep"], m["variant"]) for m in manifest["measurements"]}
    assert measured == {(r["bundle"], r["ep"], r["variant"]) for r in runs if r["status"] == "passed"}
    assert all(m["source"] == "build" and m["firstMs"] > 0 and m["browser"].startswith("Chromium") for m in manifest["measurements"])
    assert all((m["adapter"] is None) == (m["ep"] == "wasm") for m in manifest["measurements"])
    assert [(r["bundle"], r["ep"], r["variant"]) for r in runs] == [
        ("wasm", "wasm", "fp16"),  # every variant on every EP: wasm x fp16 too
        ("wasm", "wasm", "fp32"),
        ("webgpu", "wasm", "fp16"),
        ("webgpu", "wasm", "fp32"),
        ("webgpu", "webgpu", "fp16"),
        ("webgpu", "webgpu", "fp32"),
    ]
    statuses = {(r["bundle"], r["ep"], r["variant"]): r["status"] for r in runs}
    # SwiftShader has no shader-f16: fp16 on webgpu can only be not-verifiable here.
    assert statuses.pop(("webgpu", "webgpu", "fp16")) == "not-verifiable"
    assert set(statuses.values()) == {"passed"}, runs
    assert code == 0 and manifest["verification"]["browser"] is True and manifest["verification"]["passed"] is True
    # A tiny model's sample run is cheap: the build makes the measured choice the loader's default.
    assert manifest["loader"]["select"] == "measured" and "cheap" in report["loader"]["why"]

    # The shipped loader says the build verified the pair it runs.
    package = tmp_path / "dist" / model.stem
    with running_server(package, {TEST_PREFIX: blank_pages_dir(tmp_path / "pages")}) as server, launch_browser() as browser:
        page = browser.new_context().new_page()
        page.goto(server.url + TEST_PREFIX[1:] + "blank.html")
        loaded = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"cache": False, "select": "chain"}, "run": False})
        measured = page.evaluate(LOAD_AND_RUN, {"base": server.url, "options": {"cache": False, "storage": None}, "run": False})
    assert loaded["ok"], loaded
    info = loaded["info"]
    # select: 'chain' follows the build's measurements on this adapter class: the faster of the
    # chain's pairs (on SwiftShader that is wasm) runs first, and the build verified it.
    # (the chain's pairs: variantFor; wasm x fp16 is measured too but no chain picks it by default)
    priors = {(m["ep"], m["variant"]): m["steadyMs"] for m in manifest["measurements"]
              if m["bundle"] == "webgpu" and m["steadyMs"] and m["variant"] in manifest["variantFor"][m["ep"]]}
    assert set(priors) == {("webgpu", "fp32"), ("wasm", "fp32")}, manifest["measurements"]
    assert (info["ep"], info["variant"]) == min(priors, key=priors.get)
    assert (info["bundle"], info["verified"], info["skipped"]) == ("webgpu", "passed", [])
    assert [c["priorMs"] for c in info["selection"]["candidates"]] == sorted(priors.values())
    # The package's default: trials among the pairs the build verified, the choice among them.
    assert measured["ok"], measured
    selection = measured["info"]["selection"]
    assert selection["mode"] == "measured" and selection["fromCache"] is False
    assert {(c["ep"], c["variant"]) for c in selection["candidates"]} == {("webgpu", "fp32"), ("wasm", "fp32")}
    assert measured["info"]["verified"] == "passed"


def test_no_browser_build_records_no_runs(tmp_path):
    model = save(conv_model(channels=4, size=8), tmp_path / "tiny-unverified.onnx")
    code, manifest, _ = _build(model, tmp_path / "dist", "--no-browser")
    assert code == 0
    verification = manifest["verification"]
    assert verification["browser"] is False and verification["passed"] is True
    browser = [r for r in verification["runs"] if r["stage"] == "browser"]
    assert browser and all(r["status"] == "skipped" and r["detail"] == "--no-browser" for r in browser)
    assert manifest["measurements"] == []
    # No browser timing: the loader keeps the platform chain.
    assert manifest["loader"]["select"] == "chain"
