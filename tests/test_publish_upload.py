"""`pack publish` against a real S3 server (moto) on loopback, over http and over https."""

from __future__ import annotations

import hashlib
import io
import json
import time

import boto3
from botocore.config import Config
from publish_helpers import ACCESS_KEY, SECRET_KEY, assert_manifests_complete, bucket_snapshot, decoded_body, new_bucket, run_json, write_package

from pipeline.progress import Progress
from pipeline.http_headers import IMMUTABLE_CACHE, SHORT_CACHE
from pipeline.publish.upload_plan import plan_package
from pipeline.publish.publisher import publish
from pipeline.s3 import Target, make_client

MIB = 1024 * 1024


def _put_path(request) -> str:
    return request.path.partition("?")[0]


def test_first_publish_stores_every_object_with_its_headers(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    summary = run_json(str(package.root), "--bucket", bucket, "--prefix", "/models/", "--endpoint-url", proxy.url)

    snapshot = bucket_snapshot(s3_server.client(), bucket)
    expected = {f"models/demo/{path}" for path in [*package.manifest["files"], "manifest.json"]}
    assert set(snapshot) == expected  # exactly the listed files and the manifest; no .br keys
    for path, entry in package.manifest["files"].items():
        stored = snapshot[f"models/demo/{path}"]
        assert decoded_body(stored) == (package.root / path).read_bytes()
        assert stored["cache_control"] == (IMMUTABLE_CACHE if entry["cache"] == "immutable" else SHORT_CACHE)
        assert stored["metadata"]["sha256"] == entry["sha256"]
        # The stored encoding is exactly "br": never "br,aws-chunked" (what R2 rejects).
        assert stored["content_encoding"] == ("br" if entry["encodings"] else None)
        if entry["encodings"]:
            assert stored["body"] == (package.root / entry["encodings"]["br"]["path"]).read_bytes()
    wasm_key = next(key for key in snapshot if key.endswith(".wasm"))
    assert snapshot[wasm_key]["content_type"] == "application/wasm"
    assert "models/demo/report.json" not in snapshot  # the build's record: only with --with-report
    for name in ("manifest.json", "loader.js", "index.html", "demo.js"):
        stored = snapshot[f"models/demo/{name}"]
        assert stored["cache_control"] == SHORT_CACHE
        assert stored["body"] == (package.root / name).read_bytes()
        assert stored["metadata"]["sha256"] == hashlib.sha256(stored["body"]).hexdigest()

    assert summary["uploaded"] == len(expected) and summary["skipped"] == 0
    assert summary["bytes"] == sum(len(stored["body"]) for stored in snapshot.values())
    assert {obj["key"] for obj in summary["objects"]} == expected
    assert summary["loader_url"] == f"{proxy.url}/{bucket}/models/demo/loader.js"
    assert assert_manifests_complete(s3_server.client(), bucket) == ["models/demo/manifest.json"]


def test_uploads_go_hashed_files_then_manifest_then_loader_then_page(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist", incompressible_bytes=11 * MIB)
    run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")

    writes = [request for request in proxy.requests if request.method in ("PUT", "POST")]
    order = [_put_path(request).rsplit("/", 1)[-1] for request in writes]
    manifest_at = order.index("manifest.json")
    hashed_names = {path.rsplit("/", 1)[-1] for path, entry in package.manifest["files"].items() if entry["cache"] == "immutable"}
    assert set(order[:manifest_at]) == hashed_names  # every part and completion before the manifest
    # then the loader's other files (in either order), loader.js, and the page that imports it
    assert order[manifest_at + 1 :] == ["loader.d.ts", "loader.js", "demo.js", "index.html"]


def test_large_file_goes_multipart_in_equal_parts(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist", incompressible_bytes=12 * MIB)
    run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")

    big = package.manifest["variants"]["fp32"]["model"]
    parts = [r for r in proxy.uploads() if _put_path(r).endswith(big) and "uploadId=" in r.query]
    assert sorted(r.body_size for r in parts) == [2 * MIB, 5 * MIB, 5 * MIB]
    head = s3_server.client().head_object(Bucket=bucket, Key=f"demo/{big}")
    assert head["ETag"].strip('"').endswith("-3")  # a multipart ETag, not an MD5: why sha256 is in metadata
    assert head["Metadata"]["sha256"] == package.manifest["files"][big]["sha256"]
    assert head["CacheControl"] == IMMUTABLE_CACHE


def test_https_uploads_carry_no_aws_chunked_or_trailing_checksums(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist", incompressible_bytes=6 * MIB)
    run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")
    uploads = proxy.uploads()
    assert len(uploads) >= 8
    for request in uploads:
        assert "aws-chunked" not in request.headers.get("content-encoding", "")
        assert "x-amz-trailer" not in request.headers
        assert request.headers.get("x-amz-content-sha256") != "STREAMING-UNSIGNED-PAYLOAD-TRAILER"


def test_the_https_proxy_sees_the_upload_form_r2_rejects_from_a_default_client(s3_server, tls_files, tmp_path):
    """Control for the test above: a default boto3 client over https does send aws-chunked, so the
    https proxy is a faithful stand-in for what R2 receives."""
    from publish_helpers import FaultProxy

    front = FaultProxy(s3_server.port, tls=tls_files)
    try:
        bucket = new_bucket(s3_server)
        default = boto3.client(
            "s3",
            endpoint_url=front.url,
            region_name="us-east-1",
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            verify=str(tls_files[0]),
            config=Config(s3={"addressing_style": "path"}),
        )
        default.put_object(Bucket=bucket, Key="x.onnx", Body=b"abc" * 1000, ContentEncoding="br")
        (upload,) = front.uploads()
        assert "aws-chunked" in upload.headers.get("content-encoding", "") or "x-amz-trailer" in upload.headers
    finally:
        front.stop()


def test_republishing_an_unchanged_package_uploads_nothing(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist", incompressible_bytes=6 * MIB)
    args = (str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--part-size", "5")
    first = run_json(*args)
    before = len(proxy.uploads())
    again = run_json(*args)
    assert again["uploaded"] == 0 and again["bytes"] == 0
    assert again["skipped"] == first["uploaded"]
    assert len(proxy.uploads()) == before
    assert all(obj["action"] == "skipped" for obj in again["objects"])


def test_new_version_uploads_only_what_changed(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    v1 = write_package(tmp_path / "v1")
    v2 = write_package(tmp_path / "v2", version="v2")
    run_json(str(v1.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    summary = run_json(str(v2.root), "--bucket", bucket, "--endpoint-url", proxy.url)

    uploaded = {obj["key"].removeprefix("demo/") for obj in summary["objects"] if obj["action"] == "uploaded"}
    changed = {p for p in v2.manifest["files"] if p not in v1.manifest["files"]}
    assert changed == {v2.manifest["variants"]["fp16"]["model"], v2.manifest["variants"]["fp32"]["model"]}
    # loader.d.ts is the same in both versions: skipped like the runtime files and the sample
    assert uploaded == changed | {"manifest.json", "loader.js", "index.html"}
    manifest = json.loads(s3_server.client().get_object(Bucket=bucket, Key="demo/manifest.json")["Body"].read())
    assert manifest == v2.manifest
    assert_manifests_complete(s3_server.client(), bucket)


def test_an_object_with_stale_headers_is_uploaded_again(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    wasm = package.manifest["runtime"]["bundles"]["wasm"]["wasm"]
    admin = s3_server.client()
    admin.copy_object(  # same bytes and sha256, wrong type (as an older tool might have stored it)
        Bucket=bucket, Key=f"demo/{wasm}", CopySource={"Bucket": bucket, "Key": f"demo/{wasm}"},
        MetadataDirective="REPLACE", ContentType="application/octet-stream", ContentEncoding="br",
        CacheControl=IMMUTABLE_CACHE, Metadata=admin.head_object(Bucket=bucket, Key=f"demo/{wasm}")["Metadata"],
    )
    summary = run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    assert [obj["key"] for obj in summary["objects"] if obj["action"] == "uploaded"] == [f"demo/{wasm}"]
    assert admin.head_object(Bucket=bucket, Key=f"demo/{wasm}")["ContentType"] == "application/wasm"


def _object_heads(proxy, bucket: str) -> list[str]:
    """HeadObject requests the proxy has seen (HeadBucket is `HEAD /bucket`)."""
    return [r.path for r in proxy.requests if r.method == "HEAD" and r.path.partition("?")[0].startswith(f"/{bucket}/")]


def test_a_re_publish_from_the_same_machine_lists_instead_of_reading_each_object(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    args = (str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url)
    first = run_json(*args)
    objects = first["uploaded"]
    time.sleep(1.1)  # a HEAD answered in a later second than the objects' LastModified vouches for them
    run_json(*args)
    assert len(_object_heads(proxy, bucket)) == objects  # read once: what they hold is remembered
    again = run_json(*args)
    assert again["skipped"] == objects and again["uploaded"] == 0
    assert len(_object_heads(proxy, bucket)) == objects  # one listing, no HEAD per object

    # Another tool rewrites an object with the same bytes (same ETag) and a wrong type: its new
    # LastModified is no earlier than the remembered answer's second, so it is read and fixed.
    wasm = package.manifest["runtime"]["bundles"]["wasm"]["wasm"]
    admin = s3_server.client()
    admin.copy_object(
        Bucket=bucket, Key=f"demo/{wasm}", CopySource={"Bucket": bucket, "Key": f"demo/{wasm}"},
        MetadataDirective="REPLACE", ContentType="application/octet-stream", ContentEncoding="br",
        CacheControl=IMMUTABLE_CACHE, Metadata=admin.head_object(Bucket=bucket, Key=f"demo/{wasm}")["Metadata"],
    )
    fixed = run_json(*args)
    assert [obj["key"] for obj in fixed["objects"] if obj["action"] == "uploaded"] == [f"demo/{wasm}"]
    assert admin.head_object(Bucket=bucket, Key=f"demo/{wasm}")["ContentType"] == "application/wasm"


def test_a_listing_vouches_only_for_objects_unwritten_since_the_remembered_answer():
    from pipeline.publish.remembered import Headers, Listed, Memory, Seen

    headers = Headers("a" * 64, "b" * 64, "application/wasm", "br", IMMUTABLE_CACHE)
    memory = Memory(None, ["http://s3", "bucket", "demo/"], {"demo/x": Seen(etag='"e"', size=3, answered=100, headers=headers)})
    assert memory.headers("demo/x", Listed(size=3, etag='"e"', modified=99)) == headers
    assert memory.headers("demo/x", Listed(size=3, etag='"e"', modified=100)) is None  # a write in the answer's second
    assert memory.headers("demo/x", Listed(size=3, etag='"e"', modified=101)) is None  # written since
    assert memory.headers("demo/x", Listed(size=3, etag='"f"', modified=99)) is None
    assert memory.headers("demo/x", Listed(size=4, etag='"e"', modified=99)) is None
    assert memory.headers("demo/y", Listed(size=3, etag='"e"', modified=99)) is None


def test_dry_run_lists_the_plan_and_changes_nothing(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    package = write_package(tmp_path / "dist")
    summary = run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--dry-run", "--prune")
    assert summary["dry_run"] is True
    assert summary["uploaded"] == len(package.manifest["files"]) + 1
    assert {obj["action"] for obj in summary["objects"]} == {"would-upload"}
    assert [r for r in proxy.requests if r.method in ("PUT", "POST", "DELETE")] == []
    assert bucket_snapshot(s3_server.client(), bucket) == {}


def test_prune_removes_only_what_no_manifest_references(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    admin = s3_server.client()
    v1 = write_package(tmp_path / "v1")
    other = write_package(tmp_path / "v1", name="other")
    run_json(str(tmp_path / "v1"), "--bucket", bucket, "--prefix", "m", "--endpoint-url", proxy.url)
    admin.put_object(Bucket=bucket, Key="m/demo/notes.txt", Body=b"{}")  # stale, unreferenced
    admin.put_object(Bucket=bucket, Key="m/half/model.0123456789abcdef.onnx", Body=b"x")  # no manifest
    admin.put_object(Bucket=bucket, Key="site/index.html", Body=b"<html>")  # outside the prefix
    admin.put_object(Bucket=bucket, Key="m/readme.txt", Body=b"top level")  # not in a package folder

    v2 = write_package(tmp_path / "v2", version="v2")
    dry = run_json(str(v2.root), "--bucket", bucket, "--prefix", "m", "--endpoint-url", proxy.url, "--prune", "--dry-run")
    old_models = {f"m/demo/{v1.manifest['variants'][v]['model']}" for v in ("fp16", "fp32")}
    expected_deleted = old_models | {"m/demo/notes.txt"}
    assert {o["key"] for o in dry["objects"] if o["action"] == "would-delete"} == expected_deleted
    assert expected_deleted <= set(bucket_snapshot(admin, bucket))

    summary = run_json(str(v2.root), "--bucket", bucket, "--prefix", "m", "--endpoint-url", proxy.url, "--prune")
    assert {o["key"] for o in summary["objects"] if o["action"] == "deleted"} == expected_deleted
    assert summary["deleted"] == len(expected_deleted)
    remaining = set(bucket_snapshot(admin, bucket))
    assert not remaining & expected_deleted
    assert {"m/half/model.0123456789abcdef.onnx", "site/index.html", "m/readme.txt"} <= remaining
    assert {f"m/other/{p}" for p in other.manifest["files"]} <= remaining
    assert sorted(assert_manifests_complete(admin, bucket)) == ["m/demo/manifest.json", "m/other/manifest.json"]
    deletes = [r for r in proxy.requests if r.method == "POST" and "delete" in r.query]
    assert deletes and all("content-md5" in r.headers for r in deletes)  # servers that demand it


def test_cors_rule_is_set_and_other_rules_are_kept(proxy, s3_server, tmp_path):
    bucket = new_bucket(s3_server)
    admin = s3_server.client()
    theirs = {"ID": "theirs", "AllowedMethods": ["PUT"], "AllowedOrigins": ["https://upload.example"]}
    admin.put_bucket_cors(Bucket=bucket, CORSConfiguration={"CORSRules": [theirs]})
    package = write_package(tmp_path / "dist")
    args = ["--bucket", bucket, "--endpoint-url", proxy.url, "--cors", "https://app.example", "--cors", "http://localhost:5173"]
    summary = run_json(str(package.root), *args)
    rules = admin.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert summary["cors"] == rules
    ours = next(rule for rule in rules if rule.get("ID") == "pack-publish")
    assert ours["AllowedOrigins"] == ["https://app.example", "http://localhost:5173"]
    assert sorted(ours["AllowedMethods"]) == ["GET", "HEAD"]
    assert {"Content-Length", "Content-Encoding"} <= set(ours["ExposeHeaders"])
    assert any(rule.get("ID") == "theirs" for rule in rules)
    # Setting it again replaces our rule instead of adding a second one
    run_json(str(package.root), "--bucket", bucket, "--endpoint-url", proxy.url, "--cors", "https://new.example")
    rules = admin.get_bucket_cors(Bucket=bucket)["CORSRules"]
    assert [r["AllowedOrigins"] for r in rules if r.get("ID") == "pack-publish"] == [["https://new.example"]]
    assert len(rules) == 2


def test_large_uploads_show_a_byte_progress_bar(s3_server, aws_env, tmp_path):
    bucket = new_bucket(s3_server)
    plan = plan_package(write_package(tmp_path / "dist", incompressible_bytes=11 * MIB).root)
    target = Target(bucket=bucket, endpoint_url=s3_server.url)
    stream = io.StringIO()
    result = publish(make_client(target), target, [plan], part_size=5 * MIB, progress=Progress(enabled=True, stream=stream))
    final = stream.getvalue().rstrip("\n").splitlines()[-1]
    total_mb = f"{result.bytes / 1000 / 1000:.1f}"
    assert final.startswith("upload demo ") and " 100% " in final
    assert f" {total_mb}/{total_mb} MB " in final and "/s" in final  # amount and rate


def test_the_client_reads_botocore_models_as_botocore_does_and_parses_each_once(monkeypatch, tmp_path):
    """pack's model loader (no OrderedDict hook, a marshal copy in the cache) gives botocore's data."""
    import os

    import botocore.loaders

    from pipeline.cache import is_entry_record
    from pipeline import s3

    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    root = os.path.join(os.path.dirname(botocore.loaders.__file__), "data")
    reference = botocore.loaders.JSONFileLoader()
    for name in ("endpoints", "partitions", "s3/2006-03-01/service-2", "s3/2006-03-01/endpoint-rule-set-1"):
        path = os.path.join(root, name)
        parsed = s3._ModelFiles().load_file(path)
        assert parsed == reference.load_file(path)
        assert s3._ModelFiles().load_file(path) == parsed  # from the marshal copy
    assert len([p for p in (tmp_path / "cache" / "botocore-models").iterdir() if not is_entry_record(p)]) == 4
    assert s3._ModelFiles().load_file(os.path.join(root, "no-such-model")) is None

    # a model file that changes (another botocore) is parsed again
    own = tmp_path / "models" / "thing"
    own.parent.mkdir()
    own.with_suffix(".json").write_text('{"a": 1}')
    assert s3._ModelFiles().load_file(str(own)) == {"a": 1}
    own.with_suffix(".json").write_text('{"a": 22}')
    os.utime(own.with_suffix(".json"), ns=(1, 1))
    assert s3._ModelFiles().load_file(str(own)) == {"a": 22}

    loader = s3._Loader(file_loader=s3._ModelFiles())
    services = loader.list_available_services("service-2")
    assert "s3" in services and "sts" in services and "no-such-service" not in services and "../s3" not in services


def test_listing_follows_every_page():
    """ListObjectsV2 answers 1000 keys a page; the listing of a package folder reads them all."""
    import datetime

    from pipeline.publish.transfer import list_keys, list_objects

    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    pages = [
        {"Contents": [{"Key": "p/a", "Size": 1, "ETag": '"a"', "LastModified": when}], "IsTruncated": True, "NextContinuationToken": "t1"},
        {"Contents": [{"Key": "p/b", "Size": 2, "ETag": '"b"', "LastModified": when}], "IsTruncated": True, "NextContinuationToken": "t2"},
        {"Contents": [{"Key": "p/c", "Size": 3, "ETag": '"c"'}], "IsTruncated": False},
    ]
    asked = []

    class Client:
        def list_objects_v2(self, **kwargs):
            asked.append(kwargs.get("ContinuationToken"))
            return pages[len(asked) - 1]

    listed = list_objects(Client(), "bucket", "p/")
    assert asked == [None, "t1", "t2"]
    assert list(listed) == ["p/a", "p/b", "p/c"]
    assert listed["p/b"].etag == '"b"' and listed["p/b"].modified == int(when.timestamp())
    assert listed["p/c"].modified > 2**60  # no LastModified: never vouches for a remembered object
    asked.clear()
    assert list_keys(Client(), "bucket", "p/") == {"p/a": 1, "p/b": 2, "p/c": 3}
