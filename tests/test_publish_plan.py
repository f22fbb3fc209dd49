"""What `pack publish` would upload from a package, and the packages it refuses before any request."""

from __future__ import annotations

import hashlib
import json

import brotli
import pytest
from publish_helpers import write_package

from pipeline.errors import PackError
from pipeline.http_headers import IMMUTABLE_CACHE, SHORT_CACHE
from pipeline.publish.upload_plan import Stage, find_packages, plan_package


def test_plan_lists_one_object_per_decoded_name_with_headers(tmp_path):
    package = write_package(tmp_path / "dist")
    plan = plan_package(package.root)
    by_path = {obj.path: obj for obj in plan.objects}

    # exactly the manifest's list, and the manifest itself
    assert set(by_path) == set(package.manifest["files"]) | {"manifest.json"}
    assert {"loader.js", "loader.d.ts", "index.html", "demo.js"} <= set(by_path)
    assert not any(path.endswith(".br") for path in by_path)
    # the build's record is in the folder, but neither listed nor planned nor warned about
    assert (package.root / "report.json").is_file() and "report.json" not in by_path
    assert plan.unlisted == ()

    for path, entry in package.manifest["files"].items():
        obj = by_path[path]
        assert obj.sha256 == entry["sha256"]
        assert obj.cache_control == (IMMUTABLE_CACHE if entry["cache"] == "immutable" else SHORT_CACHE)
        assert (obj.stage is Stage.HASHED) == (entry["cache"] == "immutable")
        if entry["encodings"]:
            assert obj.content_encoding == "br"
            assert obj.source.name == path.rsplit("/", 1)[-1] + ".br"
            assert brotli.decompress(obj.source.read_bytes()) == package.hashed[path]
            assert obj.metadata == {"sha256": entry["sha256"], "body-sha256": obj.body_sha256}
        else:
            assert obj.content_encoding is None
            assert obj.metadata == {"sha256": entry["sha256"]}

    wasm = next(obj for obj in plan.objects if obj.path.endswith(".wasm"))
    module = next(obj for obj in plan.objects if obj.path.endswith(".mjs"))
    assert wasm.content_type == "application/wasm"
    assert module.content_type.startswith("text/javascript")
    assert by_path["manifest.json"].content_type == "application/json"
    assert by_path["index.html"].content_type.startswith("text/html")
    for name in ("manifest.json", "loader.js", "loader.d.ts", "index.html", "demo.js"):
        assert by_path[name].cache_control == SHORT_CACHE


def test_plan_orders_hashed_then_manifest_then_loader_then_page(tmp_path):
    plan = plan_package(write_package(tmp_path / "dist").root)
    stages = [obj.stage for obj in plan.objects]
    assert stages == sorted(stages)
    first_manifest = stages.index(Stage.MANIFEST)
    assert all(stage is Stage.HASHED for stage in stages[:first_manifest])
    # a file before every file that imports it: the loader's other files, loader.js, demo.js, index.html
    assert [obj.path for obj in plan.objects if obj.stage is Stage.SUPPORT] == ["loader.d.ts"]
    assert [obj.path for obj in plan.objects if obj.stage is Stage.LOADER] == ["loader.js"]
    assert [obj.path for obj in plan.objects if obj.stage is Stage.DEMO] == ["demo.js"]
    assert [obj.path for obj in plan.objects if obj.stage is Stage.PAGE] == ["index.html"]


def test_find_packages_takes_a_package_or_a_folder_of_packages(tmp_path):
    first = write_package(tmp_path / "dist", name="alpha")
    second = write_package(tmp_path / "dist", name="beta")
    (tmp_path / "dist" / "not-a-package").mkdir()
    assert find_packages(tmp_path / "dist") == [first.root, second.root]
    assert find_packages(first.root) == [first.root]


def test_a_folder_without_manifest_is_not_a_package(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match="not a package"):
        find_packages(tmp_path / "empty")
    with pytest.raises(PackError, match="not a directory"):
        find_packages(tmp_path / "missing")


def _rewrite_manifest(package, change) -> None:
    manifest = json.loads((package.root / "manifest.json").read_text())
    change(manifest)
    (package.root / "manifest.json").write_text(json.dumps(manifest))


