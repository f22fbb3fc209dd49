"""`pack build` end to end through the CLI on generated models (host checks; --no-browser)."""

import base64
import hashlib
import json
from pathlib import Path

import brotli
import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.manifest import refused, file_parts
from pipeline.cli import app
from build_helpers import OUTPUT_ALSO_CONSUMED, conv_model, model_from_text, run, save

runner = CliRunner()


def build(*args: str):
    return runner.invoke(app, ["build", *args])


@pytest.fixture
def conv_file(tmp_path) -> Path:
    return save(conv_model(), tmp_path / "tiny-conv.onnx")


@pytest.mark.slow
def test_build_model_without_recipe_writes_a_complete_package(conv_file, tmp_path):
    out = tmp_path / "dist"
    result = build(str(conv_file), "--no-browser", "--out", str(out))
    assert result.exit_code == 0, result.output
    package = out / "tiny-conv"
    manifest = json.loads((package / "manifest.json").read_text())
    assert set(manifest["variants"]) == {"fp16", "fp32"}
    assert manifest["variants"]["fp16"]["requires"] == ["shader-f16"]
    assert manifest["inputs"] == [{"name": "x", "shape": [1, 3, 16, 16], "dtype": "float32", "sampleShape": [1, 3, 16, 16]}]
    verification = manifest["verification"]
    assert verification["browser"] is False and verification["passed"] is True
    # the webgpu-kernels stage runs without the browser: passed where installed, else skipped
    kernel_runs = [(r["bundle"], r["ep"], r["variant"], r["status"]) for r in verification["runs"] if r["stage"] == "webgpu-kernels"]
    assert kernel_runs in [[("*", "webgpu", v, status) for v in ("fp16", "fp32")] for status in ("passed", "skipped")]
    assert [r for r in verification["runs"] if r["stage"] != "webgpu-kernels"] == [
        # every variant on every EP of each bundle: wasm x fp16 too
        {"stage": "browser", "bundle": "wasm", "ep": "wasm", "variant": "fp16", "status": "skipped", "detail": "--no-browser"},
        {"stage": "browser", "bundle": "wasm", "ep": "wasm", "variant": "fp32", "status": "skipped", "detail": "--no-browser"},
        {"stage": "browser", "bundle": "webgpu", "ep": "wasm", "variant": "fp16", "status": "skipped", "detail": "--no-browser"},
        {"stage": "browser", "bundle": "webgpu", "ep": "wasm", "variant": "fp32", "status": "skipped", "detail": "--no-browser"},
        {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp16", "status": "skipped", "detail": "--no-browser"},
        {"stage": "browser", "bundle": "webgpu", "ep": "webgpu", "variant": "fp32", "status": "skipped", "detail": "--no-browser"},
        {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "passed"},
        {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp32", "status": "passed"},
    ]
    assert manifest["measurements"] == [] and manifest["license"] is None and manifest["loader"]["select"] == "chain"
    # the bounds the host checks used, and the ones the browser checks would use
    report_checks = json.loads((package / "report.json").read_text())["checks"]
    for check in (c for c in report_checks if c["stage"] == "host"):
        assert manifest["thresholds"]["cpu"][check["variant"]][check["output"]] == check["threshold"]
    assert set(manifest["thresholds"]) == {"cpu", "wasm", "webgpu"} and set(manifest["thresholds"]["webgpu"]) == {"fp16", "fp32"}
    # the sample file holds the inputs, then the fp32 reference outputs
    sample = manifest["sample"]
    y = sample["outputs"]["y"]
    assert y["dims"] == [1, 3, 16, 16] and y["offset"] >= sample["tensors"]["x"]["offset"] + sample["tensors"]["x"]["length"]
    raw = (package / sample["file"]).read_bytes()
    reference = np.frombuffer(raw[y["offset"]: y["offset"] + y["length"]], dtype="<f4").reshape(y["dims"])
    x = np.frombuffer(raw[: sample["tensors"]["x"]["length"]], dtype="<f4").reshape(1, 3, 16, 16)
    np.testing.assert_allclose(reference, run(conv_model(), {"x": x})["y"], rtol=1e-5, atol=1e-6)
    # every file of the package is listed, except manifest.json itself
    on_disk = {p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file()}
    listed = set(manifest["files"]) | {e["encodings"]["br"]["path"] for e in manifest["files"].values() if e["encodings"]}
    # the build's reports (report.json, the record; report.html and its data, for people) are not
    # what the loader needs: outside manifest.files (pipeline/report)
    assert on_disk - listed == {"manifest.json", "report.json", "report.html", "report.data.npz"} and listed <= on_disk
    modules = [path for path in manifest["files"] if path.startswith("loader/")]  # the loader's ES modules
    assert "loader/load.js" in modules
    for name in ("loader.js", "loader.d.ts", "index.html", "demo.js", *modules):
        assert manifest["files"][name]["cache"] == "short"
    assert all(entry["cache"] == "immutable" for path, entry in manifest["files"].items() if path.startswith("ort/") or path.endswith((".onnx", ".bin")))
    assert set(manifest["runtime"]["bundles"]) == {"webgpu", "wasm"}
    for path, entry in manifest["files"].items():
        data = (package / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        if entry["cache"] == "immutable":
            assert path.split(".")[-2] == entry["sha256"][:16] or f".{entry['sha256'][:16]}." in path
        assert entry["integrity"] == "sha256-" + base64.b64encode(hashlib.sha256(data).digest()).decode()
        assert entry["size"] == len(data)
        if entry["encodings"]:
            encoded = (package / entry["encodings"]["br"]["path"]).read_bytes()
            assert brotli.decompress(encoded) == data and len(encoded) == entry["encodings"]["br"]["size"] < len(data)
    for name in ("loader.js", "loader.d.ts", "index.html", "report.json"):
        assert (package / name).exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left
    report = json.loads((package / "report.json").read_text())
    host = [c for c in report["checks"] if c["stage"] == "host"]
    assert {(c["variant"], c["status"]) for c in host} == {("fp16", "passed"), ("fp32", "passed")}
    assert all(c["status"] == "skipped" for c in report["checks"] if c["stage"] == "browser")
    assert "NOT browser-verified" in result.output
    # the sizes: the whole folder, and what a desktop first visit fetches (webgpu chain: webgpu bundle, fp16 model)
    delivery = report["delivery"]
    assert delivery["package"]["files"] == len(on_disk) - 3  # report.json, report.html, report.data.npz aside
    assert delivery["package"]["bytes"] == sum(p.stat().st_size for p in package.rglob("*") if p.is_file() and p.name not in ("report.json", "report.html", "report.data.npz"))
    desktop = delivery["first_visit"]["desktop"]
    fetched = ["manifest.json", "loader.js", *modules, *manifest["runtime"]["bundles"]["webgpu"].values(), manifest["variants"]["fp16"]["model"]]
    fetched.remove(manifest["runtime"]["bundles"]["webgpu"]["entry"])
    fetched = [part for path in fetched for part in file_parts(manifest, path)]  # a runtime file over [assets] max_file_mib comes in parts
    wire = lambda path: (package / path).stat().st_size if path == "manifest.json" else (manifest["files"][path]["encodings"].get("br") or manifest["files"][path])["size"]  # noqa: E731
    assert (desktop["bundle"], desktop["variant"], desktop["files"]) == ("webgpu", "fp16", len(fetched))
    assert desktop["bytes"] == sum((package / path).stat().st_size for path in fetched) > desktop["wire_bytes"] == sum(map(wire, fetched))
    assert delivery["repeat_visit"]["bytes"] == 0 and delivery["repeat_visit"]["revalidated"] == ["manifest.json", "loader.js", *sorted(modules)]
    assert f"delivery: package {delivery['package']['bytes'] / 1e6:.1f} MB" in result.output and "  first visit desktop [webgpu, wasm]: " in result.output


def test_rebuild_from_scratch_is_byte_identical_manifest_included(conv_file, tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    assert build(str(conv_file), "--no-browser", "--no-reuse", "--out", str(first)).exit_code == 0
    assert build(str(conv_file), "--no-browser", "--no-reuse", "--out", str(second)).exit_code == 0
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    # manifest.json does not list report.json (whose timings differ), so it is the same bytes
    assert (first / "tiny-conv" / "manifest.json").read_bytes() == (second / "tiny-conv" / "manifest.json").read_bytes()
    for rel in files:
        a, b = (first / rel), (second / rel)
        if rel.name in ("report.html", "report.data.npz"):  # for people, never published (docs/report.md)
            continue
        if rel.name == "report.json":  # differs in its timings only
            ra, rb = json.loads(a.read_text()), json.loads(b.read_text())
            ra.pop("timings"), rb.pop("timings")
            assert ra == rb
        else:
            assert a.read_bytes() == b.read_bytes(), rel


def test_the_browser_stage_is_served_the_manifest_from_memory_and_it_is_written_once(conv_file, tmp_path, monkeypatch):
    """No provisional manifest.json on disk while the browser runs (the NCHW retry included): the
    browser stage gets the manifest in memory, and the build writes manifest.json once, at the end,
    then report.json once."""
    from contextlib import nullcontext

    import pipeline.stages.write
    import pipeline.verify.engines.browser.grid as grid
    from pipeline.manifest import write_manifest
    from pipeline.verify.engines.browser.harness import BrowserResult
    from pipeline.verify.engines.browser.run_plan import plan_runs

    served = []

    def fake_verify_on_grid(grid_settings, package_dir, references, thresholds, *, manifest=None, **options):
        assert manifest is not None, "the build hands the browser stage its manifest in memory"
        assert not (package_dir / "manifest.json").exists(), "a manifest.json on disk before the end of the build"
        assert not (package_dir / "report.json").exists()
        assert (package_dir / "loader.js").is_file() and (package_dir / manifest["sample"]["file"]).is_file()
        served.append(manifest)
        nchw = manifest["epOptions"].get("webgpu", {}).get("preferredLayout") == "NCHW"
        checks = [{"stage": "browser", "ep": run.ep, "variant": run.variant, "bundle": run.bundle, "output": "y",
                   "status": "failed" if run.ep == "webgpu" and not nchw else "passed", "metrics": {}, "threshold": {}, "detail": "fake"}
                  for run in plan_runs(manifest)]
        return BrowserResult(checks, {"runs": []})

    monkeypatch.setattr(grid, "verify_on_grid", fake_verify_on_grid)
    monkeypatch.setattr(grid, "browsers_for", lambda grid_settings, gpu: nullcontext(None))
    writes = []
    monkeypatch.setattr(pipeline.stages.write, "write_manifest", lambda folder, manifest: writes.append(manifest) or write_manifest(folder, manifest))
    result = build(str(conv_file), "--no-reuse", "--out", str(tmp_path / "d"))
    assert result.exit_code == 0, result.output
    # webgpu failed under NHWC, so the retry was served another in-memory manifest, with NCHW
    assert [m["epOptions"].get("webgpu", {}).get("preferredLayout") for m in served] == [None, "NCHW"]
    assert all(m["verification"]["runs"] == [] for m in served)  # every variant tried as shipped
    assert len(writes) == 1
    package = tmp_path / "d" / "tiny-conv"
    manifest = json.loads((package / "manifest.json").read_text())
    assert manifest == writes[0] and manifest["epOptions"] == {"webgpu": {"preferredLayout": "NCHW"}}
    assert "report.json" not in manifest["files"]
    report = json.loads((package / "report.json").read_text())
    assert report["delivery"]["first_visit"]["desktop"]["bytes"] > (package / "manifest.json").stat().st_size
    assert report["delivery"]["repeat_visit"]["bytes_after_republish"] - (package / "manifest.json").stat().st_size == sum(
        manifest["files"][path]["size"] for path in report["delivery"]["repeat_visit"]["revalidated"][1:])
    assert any(step["name"] == "layout" and step["changed"] for step in report["steps"])


def test_rebuild_reuses_cached_work(conv_file, tmp_path, monkeypatch):
    import pipeline.precision.variants
    import pipeline.verify.engines.host

    assert build(str(conv_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0

    def must_not_run(*args, **kwargs):
        raise AssertionError("recomputed work that the cache holds")

    monkeypatch.setattr(pipeline.verify.engines.host, "_run_uncached", must_not_run)
    monkeypatch.setattr(pipeline.precision.variants, "convert_with_keeps", must_not_run)
    monkeypatch.setattr("pipeline.assets.files._compress", must_not_run)
    result = build(str(conv_file), "--no-browser", "--no-reuse", "--out", str(tmp_path / "b"))
    assert result.exit_code == 0, result.output


def test_json_output_is_the_report(conv_file, tmp_path):
    result = build(str(conv_file), "--no-browser", "--json", "--out", str(tmp_path / "d"))
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["name"] == "tiny-conv" and report["passed"] is True and report["refused"] is None
    assert {"stage", "ep", "variant", "status", "metrics", "threshold"} <= set(report["checks"][0])
    assert any(step["name"] == "fp16_convert" and step["changed"] for step in report["steps"])
    # report.json may be published (--with-report): the build machine's folders stay out of it.
    assert report["source"]["uri"] == conv_file.name and str(conv_file.parent) not in result.stdout


def test_failed_check_exits_1_and_still_writes_the_package(conv_file, tmp_path):
    recipe = tmp_path / "strict.toml"
    recipe.write_text(f'source.uri = "{conv_file.name}"\n[outputs.y.fp16]\nmax_abs = 0.0\n')
    out = tmp_path / "dist"
    # fp16 refused, fp32 verified on every chain: a refused variant is not a failed package
    lenient = build(str(recipe), "--no-browser", "--out", str(tmp_path / "lenient"))
    assert lenient.exit_code == 0, lenient.output
    assert "REFUSED VARIANTS: fp16" in lenient.output and "PASSED" in lenient.output
    # ... unless the recipe requires fp16
    recipe.write_text(recipe.read_text() + '[verify]\nrequire = ["fp16"]\n')
    result = build(str(recipe), "--no-browser", "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "FAILED: variant fp16 is required ([verify] require) but refused: host fp16" in result.output
    report = json.loads((out / "strict" / "report.json").read_text())
    failed = [c for c in report["checks"] if c["status"] == "failed"]
    assert report["passed"] is False and failed[0]["variant"] == "fp16" and "max_abs" in failed[0]["detail"]
    manifest = json.loads((out / "strict" / "manifest.json").read_text())
    assert manifest["verification"]["passed"] is False
    assert "FAIL" in result.output
    # the failed variant stays listed but the refusal rule turns it away everywhere, and says why
    host_fp16 = next(r for r in manifest["verification"]["runs"] if r["stage"] == "host" and r["variant"] == "fp16")
    assert host_fp16["status"] == "failed" and host_fp16["bundle"] == host_fp16["ep"] == "*"
    assert host_fp16["detail"].startswith("y: max_abs ") and host_fp16["detail"].endswith(" > 0")
    assert manifest["variantFor"]["webgpu"][0] == "fp16"
    assert refused(manifest, "webgpu", "webgpu", "fp16") == host_fp16
    assert refused(manifest, "wasm", "wasm", "fp16") == host_fp16
    assert refused(manifest, "webgpu", "webgpu", "fp32") is None
    # a host failure refuses the variant on every pair the package lists, wasm x fp16 too
    assert [(r["bundle"], r["ep"], r["variant"]) for r in report["refused"]] == [
        ("webgpu", "webgpu", "fp16"), ("webgpu", "wasm", "fp16"), ("wasm", "wasm", "fp16")]
    assert "fp16 on webgpu [webgpu bundle] refused (the loader will not pick it): host fp16 (any bundle, any EP): failed: y: max_abs" in result.output


def test_consumed_output_model_builds(tmp_path):
    path = save(model_from_text(OUTPUT_ALSO_CONSUMED), tmp_path / "consumed.onnx")
    result = build(str(path), "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 0, result.output


def test_inputs_npz_and_symbolic_dims(tmp_path):
    text = """
    <ir_version: 8, opset_import: ["" : 17]>
    dyn (float[N, 4] x, float s) => (float[N, 4] y) { y = Mul (x, s) }
    """
    path = save(model_from_text(text), tmp_path / "dyn.onnx")
    out = tmp_path / "d"
    missing = build(str(path), "--no-browser", "--out", str(out))
    assert missing.exit_code == 2
    assert "dynamic dims without a size for the sample: 'x' ['N', 4]" in missing.output and "--input x=1x4 (onnxruntime runs the model at this size)" in missing.output
    assert not out.exists() or not any(out.iterdir())
    # The hint's own text is accepted as printed
    hinted = missing.output.split("--input ", 1)[1].split()[0]
    assert build(str(path), "--input", hinted, "--no-browser", "--out", str(out)).exit_code == 0
    assert build(str(path), "--input", "x=3x4", "--no-browser", "--out", str(out)).exit_code == 0
    npz = tmp_path / "sample.npz"
    np.savez(npz, x=np.arange(8, dtype=np.float32).reshape(2, 4), s=np.float32(2.0))  # a constant x would give a degenerate y
    result = build(str(path), "--inputs", str(npz), "--no-browser", "--out", str(out))
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "dyn" / "manifest.json").read_text())
    assert manifest["sample"]["tensors"]["x"]["dims"] == [2, 4] and manifest["sample"]["tensors"]["s"]["dims"] == []


def _file(name: str, content: str | bytes):
    def setup(folder: Path) -> str:
        path = folder / name
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        return str(path)

    return setup


@pytest.mark.parametrize(
    "setup, message",
    [
        (_file("trunc.onnx", conv_model().SerializeToString()[:500]), "trunc.onnx: not a readable ONNX model"),
        (lambda d: str(d / "absent.onnx"), "absent.onnx"),
        (_file("bad.toml", 'source.uri = "x.onnx"\n[verify]\nsed = 1\n'), "bad.toml: unknown key 'verify.sed'"),
        (_file("typed.toml", 'source.uri = "x.onnx"\nvariants = "fp16"\n'), "typed.toml: key 'variants': expected a non-empty list"),
        (_file("nosrc.toml", 'name = "x"\n'), "nosrc.toml: no source"),
        (lambda d: "no-such-recipe", "not a built-in recipe"),
    ],
    ids=["truncated-onnx", "missing-model", "unknown-key", "ill-typed-key", "no-source", "unknown-recipe"],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, setup, message):
    target = setup(tmp_path)
    out = tmp_path / "dist"
    result = build(target, "--no-browser", "--out", str(out))
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1
    assert not out.exists() or not [p for p in out.iterdir()]


def test_unreadable_model_is_reported(tmp_path):
    path = save(conv_model(), tmp_path / "locked.onnx")
    path.chmod(0)
    try:
        if path.open("rb"):  # root reads anything: make it a folder instead
            path.chmod(0o644)
            path.unlink()
            path.mkdir()
    except PermissionError:
        pass
    result = build(str(path), "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 2 and "locked.onnx" in result.output


def test_recipes_lists_one_line_each():
    result = runner.invoke(app, ["recipes"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert any(line.startswith("gtcrn ") for line in lines)
    assert len(lines) == len(list(Path(__file__).resolve().parent.parent.joinpath("recipes").glob("*.toml")))


def test_source_option_overrides_the_recipe_with_its_own_sha256(conv_file, tmp_path):
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(conv_file.parent))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        recipe = tmp_path / "over.toml"
        recipe.write_text('source.uri = "elsewhere.onnx"\nsource.sha256 = "' + "0" * 64 + '"\n')
        url = f"http://127.0.0.1:{httpd.server_address[1]}/{conv_file.name}"
        sha = hashlib.sha256(conv_file.read_bytes()).hexdigest()
        missing_sha = build(str(recipe), "--source", url, "--no-browser", "--out", str(tmp_path / "d"))
        # without --sha256 the file must be the recipe's published one (a mirror), and it is not
        assert missing_sha.exit_code == 2 and f"pass --sha256 {sha}" in missing_sha.output
        result = build(str(recipe), "--source", url, "--sha256", sha, "--no-browser", "--out", str(tmp_path / "d"))
        assert result.exit_code == 0, result.output
        assert json.loads((tmp_path / "d" / "over" / "report.json").read_text())["source"]["uri"] == url
    finally:
        httpd.shutdown()


def test_external_data_beside_the_model_is_read(tmp_path):
    import onnx

    folder = tmp_path / "src"
    folder.mkdir()
    model = conv_model(channels=64)
    onnx.save(model, str(folder / "ext.onnx"), save_as_external_data=True, all_tensors_to_one_file=True, location="ext.onnx.data", size_threshold=0)
    assert (folder / "ext.onnx.data").stat().st_size > 10_000
    result = build(str(folder / "ext.onnx"), "--no-browser", "--out", str(tmp_path / "d"))
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "d" / "ext" / "manifest.json").read_text())
    shipped = tmp_path / "d" / "ext" / manifest["variants"]["fp32"]["model"]
    assert onnx.load(str(shipped)).graph.initializer[0].raw_data  # weights inlined: one file to fetch
    (folder / "ext.onnx.data").unlink()
    missing = build(str(folder / "ext.onnx"), "--no-browser", "--out", str(tmp_path / "e"))
    assert missing.exit_code == 2 and "ext.onnx" in missing.output, missing.output
