"""Per-engine evidence without a browser: the refusal rule read per engine (pipeline/manifest.py
engine_runs, in_engine; its JS twin is tests/js/engines.test.mjs), runs recorded per engine from
checks, a required engine's verdict, recipe `[verify] engines` validation, and the summary's rows."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from pipeline.errors import PackError
from pipeline.manifest import engine_runs, in_engine, package_verdict, refused, required_engine_problems, runs_from_checks
from pipeline.recipe import parse_recipe
from pipeline.verify.judgement.checks import check, refused_by_build

PAD = "y: failed at session-create: Pad shader: Invalid access into expression"


def run(bundle, ep, variant, status, **extra):
    return {"stage": "browser", "bundle": bundle, "ep": ep, "variant": variant, "status": status, **extra}


def manifest_with(runs: list[dict]) -> dict:
    return {
        "executionProviders": {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]},
        "variantFor": {"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        "runtime": {"bundles": {"webgpu": {}, "wasm": {}}},
        "verification": {"browser": True, "passed": True, "runs": runs},
    }


# Chromium passed everything; Firefox failed webgpu/fp16, passed the rest; WebKit had no WebGPU.
BUILT = manifest_with([
    {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp16", "status": "passed"},
    {"stage": "host", "bundle": "*", "ep": "*", "variant": "fp32", "status": "passed"},
    run("webgpu", "webgpu", "fp16", "passed"), run("webgpu", "webgpu", "fp32", "passed"), run("webgpu", "wasm", "fp32", "passed"), run("wasm", "wasm", "fp32", "passed"),
    run("webgpu", "webgpu", "fp16", "failed", engine="firefox", detail=PAD), run("webgpu", "webgpu", "fp32", "passed", engine="firefox"),
    run("webgpu", "wasm", "fp32", "passed", engine="firefox"), run("wasm", "wasm", "fp32", "passed", engine="firefox"),
    run("webgpu", "webgpu", "fp16", "not-verifiable", engine="webkit", detail="no WebGPU adapter"),
    run("webgpu", "webgpu", "fp32", "not-verifiable", engine="webkit", detail="no WebGPU adapter"),
    run("webgpu", "wasm", "fp32", "passed", engine="webkit"), run("wasm", "wasm", "fp32", "passed", engine="webkit"),
])


def test_a_pair_an_engine_failed_is_refused_in_that_engine_only():
    assert refused(BUILT, "webgpu", "webgpu", "fp16") is None  # Chromium, and every package rule of the build
    firefox = refused(in_engine(BUILT, "firefox"), "webgpu", "webgpu", "fp16")
    assert firefox is not None and firefox["engine"] == "firefox" and firefox["detail"] == PAD
    assert refused(in_engine(BUILT, "firefox"), "webgpu", "webgpu", "fp32") is None
    assert refused(in_engine(BUILT, "webkit"), "webgpu", "webgpu", "fp16") is None  # no verdict of its own: Chromium's stands
    assert package_verdict(BUILT) == (True, [])


def test_engine_runs_keep_chromium_where_the_engine_has_no_verdict_and_host_runs_everywhere():
    webkit = engine_runs(BUILT["verification"]["runs"], "webkit")
    webgpu = [(r.get("engine", "chromium"), r["variant"], r["status"]) for r in webkit if r["ep"] == "webgpu"]
    assert webgpu == [("chromium", "fp16", "passed"), ("chromium", "fp32", "passed")]
    assert sum(r["stage"] == "host" for r in webkit) == 2
    chromium = engine_runs(BUILT["verification"]["runs"])
    assert not any(r.get("engine") for r in chromium) and len(chromium) == 6
    # an engine passing what Chromium failed may use it there
    flipped = [run("webgpu", "webgpu", "fp32", "failed", detail="chromium: wrong"), run("webgpu", "webgpu", "fp32", "passed", engine="firefox")]
    assert [r["status"] for r in engine_runs(flipped, "firefox")] == ["passed"]
    assert [r["status"] for r in engine_runs(flipped)] == ["failed"]


def test_runs_are_recorded_per_engine_from_checks():
    checks = [check("browser", "webgpu", "fp16", "passed", bundle="webgpu", output="y"),
              check("browser", "webgpu", "fp16", "failed", bundle="webgpu", output="y", detail="Pad", engine="firefox"),
              check("browser", "webgpu", "fp16", "not-verifiable", bundle="webgpu", detail="no WebGPU adapter", engine="webkit")]
    runs = runs_from_checks(checks, "browser")
    assert [(r.get("engine"), r["status"]) for r in runs] == [(None, "passed"), ("firefox", "failed"), ("webkit", "not-verifiable")]
    assert runs[1]["detail"] == "y: Pad"


def test_a_required_engine_fails_the_package_by_its_own_runs_and_names_it():
    assert required_engine_problems(BUILT, "firefox") == []  # webgpu/fp32 and wasm keep its chains
    wasm_failed = manifest_with([*BUILT["verification"]["runs"][:6], run("webgpu", "wasm", "fp32", "failed", engine="webkit", detail="y: rel_l2 0.5 > 0.001"),
                                 run("wasm", "wasm", "fp32", "failed", engine="webkit", detail="y: rel_l2 0.5 > 0.001")])
    [problem] = required_engine_problems(wasm_failed, "webkit")
    assert problem.startswith("engine webkit is required ([verify] engines): platform apple-mobile: no verified variant left on wasm")
    missing = manifest_with([*BUILT["verification"]["runs"][:6], run("webgpu", "wasm", "fp32", "not-verifiable", engine="webkit",
                                                                      detail="WebKit is not installed (no MiniBrowser); install it: apt-get install webkit2gtk-driver xvfb")])
    assert required_engine_problems(missing, "webkit") == [
        "engine webkit is required ([verify] engines) but not verifiable: WebKit is not installed (no MiniBrowser); install it: apt-get install webkit2gtk-driver xvfb"]
    assert required_engine_problems(manifest_with(BUILT["verification"]["runs"][:6]), "firefox") == [
        "engine firefox is required ([verify] engines) but not verifiable: no browser check ran in it"]


def test_pack_verify_judges_an_engine_failure_by_that_engine_reading():
    firefox_fail = check("browser", "webgpu", "fp16", "failed", bundle="webgpu", output="y", detail="Pad", engine="firefox")
    chromium_fail = check("browser", "webgpu", "fp16", "failed", bundle="webgpu", output="y", detail="wrong")
    marked = refused_by_build([firefox_fail, chromium_fail], BUILT)
    assert marked[0]["status"] == "refused" and "browser in firefox fp16" in marked[0]["detail"]
    assert marked[1]["status"] == "failed"  # Chromium passed it at build time


def recipe(tmp_path: Path, verify: str):
    return parse_recipe(tomllib.loads(f'name = "m"\n[source]\nuri = "m.onnx"\n[verify]\n{verify}\n'), tmp_path / "m.toml")


def test_recipe_verify_engines(tmp_path):
    assert recipe(tmp_path, 'engines = ["chromium", "webkit"]').verify_engines == ["chromium", "webkit"]
    assert recipe(tmp_path, "").verify_engines == []
    for bad in ('engines = ["safari"]', 'engines = "webkit"', 'engines = ["webkit", "webkit"]', "engines = [1]"):
        with pytest.raises(PackError) as error:
            recipe(tmp_path, bad)
        assert str(error.value).startswith(f"{tmp_path / 'm.toml'}: key 'verify.engines': expected a list of browser engines, each once (chromium, firefox, webkit)"), bad


def test_summary_rows_name_their_engine():
    from pipeline.commands.summary import check_line, engine_lines

    line = check_line(check("browser", "webgpu", "fp16", "failed", bundle="webgpu", output="y", detail="Pad", engine="firefox"))
    assert line.startswith("  FAIL browser in firefox webgpu/fp16")
    assert engine_lines("webkit", {"unavailable": "WebKit is not installed; install it: apt-get install webkit2gtk-driver xvfb", "seconds": 0.0}) == [
        "browser in webkit: not verifiable (0 s): WebKit is not installed; install it: apt-get install webkit2gtk-driver xvfb"]


def test_the_loader_reads_the_runs_per_engine_as_python_does():
    """policy.js engineRuns is the twin of pipeline.manifest.engine_runs: the same runs kept, per engine."""
    import shutil
    import subprocess

    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not on PATH")
    policy = (Path(__file__).parent.parent / "web_template" / "loader" / "policy.js").as_uri()
    runs = [*BUILT["verification"]["runs"], run("webgpu", "webgpu", "fp32", "failed", detail="chromium: wrong"),
            run("webgpu", "webgpu", "fp32", "passed", engine="webkit")]
    script = (f"import {{ engineRuns }} from {json.dumps(policy)};\n"
              f"const runs = {json.dumps(runs)};\n"
              "console.log(JSON.stringify(['chromium', 'firefox', 'webkit', null].map((e) => engineRuns(runs, e))));")
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60, check=True)
    expected = [engine_runs(runs, engine) for engine in ("chromium", "firefox", "webkit", "chromium")]
    assert json.loads(done.stdout) == expected
    assert len({json.dumps(e) for e in expected}) == 3  # the three readings differ on these runs


def test_the_package_rule_holds_in_each_required_engine_the_manifest_records():
    """`verification.requireEngines` (recipe `[verify] engines`) is part of the package rule that
    `pack build` and `pack publish` apply; under --no-browser (no browser check ran) it is not judged."""
    wasm_failed = manifest_with([*BUILT["verification"]["runs"][:6], run("webgpu", "wasm", "fp32", "failed", engine="webkit", detail="y: wrong"),
                                 run("wasm", "wasm", "fp32", "failed", engine="webkit", detail="y: wrong")])
    assert package_verdict(wasm_failed) == (True, [])
    wasm_failed["verification"]["requireEngines"] = ["chromium", "webkit"]
    passed, problems = package_verdict(wasm_failed)
    assert not passed and [p.split(":")[0] for p in problems] == ["engine webkit is required ([verify] engines)"]
    wasm_failed["verification"]["browser"] = False
    assert package_verdict(wasm_failed) == (True, [])
