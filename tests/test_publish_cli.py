"""`pack publish` options, environment variables, summaries and bad input, through the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.publish.upload_plan import plan_package
from pipeline.s3 import Target, make_client
from build_helpers import conv_model, save
from publish_helpers import ACCESS_KEY, SECRET_KEY, assert_manifests_complete, bucket_snapshot, decoded_body, isolate_aws_env, new_bucket, run_cli, run_json, write_package

http_only = pytest.mark.parametrize("proxy", ["http"], indirect=True)


@http_only
def test_options_come_from_environment_variables(proxy, s3_server, tmp_path, monkeypatch):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    monkeypatch.setenv("PACK_BUCKET", bucket)
    monkeypatch.setenv("PACK_PREFIX", "releases/v1")
    monkeypatch.setenv("PACK_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("PACK_REGION", "eu-west-1")
    monkeypatch.setenv("PACK_PUBLIC_URL", "https://cdn.example.com/")
    monkeypatch.setenv("PACK_NO_CHECK", "1")  # the CDN does not exist: nothing to check from the outside
    summary = run_json(str(package.root))
    assert summary["check"] is None
    assert summary["loader_url"] == "https://cdn.example.com/releases/v1/demo/loader.js"
    assert "releases/v1/demo/manifest.json" in bucket_snapshot(s3_server.client(), bucket)


@http_only
def test_without_dist_every_package_in_dist_is_published(proxy, s3_server, tmp_path, monkeypatch):
    bucket = new_bucket(s3_server)
    write_package(tmp_path / "dist", name="alpha")
    write_package(tmp_path / "dist", name="beta")
    monkeypatch.chdir(tmp_path)
    summary = run_json("--bucket", bucket, "--endpoint-url", proxy.url)
    assert summary["loader_url"] is None  # several packages: see loader_urls
    assert set(summary["loader_urls"]) == {"alpha", "beta"}
    assert summary["loader_urls"]["beta"] == f"{proxy.url}/{bucket}/beta/loader.js"
    assert sorted(assert_manifests_complete(s3_server.client(), bucket)) == ["alpha/manifest.json", "beta/manifest.json"]


@http_only
def test_human_summary_names_counts_bytes_time_and_loader_url(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    args = (str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    first = run_cli(*args)
    assert first.exit_code == 0, first.output
    objects = len(package.manifest["files"]) + 1  # the listed files and manifest.json
    assert f"uploaded {objects} objects" in first.stdout and "skipped 0 unchanged" in first.stdout
    assert " MB" in first.stdout and " s" in first.stdout
    assert f"demo: {proxy.url}/{bucket}/demo/loader.js" in first.stdout
    again = run_cli(*args)
    assert f"uploaded 0 objects (0.0 MB), skipped {objects} unchanged" in again.stdout


@http_only
def test_json_output_is_only_json_on_stdout(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--json")
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert {"uploaded", "skipped", "bytes", "objects", "loader_url"} <= set(summary)
    assert result.stderr == ""


@http_only
def test_cors_alone_sets_the_rule_without_packages(proxy, s3_server, tmp_path, monkeypatch):
    bucket = new_bucket(s3_server)
    monkeypatch.chdir(tmp_path)  # no dist/ here
    summary = run_json("--bucket", bucket, "--endpoint-url", proxy.url, "--cors", "https://app.example")
    assert summary["uploaded"] == 0 and summary["objects"] == []
    rules = s3_server.client().get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert rules[0]["AllowedOrigins"] == ["https://app.example"]
    puts = [r for r in proxy.requests if r.method == "PUT"]
    assert len(puts) == 1 and "content-md5" in puts[0].headers


@http_only
def test_profile_credentials_are_used(proxy, s3_server, tmp_path, monkeypatch):
    isolate_aws_env(monkeypatch, tmp_path)
    credentials = tmp_path / "credentials"
    credentials.write_text(f"[ci]\naws_access_key_id = {ACCESS_KEY}\naws_secret_access_key = {SECRET_KEY}\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    summary = run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--profile", "ci")
    assert summary["uploaded"] > 0
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--profile", "nope")
    assert result.exit_code == 2 and "AWS profile 'nope' not found" in result.stderr


# --- bad input: exit 2, one line, and not a single request -------------------------------------


def _assert_refused(result, message: str, proxy) -> None:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output


@http_only
def test_no_bucket(proxy, tmp_path):
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--endpoint-url", proxy.url)
    _assert_refused(result, "no bucket: pass --bucket NAME or set PACK_BUCKET", proxy)
    assert proxy.requests == []


@http_only
def test_bucket_that_does_not_exist(proxy, tmp_path):
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--bucket", "no-such-bucket-here", "--endpoint-url", proxy.url)
    _assert_refused(result, "s3://no-such-bucket-here/ at", proxy)
    assert "bucket not found" in result.stderr and "create it or fix --bucket" in result.stderr
    assert "server answered 404" in result.stderr and "404 404" not in result.stderr  # the status once (issue 28)
    assert proxy.uploads() == []


@http_only
def test_no_credentials(proxy, s3_server, tmp_path, monkeypatch):
    isolate_aws_env(monkeypatch, tmp_path)
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", proxy)
    assert proxy.requests == []


@http_only
def test_dist_that_is_not_a_package(proxy, s3_server, tmp_path):
    (tmp_path / "stuff").mkdir()
    (tmp_path / "stuff" / "model.onnx").write_bytes(b"x")
    result = run_cli(str(tmp_path / "stuff"), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, "not a package (no manifest.json", proxy)
    assert proxy.requests == []


@http_only
def test_no_dist_folder(proxy, s3_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run_cli("--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, "dist: not a directory", proxy)


@http_only
def test_a_broken_package_among_good_ones_uploads_nothing(proxy, s3_server, tmp_path):
    write_package(tmp_path / "dist", name="good")
    broken = write_package(tmp_path / "dist", name="broken")
    (broken.root / broken.manifest["sample"]["file"]).write_bytes(b"changed after build")
    result = run_cli(str(tmp_path / "dist"), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, "content differs from manifest.json", proxy)
    assert proxy.requests == []


@http_only
@pytest.mark.parametrize(
    "args, message",
    [
        (["--cors", "https://app.example/path"], "an origin is scheme://host[:port]"),
        (["--part-size", "4"], "parts of at least 5 MiB"),
    ],
)
def test_bad_options(proxy, s3_server, tmp_path, args, message):
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url, *args)
    _assert_refused(result, message, proxy)
    assert proxy.requests == []


# --- client settings ----------------------------------------------------------------------------


def test_r2_client_settings(aws_env):
    client = make_client(Target(bucket="b", endpoint_url="https://0123abcd.r2.cloudflarestorage.com"))
    config = client.meta.config
    assert client.meta.region_name == "auto"
    assert config.request_checksum_calculation == "when_required"
    assert config.response_checksum_validation == "when_required"
    assert config.signature_version == "s3v4"
    assert config.s3["addressing_style"] == "path"
    url = client.generate_presigned_url("get_object", Params={"Bucket": "b", "Key": "k"})
    assert "X-Amz-Algorithm=AWS4-HMAC-SHA256" in url  # SigV4, not SigV2


def test_public_urls():
    assert Target(bucket="b", prefix="p", region="eu-west-1").url("p/x/loader.js") == (
        "https://b.s3.eu-west-1.amazonaws.com/p/x/loader.js"
    )
    assert Target(bucket="a.b", region="eu-west-1").url("k.js") == "https://s3.eu-west-1.amazonaws.com/a.b/k.js"
    assert Target(bucket="b", public_url="https://cdn.example/").url("x/loader.js") == "https://cdn.example/x/loader.js"
    assert Target(bucket="b", endpoint_url="http://127.0.0.1:9000").url("x/a b.js") == "http://127.0.0.1:9000/b/x/a%20b.js"


# --- a package from the real `pack build` --------------------------------------------------------


@pytest.mark.parametrize("proxy", ["https"], indirect=True)
def test_publishes_a_package_built_by_pack_build(proxy, s3_server, tmp_path):
    model = save(conv_model(), tmp_path / "tiny-conv.onnx")
    built = CliRunner().invoke(app, ["build", str(model), "--no-browser", "--out", str(tmp_path / "dist")])
    assert built.exit_code == 0, built.output
    bucket = new_bucket(s3_server)
    summary = run_json("--bucket", bucket, "--endpoint-url", proxy.url, str(tmp_path / "dist"))
    manifest = json.loads((tmp_path / "dist" / "tiny-conv" / "manifest.json").read_text())
    snapshot = bucket_snapshot(s3_server.client(), bucket)
    assert assert_manifests_complete(s3_server.client(), bucket) == ["tiny-conv/manifest.json"]
    for path, entry in manifest["files"].items():
        stored = snapshot[f"tiny-conv/{path}"]
        assert stored["content_encoding"] == ("br" if entry["encodings"] else None)
        assert decoded_body(stored) == (tmp_path / "dist" / "tiny-conv" / path).read_bytes()
        if path.endswith(".wasm"):
            assert stored["content_type"] == "application/wasm"
    # exactly the listed files (demo.js among them) and the manifest; the build's reports stay home
    assert set(snapshot) == {f"tiny-conv/{path}" for path in [*manifest["files"], "manifest.json"]}
    assert {"demo.js", "index.html"} <= set(manifest["files"]) and "report.json" not in manifest["files"]
    assert (tmp_path / "dist" / "tiny-conv" / "report.json").is_file()
    assert summary["loader_url"].endswith(f"/{bucket}/tiny-conv/loader.js")
    again = run_json("--bucket", bucket, "--endpoint-url", proxy.url, str(tmp_path / "dist"))
    assert again["uploaded"] == 0


def test_aws_region_from_the_environment_is_used(aws_env, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "ap-southeast-2")
    assert make_client(Target(bucket="b")).meta.region_name == "ap-southeast-2"
    assert make_client(Target(bucket="b", region="eu-west-1")).meta.region_name == "eu-west-1"


# --- what may be published: the verification gate and the file list ------------------------------

FAILED_VERIFICATION = {
    "browser": True,
    "passed": False,
    "runs": [
        {"stage": "browser", "bundle": "wasm", "ep": "wasm", "variant": "fp32", "status": "failed", "detail": "y: rel_l2 0.2 > 0.001"},
        {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "failed", "detail": "y: max_abs_of_range 0.05 > 0.01"},
    ],
}


@http_only
def test_a_package_that_failed_verification_is_refused_naming_the_checks(proxy, s3_server, tmp_path):
    package = write_package(tmp_path / "dist", verification=FAILED_VERIFICATION)
    result = run_cli(str(package.root), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, "verification failed, not publishing demo", proxy)
    line = result.stderr
    assert "browser fp32 (wasm bundle, wasm): failed: y: rel_l2 0.2 > 0.001" in line
    assert "host fp16 (any bundle, any EP): failed: y: max_abs_of_range 0.05 > 0.01" in line
    assert "--allow-failed" in line
    assert proxy.requests == []


@http_only
def test_allow_failed_publishes_with_a_warning_per_failed_check(proxy, s3_server, tmp_path, monkeypatch):
    package = write_package(tmp_path / "dist", verification=FAILED_VERIFICATION)
    bucket = new_bucket(s3_server)
    monkeypatch.setenv("PACK_ALLOW_FAILED", "1")
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--json")
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 2 and all("despite a failed check (--allow-failed)" in w for w in warnings)
    summary = json.loads(result.stdout)
    assert summary["warnings"] == [w.removeprefix("warning: ") for w in warnings]
    assert "demo/manifest.json" in bucket_snapshot(s3_server.client(), bucket)


@http_only
def test_a_package_built_without_browser_checks_is_published_with_a_warning(proxy, s3_server, tmp_path):
    unverified = {"browser": False, "passed": True, "runs": [{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp32", "status": "passed"}]}
    package = write_package(tmp_path / "dist", verification=unverified)
    result = run_cli(str(package.root), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning: ") == 1 and "never verified in a browser (built with --no-browser)" in result.stderr


@http_only
def test_a_file_the_manifest_does_not_list_is_not_uploaded_and_named(proxy, s3_server, tmp_path):
    package = write_package(tmp_path / "dist")
    (package.root / "secrets.env").write_text("TOKEN=x\n")
    bucket = new_bucket(s3_server)
    result = run_cli(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    assert result.exit_code == 0, result.output
    assert f"warning: {package.root / 'secrets.env'}: not listed in manifest.json, not uploaded" in result.stderr
    assert "demo/secrets.env" not in bucket_snapshot(s3_server.client(), bucket)


@http_only
def test_a_listed_file_missing_on_disk_is_an_error_naming_it(proxy, s3_server, tmp_path):
    package = write_package(tmp_path / "dist")
    (package.root / "demo.js").unlink()
    result = run_cli(str(package.root), "--bucket", new_bucket(s3_server), "--endpoint-url", proxy.url)
    _assert_refused(result, f"{package.root / 'demo.js'}: listed in manifest.json but missing", proxy)
    assert proxy.requests == []


# --- --dry-run without a bucket to ask --------------------------------------------------------------


def test_dry_run_without_credentials_prints_the_local_plan(tmp_path, monkeypatch):
    isolate_aws_env(monkeypatch, tmp_path)
    package = write_package(tmp_path / "dist")
    result = run_cli(str(package.root), "--bucket", "b", "--dry-run")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "dry run, nothing changed: local plan, in upload order"
    planned = [line.split()[1] for line in lines[1:-2]]
    expected = plan_package(package.root)
    assert planned == [f"demo/{obj.path}" for obj in expected.objects]
    assert planned.index("demo/manifest.json") < planned.index("demo/loader.js") < planned.index("demo/demo.js") < planned.index("demo/index.html")
    wasm = next(line for line in lines if ".wasm" in line)
    assert "application/wasm" in wasm and "immutable" in wasm and " B " in wasm
    assert "Content-Encoding: br" in next(line for line in lines if "model.fp16" in line)
    assert "max-age=60" in next(line for line in lines if "demo/index.html" in line)
    total = sum(obj.size for obj in expected.objects)
    assert lines[-2] == f"would upload at most {len(expected.objects)} objects ({total / 1e6:.1f} MB)"
    assert lines[-1].startswith("not checked remotely: which objects already exist (they would be skipped): no credentials")
    assert result.stderr == ""


def test_dry_run_without_a_bucket_or_reachable_server_still_plans(tmp_path, monkeypatch, aws_env):
    package = write_package(tmp_path / "dist")
    summary = run_json(str(package.root), "--dry-run")
    assert summary["remote_unchecked"].startswith("no bucket given")
    assert summary["uploaded"] == len(package.manifest["files"]) + 1 and summary["loader_urls"] == {}
    # a server that is not there (nothing listens on port 9 of loopback)
    result = run_cli(str(package.root), "--bucket", "b", "--endpoint-url", "http://127.0.0.1:9", "--dry-run", "--prune")
    assert result.exit_code == 0, result.output
    assert "not checked remotely: which objects already exist (they would be skipped), which objects --prune would delete: " in result.stdout
    assert "cannot reach the endpoint" in result.stdout
    # without --dry-run the same is an error
    refused = run_cli(str(package.root), "--bucket", "b", "--endpoint-url", "http://127.0.0.1:9")
    assert refused.exit_code == 2 and refused.stderr.startswith("error: ") and "cannot reach the endpoint" in refused.stderr


@http_only
def test_an_unchanged_publish_imports_only_what_it_uses(proxy, s3_server, tmp_path):
    """Start-up is most of an unchanged re-publish: no s3transfer (nothing to upload), no rich
    (nothing drawn under --json), no pydantic (typer below 0.29 needs none)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    args = [str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--json"]
    run_json(*args[:-1])
    report = "import atexit, sys; atexit.register(lambda: print(sorted(m for m in ('s3transfer', 'rich', 'pydantic') if m in sys.modules), file=sys.stderr))"
    command = [sys.executable, "-c", f"{report}\nfrom pipeline.cli import app; app()", "publish", *args]
    done = subprocess.run(command, cwd=Path(__file__).resolve().parent.parent, env=dict(os.environ), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["uploaded"] == 0
    assert done.stderr.strip().splitlines()[-1] == "[]"
