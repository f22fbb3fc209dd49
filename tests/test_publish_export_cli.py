"""`pack export`: the app copy of a package holds only what a static host serves, with a manifest
that stays valid for what was kept."""

from __future__ import annotations

import json

import brotli
import pytest
from typer.testing import CliRunner

from pipeline.assets.files import describe_file
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.manifest import read_manifest, write_manifest
from pipeline.publish.upload_plan import plan_package
from pipeline.web.npm import PACKAGE_JSON, package_json
from publish_helpers import write_package

runner = CliRunner()


def export(*args: str):
    return runner.invoke(app, ["export", *args])


def on_disk(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def with_package_json(package):
    """The test package plus the npm package.json the build writes (it lists the demo page and every decoded file)."""
    (package.root / PACKAGE_JSON).write_bytes(package_json(package.manifest, ["index.html", "demo.js", "loader.js", "loader.d.ts"]))
    package.manifest["files"][PACKAGE_JSON] = describe_file(package.root, PACKAGE_JSON).manifest_entry()
    write_manifest(package.root, package.manifest)
    return package


def test_export_keeps_one_body_per_file_the_br_body_where_there_is_one_by_default(tmp_path):
    """The .br body alone: a brotli host serves it under X, and on a plain host the loader fetches
    X.br and decodes it (tests/js/brotli.test.mjs, tests/test_assets_chunks_browser.py)."""
    package = with_package_json(write_package(tmp_path / "dist"))
    app_copy = tmp_path / "web" / "public" / "demo"
    result = export(str(package.root), str(app_copy), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["bodies"] == "br"
    source = package.manifest["files"]
    kept = [path for path in source if path not in ("report.json", "index.html", "demo.js")]
    bodies = [source[path]["encodings"]["br"]["path"] if source[path]["encodings"] else path for path in kept]
    assert any(body.endswith(".br") for body in bodies) and any(not body.endswith(".br") for body in bodies)
    assert on_disk(app_copy) == sorted([*bodies, "manifest.json"])
    assert sorted(f["path"] for f in summary["files"]) == on_disk(app_copy) and summary["bytes"] == sum((app_copy / f["path"]).stat().st_size for f in summary["files"])
    manifest = read_manifest(app_copy)  # validated
    for path in kept:
        expected = dict(source[path], stored="br") if source[path]["encodings"] else source[path]
        assert path == PACKAGE_JSON or manifest["files"][path] == expected, path
    # package.json lists exactly what the copy holds (no demo page, the .br bodies by their names)
    assert json.loads((app_copy / PACKAGE_JSON).read_text())["files"] == on_disk(app_copy)
    plan = plan_package(app_copy)  # every .br body decodes to its listed sha256: publishable as is
    assert {obj.path for obj in plan.objects if obj.content_encoding == "br"} == {path for path in kept if source[path]["encodings"]}
    for path, body in zip(kept, bodies):
        if body == path and path != PACKAGE_JSON:
            assert (app_copy / path).read_bytes() == (package.root / path).read_bytes()

    # a .br body that no longer decodes to its file is caught like a changed file
    broken = next(body for body in bodies if body.endswith(".br"))
    size = (app_copy / broken).stat().st_size
    (app_copy / broken).write_bytes(brotli.compress(bytes(range(256)) * 64, quality=0)[:size].ljust(size, b"\0"))
    with pytest.raises(PackError, match=f"{broken}: does not decode to"):
        plan_package(app_copy)


def test_export_raw_bodies_on_request(tmp_path):
    package = with_package_json(write_package(tmp_path / "dist"))
    app_copy = tmp_path / "app"
    result = export(str(package.root), str(app_copy), "--variants", "fp32", "--bodies", "raw")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"exported demo to {app_copy}: ") and "(variants fp32; decoded bodies: any static host serves them)" in result.output
    manifest = read_manifest(app_copy)
    assert list(manifest["variants"]) == ["fp32"] and manifest["variantFor"] == {"webgpu": ["fp32"], "wasm": ["fp32"]}
    assert all(entry["encodings"] == {} and "stored" not in entry for entry in manifest["files"].values())
    files = on_disk(app_copy)
    assert not [path for path in files if path.endswith(".br")]
    assert package.manifest["variants"]["fp16"]["model"] not in files and manifest["variants"]["fp32"]["model"] in files
    assert json.loads((app_copy / PACKAGE_JSON).read_text())["files"] == files
    plan_package(app_copy)

    # an earlier export is replaced whole
    again = export(str(package.root), str(app_copy), "--bodies", "br")
    assert again.exit_code == 0, again.output
    encoded = sum(bool(entry["encodings"]) for path, entry in package.manifest["files"].items())
    assert f"{encoded} .br bodies: a host with Content-Encoding: br for X.br sends them as they are, and on any other static host the loader decodes them itself" in again.output
    assert package.manifest["variants"]["fp16"]["model"] + ".br" in on_disk(app_copy)
    assert manifest["variants"]["fp32"]["model"] not in on_disk(app_copy)

    wrong = export(str(package.root), str(tmp_path / "other"), "--bodies", "gzip")
    assert wrong.exit_code == 2 and "--bodies" in wrong.output and not (tmp_path / "other").exists()


def test_export_errors_exit_2_naming_the_variant_and_write_nothing(tmp_path):
    package = write_package(tmp_path / "dist")
    app_copy = tmp_path / "app"
    cases = [
        (["--variants", "int8"], f"error: --variants: {package.root / 'manifest.json'} has no variant 'int8' (it has fp16, fp32)"),
        # every platform runs wasm only, and wasm runs fp32
        (["--variants", "fp16"], "error: --variants fp16: platform 'desktop' (chain wasm) would keep no variant it can run; add fp32 to --variants"),
        (["--variants", " , "], "error: --variants ' , ': name at least one variant"),
    ]
    for options, message in cases:
        result = export(str(package.root), str(app_copy), *options)
        assert result.exit_code == 2 and result.output.startswith(message), result.output
        assert len(result.output.strip().splitlines()) == 1
        assert not app_copy.exists() and [p.name for p in tmp_path.iterdir()] == ["dist"]

    own_files = tmp_path / "site"
    (own_files / "index.html").parent.mkdir()
    (own_files / "index.html").write_text("<!doctype html>")
    result = export(str(package.root), str(own_files))
    assert result.exit_code == 2 and "not empty and not an earlier export" in result.output
    assert on_disk(own_files) == ["index.html"]
    inside = export(str(package.root), str(package.root / "copy"))
    assert inside.exit_code == 2 and "lies inside the package" in inside.output

    (package.root / package.manifest["sample"]["file"]).write_bytes(b"changed")
    changed = export(str(package.root), str(app_copy))
    assert changed.exit_code == 2 and "content differs from manifest.json" in changed.output and not app_copy.exists()
