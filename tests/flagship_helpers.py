"""The flagship exports (tests/data/flagship/, made by tests/data/generators/make_flagship_models.py with
random weights) and one `pack build <recipe> --source <export>` of each: shared by the
test_build_flagship_*.py modules, which split the builds so the suite's workers share them."""

import hashlib
import json
from pathlib import Path

from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.recipe import RECIPES_DIR, load_recipe_file

runner = CliRunner()
DATA = Path(__file__).resolve().parent / "data" / "flagship"

# recipe -> (export, --input overrides at the export's size)
CASES = {
    "lama": ("lama", ["image=1x3x32x32", "mask=1x1x32x32"]),
    "migan": ("migan", ["image=1x3x32x32", "mask=1x1x32x32"]),
    "vocos": ("vocos", ["mel=1x80x16"]),
    "wavtokenizer-decode": ("wavtokenizer", ["codes=1x16"]),
    "htdemucs": ("htdemucs", ["waveform=1x2x256", "spectrogram=1x4x32x8"]),
    "uvr-mdx": ("mdx", ["input=1x4x32x16"]),
    "uvr-mdx-vocals": ("mdx", ["input=1x4x32x16"]),
    "scnet": ("scnet", ["mix=1x2x512"]),
    "mp-senet": ("mpsenet", ["noisy_mag=1x17x8", "noisy_pha=1x17x8"]),
}
# Repairs the build must apply to an export, as it must to the published file.
EXPECTED_REPAIRS = {"lama": "neg_step_slice", "wavtokenizer-decode": "stale_shapes"}
# The browser builds, split over three test modules so the suite's workers share them
# (test_build_flagship_<group>.py). uvr-mdx-vocals is uvr-mdx with another name and source file
# (same export, inputs and outputs): the browser build of uvr-mdx proves its package; it is built
# on the host only.
BROWSER_BUILDS = {
    "images": ["lama", "migan"],
    "separation": ["htdemucs", "scnet", "uvr-mdx"],
    "speech": ["mp-senet", "vocos", "wavtokenizer-decode"],
}
HOST_ONLY = {"uvr-mdx-vocals"}
# Every browser build of a flagship export takes 30-85 s on SwiftShader with the machine shared.
SLOW_IN_BROWSER = {name for names in BROWSER_BUILDS.values() for name in names}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build(tmp_path: Path, recipe_name: str, browser: bool) -> tuple[int, dict, str]:
    export, shapes = CASES[recipe_name]
    source = DATA / f"{export}.onnx"
    args = ["build", recipe_name, "--source", str(source), "--sha256", sha256(source), "--json", "--out", str(tmp_path / "dist")]
    for shape in shapes:
        args += ["--input", shape]
    if not browser:
        args.append("--no-browser")
    result = runner.invoke(app, args)
    report = json.loads(result.stdout) if result.stdout.startswith("{") else {}
    return result.exit_code, report, result.output


def failed(report: dict) -> list:
    return [(c["stage"], c["ep"], c["variant"], c.get("output"), c.get("detail")) for c in report.get("checks", []) if c["status"] == "failed"]


def assert_host_verified(recipe_name: str, code: int, report: dict, output: str, tmp_path: Path) -> None:
    assert code == 0, failed(report) or output[-2000:]
    assert not failed(report)
    host = {(c["variant"], c["output"]) for c in report["checks"] if c["stage"] == "host" and c["status"] == "passed"}
    recipe = load_recipe_file(RECIPES_DIR / f"{recipe_name}.toml")
    assert host == {(v, o) for v in recipe.variants for o in recipe.outputs}
    if recipe_name in EXPECTED_REPAIRS:
        assert next(s for s in report["steps"] if s["name"] == EXPECTED_REPAIRS[recipe_name])["changed"]
    manifest = json.loads((tmp_path / "dist" / recipe_name / "manifest.json").read_text())
    assert manifest["license"] == recipe.license and report["license"] == recipe.license
    assert report["source"]["checked"] == "--sha256"
    lock = tmp_path / "pack.lock.json"  # a file checked by --sha256 pins no source
    assert not lock.exists() or "source" not in json.loads(lock.read_text()).get(recipe_name, {})


def assert_builds_on_host_and_browser(recipe_name: str, tmp_path: Path) -> None:
    """One build proves both: the host checks run in every build, the browser checks after them."""
    code, report, output = build(tmp_path, recipe_name, browser=True)
    assert_host_verified(recipe_name, code, report, output, tmp_path)
    browser = {(c["ep"], c["variant"]): c["status"] for c in report["checks"] if c["stage"] == "browser"}
    # fp32 must pass on both EPs; fp16 on WebGPU needs shader-f16, which SwiftShader lacks.
    assert browser[("webgpu", "fp32")] == "passed" and browser[("wasm", "fp32")] == "passed", browser
    assert set(browser.values()) <= {"passed", "not-verifiable"}
    if recipe_name in REPORT_READ:
        read_report(tmp_path / "dist" / recipe_name, REPORT_READ[recipe_name])
    if recipe_name in OTHER_ENGINES_LOAD:
        from engine_helpers import assert_default_load_right_in_firefox_and_webkit

        assert_default_load_right_in_firefox_and_webkit(tmp_path / "dist" / recipe_name)


# An image model's default load in Firefox and WebKit too (gtcrn's is in test_browser_gtcrn.py).
OTHER_ENGINES_LOAD = {"migan"}


# The build's report.html, read in Chromium on a real image model and a real audio model (no extra
# build: these packages are built above anyway). Screenshots: .cache/report-screenshots/.
REPORT_READ = {"lama": "image", "wavtokenizer-decode": "waveform"}


def read_report(package: Path, drawn_as: str) -> None:
    from pipeline.verify.engines.browser.chromium import launch_browser
    from report_helpers import check_report_page

    with launch_browser() as browser:
        facts = check_report_page(browser, package)
    output = facts["sections"][0]
    assert output["drawnAs"] == drawn_as, facts["sections"]
    text = facts["text"]
    assert "cpu/fp16 (host)" in text and "wasm/fp32" in text  # the host's fp16 and what the browser produced
    if drawn_as == "image":
        assert "PSNR" in text and facts["audio"] == []
    else:  # the reference and each distinct run can be heard
        labels = [a["label"] for a in facts["audio"]]
        assert labels[0] == "fp32 reference (host)" and any("wasm/" in label or "webgpu/" in label for label in labels), labels
        assert "SNR" in text
