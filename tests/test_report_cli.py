"""report.html without a browser: `pack report` on a --no-browser build and its bad input, the
bounded outputs the browser checks keep, and `pack publish` leaving the report out unless
--with-report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.verify.engines.browser.harness import KEPT_OUTPUT_ELEMENTS, kept_output
from build_helpers import conv_model, save
from publish_helpers import bucket_snapshot, new_bucket, run_json, write_package

runner = CliRunner()


@pytest.fixture(scope="module")
def no_browser_package(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report-cli")
    model = save(conv_model(channels=4, size=16), root / "tiny-report.onnx")
    result = runner.invoke(app, ["build", str(model), "--no-browser", "--out", str(root / "dist")])
    assert result.exit_code == 0, result.output
    return root / "dist" / "tiny-report"


def test_a_no_browser_build_writes_a_report_with_every_check_and_the_host_fp16_output(no_browser_package) -> None:
    html = (no_browser_package / "report.html").read_text()
    report = json.loads((no_browser_package / "report.json").read_text())
    assert html.count('<tr class="check ') == len(report["checks"])
    # skipped browser checks say why; the fp16 variant's host output is drawn (a tensor: an error histogram)
    assert html.count('data-status="skipped"') == sum(c["status"] == "skipped" for c in report["checks"]) > 0
    assert 'data-output="y" data-drawn-as="tensor"' in html and "data:image/svg+xml;base64," in html
    # self-contained: no script, stylesheet, font or picture from anywhere else
    assert not re.search(r"""(src|href)=["'](?!data:|#)""", html)
    assert "<script" not in html
    # not published: the manifest does not list the report's files
    manifest = json.loads((no_browser_package / "manifest.json").read_text())
    assert not {"report.json", "report.html", "report.data.npz"} & set(manifest["files"])


