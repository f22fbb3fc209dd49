"""`pack publish` ends with a check from the outside: anonymous GETs of the public URL with an
Origin header, against moto's S3 (which enforces bucket policies and CORS rules like S3)."""

from __future__ import annotations

import json

from pipeline.publish.check import PROBE_ORIGIN, check_origins, check_package
from pipeline.publish.upload_plan import plan_package
from pipeline.s3 import Target
from publish_helpers import new_bucket, run_cli, write_package

APP = "https://app.example.com"


def publish_json(*args: str):
    result = run_cli(*args, "--json")
    return result, json.loads(result.stdout)


def test_public_bucket_with_cors_passes_and_says_what_it_fetched(s3_server, aws_env, tmp_path):
    package = write_package(tmp_path / "dist")
    bucket = new_bucket(s3_server)
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--cors", APP)
    assert result.exit_code == 0, result.output
    assert "check demo: passed" in result.stdout
    base = f"{s3_server.url}/{bucket}/demo/"
    checked = [line for line in result.stdout.splitlines() if line.startswith("  ok   ")]
    # the manifest and the smallest hashed file with a br copy (Content-Encoding seen), each from the app's origin
    encoded = sorted((entry["encodings"]["br"]["size"], path) for path, entry in package.manifest["files"].items() if entry["encodings"])
    assert [line.split(": 200")[0] for line in checked] == [f"  ok   {base}manifest.json", f"  ok   {base}{encoded[0][1]}"]
    assert "Content-Encoding br" in checked[1] and "sha256 matches" in checked[1] and f"Origin {APP} allowed" in checked[1]

    again, summary = publish_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--cors", APP)
    assert again.exit_code == 0 and summary["uploaded"] == 0
    assert summary["check"][0]["status"] == "passed" and summary["errors"] == [] and summary["warnings"] == []


def test_private_bucket_fails_naming_the_bucket_policy(s3_server, aws_env, tmp_path):
    package = write_package(tmp_path / "dist")
    bucket = new_bucket(s3_server, public=False)
    result, summary = publish_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url)
    assert result.exit_code == 1
    assert summary["uploaded"] > 0 and summary["check"][0]["status"] == "failed"
    errors = summary["errors"]
    assert errors and all(" 403 to an anonymous GET: the bucket is not public" in error for error in errors)
    assert f"arn:aws:s3:::{bucket}/*" in errors[0] and "bucket policy" in errors[0] and "--public-url" in errors[0]
    assert f"error: {errors[0]}" in result.stderr.splitlines()

    skipped, summary = publish_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--no-check")
    assert skipped.exit_code == 0 and summary["check"] is None and summary["errors"] == []


def test_wrong_cors_origin_fails_naming_the_cors_option(s3_server, aws_env, tmp_path):
    package = write_package(tmp_path / "dist")
    bucket = new_bucket(s3_server)
    rule = {"AllowedOrigins": ["https://old.example.com"], "AllowedMethods": ["GET"], "AllowedHeaders": ["*"]}
    s3_server.client().put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [rule]})
    result, summary = publish_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--check-origin", APP)
    assert result.exit_code == 1, result.output
    assert summary["check"][0]["status"] == "failed" and len(summary["errors"]) == 2  # manifest and hashed file
    assert all(f"no Access-Control-Allow-Origin for Origin {APP}" in error and f"pass --cors {APP}" in error for error in summary["errors"])

    # the fix the error names works
    fixed, summary = publish_json(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--cors", APP, "--check-origin", APP)
    assert fixed.exit_code == 0, fixed.output
    assert summary["check"][0]["status"] == "passed"


def test_no_app_origin_notes_same_origin_only(s3_server, aws_env, tmp_path):
    package = write_package(tmp_path / "dist")
    bucket = new_bucket(s3_server)
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url)
    assert result.exit_code == 0, result.output
    assert f"note: no Access-Control-Allow-Origin for another origin ({PROBE_ORIGIN}): only pages served from {s3_server.url} can load demo" in result.stdout


def test_a_changed_object_fails_on_its_sha256(s3_server, aws_env, tmp_path):
    package = write_package(tmp_path / "dist")
    bucket = new_bucket(s3_server)
    assert run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", s3_server.url, "--json").exit_code == 0
    plan = plan_package(package.root)
    probed = min((obj for obj in plan.objects if obj.content_encoding), key=lambda obj: obj.size).path
    s3_server.client().put_object(Bucket=bucket, Key=f"demo/{probed}", Body=b"other bytes")
    target = Target(bucket=bucket, endpoint_url=s3_server.url)
    check = check_package(target, plan, *check_origins([], []))
    assert check.status == "failed"
    assert check.errors == [f"{s3_server.url}/{bucket}/demo/{probed}: body decodes to sha256 {_sha(b'other bytes')[:16]}…, manifest.json says {package.manifest['files'][probed]['sha256'][:16]}…; publish again, and check --public-url points at this bucket"]


def test_r2_without_public_url_is_not_verifiable(tmp_path):
    package = write_package(tmp_path / "dist")
    target = Target(bucket="models", endpoint_url="https://0123.r2.cloudflarestorage.com")
    check = check_package(target, plan_package(package.root), *check_origins([APP], []))
    assert check.status == "not-verifiable" and "R2 API endpoint is never public" in check.warnings[0] and "--public-url" in check.warnings[0]


def test_check_origins():
    assert check_origins([], []) == ([PROBE_ORIGIN], False)
    assert check_origins(["*"], []) == ([PROBE_ORIGIN], True)
    assert check_origins([APP, "*"], ["https://b.example"]) == (["https://b.example"], True)


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
