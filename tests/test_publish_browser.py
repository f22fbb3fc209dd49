"""A package built by `pack build`, published to the S3 test server, works from there in a browser:
every request its demo page makes is answered, and the page runs the model."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.manifest import file_parts
from pipeline.verify.engines.browser.chromium import launch_browser, new_watched_page
from build_helpers import conv_model, save
from publish_helpers import new_bucket, run_json

pytestmark = pytest.mark.browser


def test_published_demo_page_loads_every_file_from_the_bucket_and_runs(s3_server, aws_env, tmp_path):
    model = save(conv_model(), tmp_path / "tiny-conv.onnx")
    dist = tmp_path / "dist"
    built = CliRunner().invoke(app, ["build", str(model), "--no-browser", "--out", str(dist)])
    assert built.exit_code == 0, built.output
    bucket = new_bucket(s3_server)
    # public reads, as a bucket serving packages to browsers has them
    s3_server.client().put_bucket_policy(Bucket=bucket, Policy=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{bucket}/*"}],
    }))
    summary = run_json(str(dist), "--bucket", bucket, "--endpoint-url", s3_server.url)
    manifest = json.loads((dist / "tiny-conv" / "manifest.json").read_text())
    assert summary["uploaded"] == len(manifest["files"]) + 1

    page_url = f"{s3_server.url}/{bucket}/tiny-conv/index.html"
    answers: dict[str, int] = {}
    heads: list[int] = []
    failed: list[str] = []
    with launch_browser() as browser:
        page, watch = new_watched_page(browser)
        # The loader's one HEAD (does the host decode .br bodies?) apart: moto refuses it to an
        # anonymous client (403; S3 allows HEAD under s3:GetObject), and the loader then keeps the
        # browser's decoding; Chromium reports a HEAD as aborted once its headers are in.
        def answered(response):
            if response.request.method == "HEAD":
                heads.append(response.status)
            else:
                answers[response.url] = response.status

        page.on("response", answered)
        page.on("requestfailed", lambda request: request.method == "HEAD" or failed.append(f"{request.url}: {request.failure}"))
        page.goto(page_url)
        page.wait_for_function("window.packDemo", timeout=120_000)
        demo = page.evaluate("window.packDemo")
        page.context.close()

    assert demo["ok"], (demo["error"], [line.text for line in watch.lines][-20:])
    assert demo["ep"] in ("webgpu", "wasm") and demo["variant"] in manifest["variants"] and demo["ms"] > 0
    assert failed == [] and len(heads) == 1
    assert {url: status for url, status in answers.items() if status != 200} == {}
    base = f"{s3_server.url}/{bucket}/tiny-conv/"
    fetched = {url.removeprefix(base) for url in answers if url.startswith(base)}
    # the page, its script, the loader, the manifest, the sample, a model and the runtime it picked
    assert {"index.html", "demo.js", "loader.js", "loader/load.js", "manifest.json", manifest["sample"]["file"]} <= fetched
    # the page compared its run with the build's fp32 reference shipped in the sample file
    assert demo["comparison"]["passed"] is True and demo["comparison"]["text"].startswith("matches the build's fp32 reference: y: "), demo["comparison"]
    assert fetched <= set(manifest["files"]) | {"manifest.json"}
    # the bucket serves brotli bodies with Content-Encoding: br, so the loader's brotli decoder is never fetched
    assert not {manifest["runtime"]["decoder"]["module"], manifest["runtime"]["decoder"]["wasm"]} & fetched
    # the runtime's .wasm whole, or its parts where it is over [assets] max_file_mib (the webgpu bundle's)
    wasm = {part for bundle in manifest["runtime"]["bundles"].values() for part in file_parts(manifest, bundle["wasm"])}
    assert any(path.endswith(".onnx") for path in fetched) and fetched & wasm