def test_pack_report_rerenders_from_the_package_without_running_anything(no_browser_package, monkeypatch) -> None:
    import pipeline.verify.engines.host

    def must_not_run(*args, **kwargs):
        raise AssertionError("pack report ran a model: the host outputs are in report.data.npz")

    monkeypatch.setattr(pipeline.verify.engines.host, "run_model", must_not_run)
    (no_browser_package / "report.html").unlink()
    result = runner.invoke(app, ["report", str(no_browser_package), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"report": str(no_browser_package / "report.html")}
    html = (no_browser_package / "report.html").read_text()
    assert "verified by</dt><dd>pack build" in html and "<code>cpu/fp16 (host)</code>" in html


def test_pack_report_bad_input_is_one_error_line(no_browser_package, tmp_path) -> None:
    result = runner.invoke(app, ["report", str(tmp_path / "nothing")])
    assert result.exit_code == 2 and "error:" in result.output and "no such folder" in result.output
    broken = tmp_path / "broken"
    broken.mkdir()
    for path in no_browser_package.iterdir():
        if path.name not in ("report.json", "report.html"):
            (broken / path.name).symlink_to(path)
    result = runner.invoke(app, ["report", str(broken)])
    assert result.exit_code == 2
    assert f"error: {broken / 'report.json'}: not found; rebuild the package with `pack build`" in result.output
    assert not (broken / "report.html").exists()  # nothing half-written


def test_kept_outputs_are_bounded() -> None:
    small = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert kept_output(small, "tensor") == (small, None)
    image = np.zeros((1, 3, 1024, 1024), dtype=np.float32)
    kept, cut = kept_output(image, "image")
    assert kept.shape == (1, 3, 512, 512) and cut == "every 2th row and column of [1, 3, 1024, 1024]"
    flat, cut = kept_output(np.zeros(KEPT_OUTPUT_ELEMENTS + 5, dtype=np.float32), "audio")
    assert flat.size == KEPT_OUTPUT_ELEMENTS and cut.startswith(f"the first {KEPT_OUTPUT_ELEMENTS} of")


def test_publish_leaves_the_report_out_unless_asked(s3_server, aws_env, tmp_path) -> None:
    package = write_package(tmp_path / "dist")
    (package.root / "report.html").write_text("<!doctype html><title>report</title>\n")
    (package.root / "report.data.npz").write_bytes(b"not published")
    bucket = new_bucket(s3_server)
    summary = run_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url)
    assert summary["warnings"] == []  # the report's files are not "unlisted" files
    assert not [key for key in bucket_snapshot(s3_server.client(), bucket) if "report." in key]
    summary = run_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--with-report", "--prune")
    objects = bucket_snapshot(s3_server.client(), bucket)
    assert objects["demo/report.html"]["content_type"] == "text/html; charset=utf-8"
    assert objects["demo/report.json"]["content_type"] == "application/json"
    assert objects["demo/report.json"]["body"] == (package.root / "report.json").read_bytes()
    assert "demo/report.data.npz" not in objects
    assert [o["key"] for o in summary["objects"][-2:]] == ["demo/report.html", "demo/report.json"]  # with the page: uploaded last
    # a publish of another package with --prune keeps this one's reports
    other = write_package(tmp_path / "dist", name="other")
    run_json(str(other.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--prune")
    assert {"demo/report.html", "demo/report.json"} <= set(bucket_snapshot(s3_server.client(), bucket))
    # and asked for a report that is not there: one error line, nothing uploaded
    (package.root / "report.html").unlink()
    result = runner.invoke(app, ["publish", str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--with-report"])
    assert result.exit_code == 2
    assert f"error: {package.root / 'report.html'}: not found; make it with `pack report {package.root}`" in result.output
    (package.root / "report.json").unlink()
    result = runner.invoke(app, ["publish", str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--with-report"])
    assert result.exit_code == 2
    assert f"error: {package.root / 'report.json'}: not found; rebuild the package with `pack build`" in result.output


def test_audio_plays_at_the_recipe_sample_rate_and_spectrum_frames_are_not_played() -> None:
    import base64
    import io
    import wave

    from pipeline.report.data import ReportData
    from pipeline.report.render import _output_sections

    t = np.arange(4000) / 8000
    reference = {"wave": np.sin(2 * np.pi * 440 * t)[None].astype(np.float32), "frame": np.ones((1, 257, 1, 2), np.float32)}
    data = ReportData({"wasm/fp16": {name: array * 0.99 for name, array in reference.items()}})
    manifest = {"outputs": [{"name": "wave", "kind": "audio"}, {"name": "frame", "kind": "audio"}]}
    for report, rate in (({"sample_rate": 22050}, 22050), ({}, 16000)):
        wave_section, frame_section = _output_sections(manifest, report, {}, reference, data)
        assert (wave_section.drawn_as, frame_section.drawn_as) == ("waveform", "spectrum")
        assert [p["label"] for p in wave_section.players] == ["fp32 reference (host)", "wasm/fp16"] and frame_section.players == []
        with wave.open(io.BytesIO(base64.b64decode(wave_section.players[1]["uri"].split(",", 1)[1]))) as sound:
            assert (sound.getframerate(), sound.getnframes(), sound.getnchannels()) == (rate, 4000, 1)
        assert any("16000 Hz" in note for note in wave_section.notes) == (rate == 16000)  # an assumed rate says so


def test_the_page_says_records_in_words_small_figures_as_such_and_each_platforms_first_visit(no_browser_package) -> None:
    from pipeline.manifest import read_manifest
    from pipeline.report.data import load
    from pipeline.report.render import render_html
    from pipeline.sample_file import read_sample
    from pipeline.verify.judgement.checks import rounded_metrics

    manifest = read_manifest(no_browser_package)
    report = json.loads((no_browser_package / "report.json").read_text())
    # records as the conversion steps write them: lists of dicts, dicts of figures, empty ones
    report["steps"] = [
        {"name": "fp16_keep_fp32", "changed": True, "records": [{"what": "1 node kept in fp32", "kept": [{"node": "Add_10", "op": "Add", "why": "reads 1e-12"}],
                                                                 "sizes": {"fp32_bytes": 467728, "kept_cost_bytes": 4}}]},
        {"name": "layout", "changed": True, "records": [{"what": "NCHW passes", "nhwc_failures": ["fp16/y: rel_l2 0.3"], "options": {}}]},
    ]
    report["webgpu_kernels"] = {"adapter": None, "ep_options": {"preferredLayout": "NCHW"}, "runs": {"fp16": {"webgpu_nodes": 410, "cpu_fallback_nodes": [{"op": "Shape", "node": "s1"}]}}}
    # the browser's figures cross as JSON, rounded: 3.7e-7 stays 3.7e-7, an exact 0 stays 0
    tiny = rounded_metrics({"max_abs_of_range": 3.7e-7, "rel_l2": 0.0, "psnr_db": 95.1234567})
    assert tiny == {"max_abs_of_range": 3.7e-7, "rel_l2": 0.0, "psnr_db": 95.1235}
    report["checks"] = [{"stage": "browser", "bundle": "webgpu", "ep": "wasm", "variant": "fp32", "status": "passed", "output": "y",
                         "metrics": tiny, "threshold": {"max_abs_of_range": 1e-3, "rel_l2": 1e-2}}]
    report["browser"] = {"chromium": "150", "adapter": {"available": False, "reason": "none"}, "runs": [
        {"bundle": "webgpu", "ep": "wasm", "variant": "fp32", "slowest_kernels": [{"node": "conv", "op": "Conv", "clock": "host", "per_run_us": 16284.0}]}],
        "eps": {"wasm/fp32": {"session_create_ms": 40.0, "first_run_ms": 9.0, "steady_run_ms": 3.0, "status": "passed"}}}
    inputs, reference = read_sample(no_browser_package, manifest)
    html = render_html(manifest, report, inputs, reference, load(no_browser_package))
    page = re.sub(r"<style>.*?</style>|data:[^\"']+", "", html, flags=re.S)
    assert not re.search(r"""[\[{](&#34;|"|&quot;)|(&#34;|"|&quot;): |\{\}|\[\]""", page), "raw JSON on the page"
    assert "<code class=\"node\">Add_10</code>: reads 1e-12; op Add" in page and "fp32 bytes 467,728; kept cost bytes 4" in page
    assert "NCHW passes; nhwc failures fp16/y: rel_l2 0.3" in page and "options: none" in page and "preferredLayout NCHW" in page
    assert "<code>max_abs_of_range</code> 3.7e-7 (≤ 0.001)" in page and "<code>rel_l2</code> 0 (≤ 0.01)" in page
    # the profiled kernel (16 ms) is labelled as profiling, apart from the production run (3 ms)
    kernels = page[page.index("Slowest kernels"):page.index('id="sizes"')]
    assert "profiling times" in kernels and "profiled ms per run" in kernels and "16.28" in kernels
    # the first visit of each platform, as report.json's delivery says (pipeline/assets/delivery.py)
    visits = report["delivery"]["first_visit"]
    assert visits and page.count('<tr class="visit" data-platform=') == len(visits)
    for platform, visit in visits.items():
        row = re.search(rf'<tr class="visit" data-platform="{platform}">(.*?)</tr>', page).group(1)
        assert f'{visit["wire_bytes"]:,}' in row and f'{visit["bytes"]:,}' in row and visit["variant"] in row