def test_missing_listed_file_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    path = package.manifest["variants"]["fp32"]["model"]
    (package.root / path).unlink()
    with pytest.raises(PackError, match=f"{path.replace('.', '[.]')}: listed in manifest.json but missing"):
        plan_package(package.root)


def test_file_changed_after_build_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    path = package.manifest["sample"]["file"]
    (package.root / path).write_bytes(b"\x00" * 16)
    with pytest.raises(PackError, match="content differs from manifest.json"):
        plan_package(package.root)


def test_brotli_copy_that_does_not_decode_to_the_file_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    path = package.manifest["variants"]["fp16"]["model"]
    entry = package.manifest["files"][path]
    wrong = brotli.compress(b"something else")
    (package.root / entry["encodings"]["br"]["path"]).write_bytes(wrong)
    _rewrite_manifest(package, lambda m: m["files"][path]["encodings"]["br"].update(size=len(wrong)))
    with pytest.raises(PackError, match="does not decode to"):
        plan_package(package.root)


def test_hashed_name_that_does_not_match_content_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    path = package.manifest["sample"]["file"]
    data = b"new sample bytes"
    (package.root / path).write_bytes(data)
    _rewrite_manifest(
        package,
        lambda m: m["files"][path].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data)),
    )
    with pytest.raises(PackError, match="name says content hash"):
        plan_package(package.root)


def test_reference_missing_from_files_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    module = package.manifest["runtime"]["bundles"]["wasm"]["module"]
    _rewrite_manifest(package, lambda m: m["files"].pop(module))
    with pytest.raises(PackError, match="key \"runtime.bundles.wasm.module\": .* is not listed in 'files'"):
        plan_package(package.root)


@pytest.mark.parametrize("bad", ["../outside.bin", "/etc/passwd", "a/./b.bin", "a\\b.bin"])
def test_paths_outside_the_package_are_refused(tmp_path, bad):
    package = write_package(tmp_path / "dist")
    _rewrite_manifest(package, lambda m: m["files"].update({bad: {"sha256": "0" * 64, "size": 1}}))
    with pytest.raises(PackError, match="not a plain relative path"):
        plan_package(package.root)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda m: m.update(schema=1), 'key "schema": 1 is not 2; rebuild the package'),
        (lambda m: m.update(name="../x"), "key \"name\": '../x': must be letters, digits"),
        (lambda m: m.update(files=[]), 'key "files": .* is not of type'),
        (lambda m: m["files"]["loader.js"].pop("cache"), 'key "files\\["loader.js"\\].cache": missing'),
        (lambda m: m["verification"].update(runs=[{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "failed"}]), 'key "verification.runs\\[0\\]'),
    ],
)
def test_malformed_manifest_is_refused(tmp_path, change, message):
    package = write_package(tmp_path / "dist")
    _rewrite_manifest(package, change)
    with pytest.raises(PackError, match=message):
        plan_package(package.root)


def test_manifest_that_is_not_json_is_refused(tmp_path):
    package = write_package(tmp_path / "dist")
    (package.root / "manifest.json").write_text("{not json")
    with pytest.raises(PackError, match="not valid JSON"):
        plan_package(package.root)


@pytest.mark.parametrize("name", ["loader.js", "demo.js", "index.html"])
def test_missing_listed_plain_file_is_refused(tmp_path, name):
    package = write_package(tmp_path / "dist")
    (package.root / name).unlink()
    with pytest.raises(PackError, match=f"{name.replace('.', '[.]')}: listed in manifest.json but missing"):
        plan_package(package.root)


def test_files_the_manifest_does_not_list_are_not_planned(tmp_path):
    package = write_package(tmp_path / "dist")
    (package.root / "notes.txt").write_text("private")
    (package.root / "ort" / "extra.mjs").write_text("export {};")
    plan = plan_package(package.root)
    assert plan.unlisted == ("notes.txt", "ort/extra.mjs")
    assert not {"notes.txt", "ort/extra.mjs"} & plan.paths


def test_immutable_cache_needs_a_hashed_name(tmp_path):
    package = write_package(tmp_path / "dist")
    _rewrite_manifest(package, lambda m: m["files"]["loader.js"].update(cache="immutable"))
    with pytest.raises(PackError, match="cache 'immutable' but the name carries no content hash"):
        plan_package(package.root)
