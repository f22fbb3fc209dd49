"""Faults during `pack publish`: whatever fails, nothing published before is lost, no manifest names
a missing object, the error says what happened, and running the command again completes it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_helpers import interruptible
from publish_helpers import Fault, assert_manifests_complete, bucket_snapshot, is_upload, key_endswith, new_bucket, run_cli, run_json, write_package

MIB = 1024 * 1024
# Faults whose handling does not depend on the upload form run over https only (what R2 sees);
# resets, 5xx on parts and a vanishing server run over both.
https_only = pytest.mark.parametrize("proxy", ["https"], indirect=True)


@pytest.fixture
def published_v1(proxy, s3_server, tmp_path):
    """Bucket with v1 published (directly, no faults) and a v2 package ready to publish."""
    bucket = new_bucket(s3_server)
    v1 = write_package(tmp_path / "v1")
    run_json(str(v1.root), "--bucket", bucket, "--endpoint-url", s3_server.url)
    v2 = write_package(tmp_path / "v2", version="v2", incompressible_bytes=6 * MIB)  # 2 parts
    before = bucket_snapshot(s3_server.client(), bucket)
    return bucket, v1, v2, before


def _publish_v2(proxy, bucket, v2):
    return run_cli(str(v2.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")


def _stored_manifest(s3_server, bucket) -> dict:
    return json.loads(s3_server.client().get_object(Bucket=bucket, Key="demo/manifest.json")["Body"].read())


def _assert_v1_intact(s3_server, bucket, v1, before) -> None:
    after = bucket_snapshot(s3_server.client(), bucket)
    for key, stored in before.items():  # every v1 object is still there, byte for byte
        assert after[key]["body"] == stored["body"], key
    assert _stored_manifest(s3_server, bucket) == v1.manifest
    assert_manifests_complete(s3_server.client(), bucket)


def _assert_rerun_completes(proxy, s3_server, bucket, v2) -> dict:
    summary = run_json(str(v2.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")
    assert _stored_manifest(s3_server, bucket) == v2.manifest
    assert_manifests_complete(s3_server.client(), bucket)
    loader = s3_server.client().get_object(Bucket=bucket, Key="demo/loader.js")["Body"].read()
    assert loader == (v2.root / "loader.js").read_bytes()
    return summary


def test_one_reset_is_retried_and_the_publish_succeeds(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    proxy.faults.append(fault := Fault("reset", match=is_upload, nth=2))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 0, result.output
    assert fault.fired == 1
    assert _stored_manifest(s3_server, bucket) == v2.manifest
    assert_manifests_complete(s3_server.client(), bucket)


def test_persistent_resets_fail_clearly_and_keep_the_previous_version(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    fp16 = v2.manifest["variants"]["fp16"]["model"]
    proxy.faults.append(Fault("reset", match=key_endswith(fp16), times=None))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert f"upload of s3://{bucket}/demo/{fp16} failed" not in result.stderr  # says what, not "failed" alone
    assert f"upload of s3://{bucket}/demo/{fp16}: the connection failed" in result.stderr
    assert "previously published version keeps working" in result.stderr
    assert "run the same command again" in result.stderr
    assert "Traceback" not in result.output
    _assert_v1_intact(s3_server, bucket, v1, before)
    proxy.faults.clear()
    summary = _assert_rerun_completes(proxy, s3_server, bucket, v2)
    assert any(obj["action"] == "skipped" and obj["key"].endswith(".onnx") for obj in summary["objects"])


@https_only
def test_transient_5xx_is_retried(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    proxy.faults.append(fault := Fault("status", match=is_upload, times=2, status=503, code="ServiceUnavailable"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 0, result.output
    assert fault.fired == 2
    assert _stored_manifest(s3_server, bucket) == v2.manifest


def test_persistent_5xx_on_a_part_fails_clearly_and_keeps_the_previous_version(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    fp32 = v2.manifest["variants"]["fp32"]["model"]
    part = lambda request: is_upload(request) and key_endswith(fp32)(request) and "partNumber=2" in request.query
    proxy.faults.append(Fault("status", match=part, times=None, status=500, code="InternalError"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert f"upload of s3://{bucket}/demo/{fp32}: server answered 500 InternalError" in result.stderr
    assert "after 3 attempts" in result.stderr  # AWS_MAX_ATTEMPTS=3 in the tests
    _assert_v1_intact(s3_server, bucket, v1, before)
    # s3transfer aborted the multipart upload: nothing half-uploaded is left behind
    assert s3_server.client().list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    proxy.faults.clear()
    _assert_rerun_completes(proxy, s3_server, bucket, v2)


@https_only
def test_501_for_an_unsupported_request_names_it(proxy, s3_server, published_v1):
    """R2 answers 501 NotImplemented to requests it does not support."""
    bucket, v1, v2, before = published_v1
    create_multipart = lambda request: request.method == "POST" and request.query.startswith("uploads")
    proxy.faults.append(Fault("status", match=create_multipart, times=None, status=501, code="NotImplemented"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert "server answered 501 NotImplemented" in result.stderr
    assert "does not support this request" in result.stderr
    assert "after" not in result.stderr.split("NotImplemented", 1)[1].split(";")[0]  # 501 is not retried
    _assert_v1_intact(s3_server, bucket, v1, before)


def test_server_gone_mid_upload_then_back(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    part = lambda request: is_upload(request) and "partNumber=" in request.query
    proxy.faults.append(Fault("down", match=part, nth=2))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert "cannot reach the endpoint" in result.stderr or "the connection failed" in result.stderr
    assert "previously published version keeps working" in result.stderr
    _assert_v1_intact(s3_server, bucket, v1, before)

    proxy.faults.clear()
    proxy.start()  # the server is back on the same address
    summary = _assert_rerun_completes(proxy, s3_server, bucket, v2)
    # the small files stored before the server went away were not sent again
    assert summary["skipped"] >= 3


@https_only
def test_failure_at_the_manifest_keeps_the_previous_manifest(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    proxy.faults.append(Fault("status", match=key_endswith("/manifest.json"), times=None, status=502, code="BadGateway"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert f"upload of s3://{bucket}/demo/manifest.json: server answered 502 BadGateway" in result.stderr
    assert "both name only objects that are present" in result.stderr
    _assert_v1_intact(s3_server, bucket, v1, before)
    # the new hashed files are all there already, so the next run only sends manifest and loader
    proxy.faults.clear()
    summary = _assert_rerun_completes(proxy, s3_server, bucket, v2)
    uploaded = sorted(obj["key"] for obj in summary["objects"] if obj["action"] == "uploaded")
    assert uploaded == ["demo/index.html", "demo/loader.js", "demo/manifest.json"]


@https_only
def test_failure_at_the_loader_leaves_a_complete_new_manifest(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    proxy.faults.append(Fault("status", match=key_endswith("/loader.js"), times=None, status=500))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert "loader.js may be the previous one" in result.stderr
    assert _stored_manifest(s3_server, bucket) == v2.manifest
    assert_manifests_complete(s3_server.client(), bucket)
    old_loader = s3_server.client().get_object(Bucket=bucket, Key="demo/loader.js")["Body"].read()
    assert old_loader == (v1.root / "loader.js").read_bytes()
    proxy.faults.clear()
    _assert_rerun_completes(proxy, s3_server, bucket, v2)


@https_only
def test_access_denied_on_upload_says_so(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    proxy.faults.append(Fault("status", match=is_upload, times=None, status=403, code="AccessDenied"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert "access denied" in result.stderr and "403 AccessDenied" in result.stderr
    _assert_v1_intact(s3_server, bucket, v1, before)


@https_only
def test_access_denied_on_the_bucket_stops_before_any_upload(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    bucket_level = lambda r: r.path.partition("?")[0] == f"/{bucket}"  # HeadBucket and ListObjectsV2
    proxy.faults.append(Fault("status", match=bucket_level, times=None, status=403, code="AccessDenied"))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2
    assert f"bucket s3://{bucket}/ at {proxy.url}: access denied" in result.stderr
    assert proxy.uploads() == []


@https_only
def test_a_token_refused_head_bucket_but_allowed_to_list_still_publishes(proxy, s3_server, published_v1):
    bucket, v1, v2, before = published_v1
    head_bucket = lambda r: r.method == "HEAD" and r.path == f"/{bucket}"
    proxy.faults.append(fault := Fault("status", match=head_bucket, times=None, status=403, code="AccessDenied"))
    _assert_rerun_completes(proxy, s3_server, bucket, v2)
    assert fault.fired == 1


@https_only
def test_prune_after_a_failed_publish_of_another_version_deletes_nothing_referenced(proxy, s3_server, published_v1):
    """A failed v2 leaves unreferenced v2 files; --prune with v1 removes them, never v1's files."""
    bucket, v1, v2, before = published_v1
    proxy.faults.append(Fault("status", match=key_endswith("/manifest.json"), times=None, status=500))
    assert _publish_v2(proxy, bucket, v2).exit_code == 2
    proxy.faults.clear()
    summary = run_json(str(v1.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--prune")
    deleted = {obj["key"] for obj in summary["objects"] if obj["action"] == "deleted"}
    assert deleted == {f"demo/{v2.manifest['variants'][v]['model']}" for v in ("fp16", "fp32")}
    assert set(bucket_snapshot(s3_server.client(), bucket)) == set(before)
    _assert_v1_intact(s3_server, bucket, v1, before)


@https_only
def test_failure_in_a_later_package_names_those_already_published(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    write_package(tmp_path / "dist", name="alpha")
    beta = write_package(tmp_path / "dist", name="beta")
    proxy.faults.append(Fault("status", match=key_endswith(f"beta/{beta.manifest['sample']['file']}"), times=None))
    result = run_cli(str(tmp_path / "dist"), "--bucket", bucket, "--endpoint-url", proxy.url)
    assert result.exit_code == 2
    assert "manifest.json of beta was not changed" in result.stderr
    assert "(already published in this run: alpha)" in result.stderr
    assert assert_manifests_complete(s3_server.client(), bucket) == ["alpha/manifest.json"]


@pytest.mark.parametrize("proxy", ["http"], indirect=True)
def test_interrupted_publish_keeps_the_previous_version(proxy, s3_server, published_v1):
    """Ctrl-C while a part is in flight: the process stops, v1 stays, a re-run completes."""
    bucket, v1, v2, before = published_v1
    part = lambda request: is_upload(request) and "partNumber=" in request.query
    proxy.faults.append(stall := Fault("stall", match=part))
    command = [sys.executable, "-c", "from pipeline.cli import app; app()", "publish", str(v2.root),
               "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5"]
    repo = Path(__file__).resolve().parent.parent
    child = interruptible(command, cwd=repo, env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while stall.fired == 0 and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.05)
        assert stall.fired == 1, "the upload never reached the stalled part"
        child.send_signal(signal.SIGINT)
        time.sleep(0.3)
        stall.release.set()  # the part in flight ends; nothing new may start
        _, stderr = child.communicate(timeout=60)
    finally:
        stall.release.set()
        if child.poll() is None:
            child.kill()
    assert child.returncode == 130  # the shell's code for SIGINT
    assert "interrupted: manifest.json of demo was not changed" in stderr
    assert "Traceback" not in stderr
    _assert_v1_intact(s3_server, bucket, v1, before)
    proxy.faults.clear()
    _assert_rerun_completes(proxy, s3_server, bucket, v2)


def test_an_upload_cut_mid_body_never_leaves_a_manifest_naming_a_partial_object_and_a_rerun_sends_only_what_is_missing(proxy, s3_server, published_v1):
    """The connection dies halfway through the body of one object, every time: the publish fails,
    the bucket serves v1 whole; a re-run stores the missing objects and sends nothing stored again."""
    bucket, v1, v2, before = published_v1
    fp16 = v2.manifest["variants"]["fp16"]["model"]
    single = lambda request: key_endswith(fp16)(request) and "partNumber=" not in request.query and request.body_size > 0
    multipart = lambda request: key_endswith(fp16)(request) and "partNumber=" in request.query
    proxy.faults.append(cut := Fault("cut", match=lambda r: single(r) or multipart(r), times=None))
    result = _publish_v2(proxy, bucket, v2)
    assert result.exit_code == 2, result.output
    assert cut.fired >= 1
    assert "previously published version keeps working" in result.stderr
    _assert_v1_intact(s3_server, bucket, v1, before)
    stored = set(bucket_snapshot(s3_server.client(), bucket))
    assert f"demo/{fp16}" not in stored  # no partial object under the name

    proxy.faults.clear()
    proxy.requests.clear()
    _assert_rerun_completes(proxy, s3_server, bucket, v2)
    sent = {request.path.partition("?")[0].removeprefix(f"/{bucket}/") for request in proxy.uploads()}
    hashed = {f"demo/{path}" for path, entry in v2.manifest["files"].items() if entry.get("cache", "immutable") == "immutable"}
    assert f"demo/{fp16}" in sent
    assert not (sent & hashed & stored), f"sent again although stored: {sorted(sent & hashed & stored)}"
