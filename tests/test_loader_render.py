"""render_loader: the files it writes, their determinism, escaping and manifest validation."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from pipeline.manifest import make_manifest
from pipeline.errors import PackError
from pipeline.web.render import render_loader

WEB_TEMPLATE = Path(__file__).resolve().parents[1] / "web_template"


def _file(media_type: str = "application/octet-stream") -> dict:
    return {"sha256": "0" * 64, "integrity": "sha256-" + "A" * 43 + "=", "size": 1, "mediaType": media_type, "encodings": {}, "cache": "immutable"}


MANIFEST = make_manifest(
    name="demo-model",
    files={path: _file() for path in ("model.fp16.0123456789abcdef.onnx", "model.fp32.0123456789abcdef.onnx", "sample.0123456789abcdef.bin", "m", "w")},
    variants={
        "fp16": {"precision": "fp16", "model": "model.fp16.0123456789abcdef.onnx", "requires": ["shader-f16"]},
        "fp32": {"precision": "fp32", "model": "model.fp32.0123456789abcdef.onnx", "requires": []},
    },
    variant_for={"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
    inputs=[
        {"name": "image", "shape": [1, 3, "H", "W"], "dtype": "float32"},
        {"name": 'mask"quoted', "shape": [1, 1, 256, 256], "dtype": "uint8"},
    ],
    outputs=[{"name": "y", "shape": [1, 3, "H", "W"], "dtype": "float32", "kind": "image"}],
    sample={
        "file": "sample.0123456789abcdef.bin",
        "tensors": {
            "image": {"dtype": "float32", "dims": [1, 3, 8, 8], "offset": 0, "length": 768},
            'mask"quoted': {"dtype": "uint8", "dims": [1, 1, 256, 256], "offset": 768, "length": 65536},
        },
        "outputs": {},
    },
    runtime={"package": "onnxruntime-web", "version": "1.30.0", "bundles": {"webgpu": {"entry": "onnxruntime-web/webgpu", "module": "m", "wasm": "w"}}},
    execution_providers={"desktop": ["webgpu", "wasm"]},
    loader={"watchdogMs": 60000, "prewarm": True, "select": "chain"},
)


MODULES = ["brotli", "cache", "chunks", "compare", "decisions", "errors", "files", "load", "manifest_keys", "policy", "present", "runner", "runtime", "select", "tensors", "widen", "worker"]


def test_writes_loader_modules_types_demo_page_and_script(tmp_path):
    written = render_loader(tmp_path, MANIFEST)
    assert written == ["loader.js", "demo.js", *(f"loader/{name}.js" for name in MODULES), "loader.d.ts", "index.html", "package.json"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == sorted(written)
    for name in written:
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert "{{" not in text and "{%" not in text, name
    # The loader is generic: copied as it is, it reads manifest.json at load time.
    for path in [p for p in written if p.endswith(".js")]:
        assert (tmp_path / path).read_bytes() == (WEB_TEMPLATE / path).read_bytes(), path
        assert "model.fp16.0123456789abcdef" not in (tmp_path / path).read_text()
    assert "new URL('manifest.json', baseUrl)" in (tmp_path / "loader" / "files.js").read_text()
    loader = (tmp_path / "loader.js").read_text()
    for export in ("load", "detectPlatform", "chainFor", "pickVariant", "verificationStatus", "compareOutputs", "PackRefusedError"):
        assert re.search(rf"export {{[^}}]*\b{export}\b", loader), export


def test_rebuild_is_byte_identical(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    render_loader(first, MANIFEST)
    render_loader(second, copy.deepcopy(MANIFEST))
    render_loader(first, MANIFEST)  # again, over its own output
    for name in render_loader(first, MANIFEST):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_types_name_the_inputs_outputs_and_variants(tmp_path):
    render_loader(tmp_path, MANIFEST)
    types = (tmp_path / "loader.d.ts").read_text()
    assert 'export type InputName = "image" | "mask\\"quoted";' in types
    assert 'export type OutputName = "y";' in types
    assert 'export type Variant = "fp16" | "fp32";' in types
    assert 'export type Bundle = "webgpu" | \'custom\';' in types
    assert '"image": { dtype: "float32"; shape: readonly [1, 3, number, number] };' in types


def test_demo_page_escapes_manifest_text(tmp_path):
    # Package names are restricted by the schema; input names are not.
    manifest = copy.deepcopy(MANIFEST)
    manifest["inputs"][1]["name"] = "<script>alert(1)</script>"
    manifest["sample"]["tensors"]["<script>alert(1)</script>"] = manifest["sample"]["tensors"].pop('mask"quoted')
    render_loader(tmp_path, manifest)
    html = (tmp_path / "index.html").read_text()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert '<script type="module" src="./demo.js"></script>' in html
    # The file:// notice names the package as a JSON string.
    assert "'pack serve dist/' + \"demo-model\"" in html
    first_line = (tmp_path / "loader.d.ts").read_text().splitlines()[0]
    assert first_line.startswith("//") and first_line.endswith("package, generated by pack from web_template/loader.d.ts.j2.")


def test_demo_page_carries_the_recipe_sample_rate_and_never_fetches_report_json(tmp_path):
    """The demo plays audio at the recipe's sample rate, rendered into index.html: report.json, which
    records it too, is not published by default (a CDN has none)."""
    render_loader(tmp_path, MANIFEST, sample_rate=44100)
    assert '<body data-sample-rate="44100">' in (tmp_path / "index.html").read_text()
    render_loader(tmp_path, MANIFEST)
    assert "<body>" in (tmp_path / "index.html").read_text()  # no rate: the demo's 16 kHz default
    demo = (tmp_path / "demo.js").read_text()
    assert "document.body.dataset.sampleRate" in demo and "report.json'" not in demo


@pytest.mark.parametrize(
    ("change", "key"),
    [
        (lambda m: m.pop("inputs"), '"inputs"'),
        (lambda m: m["outputs"][0].pop("dtype"), '"outputs[0].dtype"'),
        (lambda m: m.update(variants={}), '"variants"'),
        (lambda m: m["runtime"].pop("bundles"), '"runtime.bundles"'),
        (lambda m: m.update(name=""), '"name"'),
        (lambda m: m.update(name="a\nb"), '"name"'),
        (lambda m: m["sample"]["tensors"].pop("image"), '"sample.tensors"'),
        (lambda m: m["files"].pop("m"), '"runtime.bundles.webgpu.module"'),
    ],
)
def test_bad_manifest_names_the_key(tmp_path, change, key):
    manifest = copy.deepcopy(MANIFEST)
    change(manifest)
    with pytest.raises(PackError) as raised:
        render_loader(tmp_path, manifest)
    assert key in str(raised.value) and "manifest.json" in str(raised.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js for a syntax check")
def test_generated_scripts_are_valid_es_modules(tmp_path):
    for name in [p for p in render_loader(tmp_path, MANIFEST) if p.endswith(".js")]:
        module = tmp_path / (name.removesuffix(".js") + ".mjs")
        module.write_bytes((tmp_path / name).read_bytes())
        checked = subprocess.run(["node", "--check", str(module)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


TYPESCRIPT = "typescript@5.6.3"
USAGE_TS = """
import { load, detectPlatform, chainFor, compareOutputs, thresholdsFor, cacheStatus, clearCache, isCached, type Feeds } from './loader';
export async function main(): Promise<void> {
  const model = await load({
    executionProviders: ['webgpu', 'wasm'], select: 'measured', selectBudgetMs: 2000, watchdogMs: 1000,
    onSelect: (e) => { if (e.type === 'trial' && e.phase === 'done') console.log(e.ep, e.steadyMs); },
    onProgress: (p) => console.log(p.loaded / p.total, p.elapsedMs, p.phase === 'download' ? p.fileLoaded : p.state, p.file),
    onEvent: (e) => { if (e.type === 'fallback') console.log(e.from.ep, e.error); },
  });
  const feeds: Feeds = await model.sampleFeeds();
  const outputs = await model.run(feeds);
  console.log(outputs.y.dims, model.info.ep, model.info.fallbacks[0]?.inputShapes, model.info.selection?.fromCache);
  const y: Float32Array = outputs.y.data; // the output's dtype, no cast
  console.log(y[0], await isCached(), (await cacheStatus({ baseUrl: 'https://cdn.example/m/' })).bytes, (await clearCache()).files);
  const { reference } = await model.sample();
  if (reference) console.log(compareOutputs(model.manifest, reference, outputs, thresholdsFor(model.manifest, 'wasm', 'fp32')).text);
  await model.session?.endProfiling();
  await model.release();
  console.log(chainFor(model.manifest, detectPlatform({ userAgent: navigator.userAgent })));
}
"""
MISUSE_TS = """
import { load } from './loader';
export async function main(): Promise<void> {
  const model = await load({ variant: 'int8' });
  await model.run({ nope: { data: new Float32Array(1), dims: [1], type: 'float32' } });
  const wrong: Int32Array = (await model.run(await model.sampleFeeds())).y.data;
}
"""


@pytest.mark.network_registry
@pytest.mark.skipif(shutil.which("npm") is None, reason="needs npm to install TypeScript")
def test_declarations_type_check_usage_and_reject_misuse(tmp_path):
    from pipeline.runtime import cache_dir

    prefix = cache_dir() / "test-tools" / TYPESCRIPT.replace("@", "-")
    tsc = prefix / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        installed = subprocess.run(["npm", "install", "--silent", "--prefix", str(prefix), TYPESCRIPT], capture_output=True, text=True, timeout=300)
        assert installed.returncode == 0, installed.stderr
    render_loader(tmp_path, MANIFEST)
    (tmp_path / "use.ts").write_text(USAGE_TS)
    (tmp_path / "misuse.ts").write_text(MISUSE_TS)
    flags = ["--noEmit", "--strict", "--target", "es2022", "--module", "es2022", "--moduleResolution", "bundler", "--lib", "es2022,dom"]
    good = subprocess.run([str(tsc), *flags, "use.ts"], cwd=tmp_path, capture_output=True, text=True)
    assert good.returncode == 0, good.stdout
    bad = subprocess.run([str(tsc), *flags, "misuse.ts"], cwd=tmp_path, capture_output=True, text=True)
    assert "'\"int8\"' is not assignable" in bad.stdout and "'nope' does not exist" in bad.stdout, bad.stdout
    assert "Type 'Float32Array' is not assignable to type 'Int32Array'" in bad.stdout or "'Float32Array<ArrayBufferLike>' is not assignable to type 'Int32Array" in bad.stdout, bad.stdout


def test_package_json_makes_the_package_an_npm_package(tmp_path):
    import json

    from pipeline.web.npm import package_json

    render_loader(tmp_path, {**MANIFEST, "license": "Apache-2.0"})
    data = json.loads((tmp_path / "package.json").read_text())
    assert (data["name"], data["type"], data["license"], data["sideEffects"]) == ("demo-model", "module", "Apache-2.0", False)
    assert data["exports"]["."] == {"types": "./loader.d.ts", "default": "./loader.js"}
    assert (data["main"], data["types"]) == ("./loader.js", "./loader.d.ts")
    # exactly the package's files, the ones written after the loader included; nothing globbed (the
    # build's report.json is not one: npm pack ships what pack publish uploads)
    assert data["files"] == sorted(set(MANIFEST["files"]) | {"loader.js", "demo.js", "loader.d.ts", "index.html", "package.json", "manifest.json"} | {f"loader/{m}.js" for m in MODULES})
    assert re.fullmatch(r"0\.0\.0-[0-9a-f]{12}", data["version"])
    # the version follows the content-hashed files only, so a rebuild gives the same bytes
    assert package_json(MANIFEST, ["loader.js"]) == package_json(copy.deepcopy(MANIFEST), ["loader.js"])
    changed = copy.deepcopy(MANIFEST)
    changed["files"]["model.fp16.0123456789abcdef.onnx"]["sha256"] = "1" * 64
    assert json.loads(package_json(changed, []))["version"] != json.loads(package_json(MANIFEST, []))["version"]
    assert json.loads(package_json({**MANIFEST, "license": "MIT (weights)"}, []))["license"] == "SEE LICENSE IN manifest.json"
    assert "license" not in json.loads(package_json(MANIFEST, []))
    with pytest.raises(PackError, match="manifest.json name 'Demo Model': not a valid npm package name"):
        package_json({**MANIFEST, "name": "Demo Model"}, [])
