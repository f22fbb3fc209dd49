"""Package and visit sizes from a manifest (pipeline/assets/delivery.py), with the measured choice's trials."""

from __future__ import annotations

import copy

from pipeline.assets.delivery import delivery_lines, delivery_sizes
from publish_helpers import write_package


def test_first_visit_per_chain_and_the_trials_of_the_measured_choice(tmp_path):
    package = write_package(tmp_path / "dist")
    manifest = copy.deepcopy(package.manifest)
    manifest["runtime"]["bundles"]["webgpu"] = manifest["runtime"]["bundles"]["wasm"]
    manifest["executionProviders"] = {"desktop": ["webgpu", "wasm"], "android": ["wasm"]}
    manifest["loader"]["select"] = "measured"
    files = manifest["files"]
    size = lambda path: files[path]["size"]  # noqa: E731
    wire = lambda path: (files[path]["encodings"].get("br") or files[path])["size"]  # noqa: E731
    sizes = delivery_sizes(manifest, 1000)
    bundle = manifest["runtime"]["bundles"]["wasm"]
    fp16, fp32, sample = manifest["variants"]["fp16"]["model"], manifest["variants"]["fp32"]["model"], manifest["sample"]["file"]
    desktop, android = sizes["first_visit"]["desktop"], sizes["first_visit"]["android"]
    fetched = ["loader.js", bundle["module"], bundle["wasm"]]
    assert (desktop["variant"], desktop["files"]) == ("fp16", 5) and (android["variant"], android["files"]) == ("fp32", 5)
    assert desktop["bytes"] == 1000 + sum(map(size, fetched)) + size(fp16) and desktop["wire_bytes"] == 1000 + sum(map(wire, fetched)) + wire(fp16)
    # webgpu's other candidate and the sample; a wasm-only chain has one candidate: the sample only
    assert desktop["trials"] == {"files": 2, "bytes": size(fp32) + size(sample), "wire_bytes": wire(fp32) + wire(sample)}
    assert android["trials"] == {"files": 1, "bytes": size(sample), "wire_bytes": wire(sample)}
    # the folder: every file but the build's record (report.json, not listed), .br copies and the manifest included
    on_disk = sum(p.stat().st_size for p in package.root.rglob("*") if p.is_file() and p.name not in ("report.json", "manifest.json"))
    assert sizes["package"]["bytes"] == on_disk + 1000
    assert sizes["repeat_visit"] == {"bytes": 0, "revalidated": ["manifest.json", "loader.js"], "bytes_after_republish": 1000 + size("loader.js")}
    lines = delivery_lines(sizes)
    assert lines[1].startswith("  first visit desktop [webgpu, wasm]: ") and "trials then fetch" in lines[1]


def test_first_visit_skips_refused_variants_and_counts_adapters_without_shader_f16(tmp_path):
    """fp16 needs shader-f16: a desktop visit also says what an adapter without it fetches (fp16w,
    the loader's next choice); a refused fp16w is never counted, fp32 is then what they get."""
    manifest = copy.deepcopy(write_package(tmp_path / "dist").manifest)
    manifest["runtime"]["bundles"]["webgpu"] = manifest["runtime"]["bundles"]["wasm"]
    manifest["variants"]["fp16"]["requires"] = ["shader-f16"]
    manifest["variants"]["fp16w"] = {**manifest["variants"]["fp32"], "precision": "fp16w", "model": manifest["variants"]["fp16"]["model"], "widen": "fp16-initializers"}
    manifest["variantFor"] = {"webgpu": ["fp16", "fp16w", "fp32"], "wasm": ["fp16w", "fp32"]}
    manifest["executionProviders"] = {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]}
    sizes = delivery_sizes(manifest, 1000)["first_visit"]
    desktop, apple = sizes["desktop"], sizes["apple-mobile"]
    assert desktop["variant"] == "fp16" and desktop["without_features"]["variant"] == "fp16w" and desktop["without_features"]["lacking"] == ["shader-f16"]
    assert desktop["without_features"]["bytes"] == desktop["bytes"]  # same model file here: only the choice differs
    assert apple["variant"] == "fp16w" and "without_features" not in apple
    assert "without shader-f16 the fp16w model: " in delivery_lines({"package": {"bytes": 1, "files": 1, "hosted_bytes": 1}, "first_visit": sizes, "repeat_visit": {"bytes": 0, "revalidated": [], "bytes_after_republish": 0}})[1]
    manifest["verification"]["runs"] = [{"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16w", "status": "failed", "detail": "rel_l2 0.2 > 0.005"}]
    refused = delivery_sizes(manifest, 1000)["first_visit"]
    assert refused["desktop"]["without_features"]["variant"] == refused["apple-mobile"]["variant"] == "fp32"
    size = lambda variant: manifest["files"][manifest["variants"][variant]["model"]]["size"]  # noqa: E731
    assert refused["apple-mobile"]["bytes"] - apple["bytes"] == size("fp32") - size("fp16w") != 0
