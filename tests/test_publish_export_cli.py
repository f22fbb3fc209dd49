"""`pack export`: the app copy of a package holds only what a static host serves, with a manifest
that stays valid for what was kept."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.manifest import read_manifest
from pipeline.publish.upload_plan import plan_package
from publish_helpers import write_package

runner = CliRunner()


def export(*args: str):
    return runner.invoke(app, ["export", *args])


def on_disk(folder):
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())


def test_export_keeps_what_the_loader_fetches_with_br_copies(tmp_path):
    package = write_package(tmp_path / "dist")
    app_copy = tmp_path / "web" / "public" / "demo"
    result = export(str(package.root), str(app_copy), "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    source = package.manifest["files"]
    kept = [path for path in source if path not in ("report.json", "index.html", "demo.js")]
    copies = [source[path]["encodings"]["br"]["path"] for path in kept if source[path]["encodings"]]
    assert on_disk(app_copy) == sorted([*kept, *copies, "manifest.json"])
    assert sorted(f["path"] for f in summary["files"]) == on_disk(app_copy) and summary["bytes"] == sum((app_copy / f["path"]).stat().st_size for f in summary["files"])
    manifest = read_manifest(app_copy)  # validated
    assert manifest["files"] == {path: source[path] for path in kept}
    plan_package(app_copy)  # every file matches its sha256, every .br decodes to its file: publishable as is
    for path in kept:
        assert (app_copy / path).read_bytes() == (package.root / path).read_bytes()


def test_export_one_variant_without_br(tmp_path):
    package = write_package(tmp_path / "dist")
    app_copy = tmp_path / "app"
    result = export(str(package.root), str(app_copy), "--variants", "fp32", "--no-br")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"exported demo to {app_copy}: ") and "(variants fp32; no .br copies)" in result.output
    manifest = read_manifest(app_copy)
    assert list(manifest["variants"]) == ["fp32"] and manifest["variantFor"] == {"webgpu": ["fp32"], "wasm": ["fp32"]}
    assert all(entry["encodings"] == {} for entry in manifest["files"].values())
    files = on_disk(app_copy)
    assert not [path for path in files if path.endswith(".br")]
    assert package.manifest["variants"]["fp16"]["model"] not in files and manifest["variants"]["fp32"]["model"] in files
    plan_package(app_copy)

    # an earlier export is replaced whole
    again = export(str(package.root), str(app_copy))
    assert again.exit_code == 0, again.output
    assert package.manifest["variants"]["fp16"]["model"] in on_disk(app_copy) and any(path.endswith(".br") for path in on_disk(app_copy))


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
