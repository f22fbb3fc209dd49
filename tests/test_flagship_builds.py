"""Every flagship recipe built from a PyTorch export of its architecture (tests/data/flagship/, made
by tests/data/generators/make_flagship_models.py with random weights): the exports are the committed files, they
carry the graph patterns and the I/O contract of the published models, and `pack build <recipe>
--source <export>` passes host and browser verification."""

import hashlib
import json
from pathlib import Path

import onnx
import pytest
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _table() -> dict[str, str]:
    rows = [line.split() for line in (DATA / "SHA256SUMS").read_text().splitlines() if line.strip()]
    return {name: sha for sha, name in rows}


def test_the_committed_exports_are_the_ones_the_table_lists():
    table = _table()
    assert sorted(table) == sorted(p.name for p in DATA.glob("*.onnx"))
    for name, sha in table.items():
        assert _sha256(DATA / name) == sha, f"{name} changed: re-run tests/data/generators/make_flagship_models.py and update SHA256SUMS"
    assert all((DATA / name).stat().st_size < 2_000_000 for name in table)


def test_every_flagship_recipe_has_an_export():
    flagship = {load_recipe_file(p).name for p in RECIPES_DIR.glob("*.toml")} - {"gtcrn", "isnet-fp16", "isnet-uint8"}
    assert flagship == set(CASES)


def _io(values) -> dict[str, tuple[int, int]]:
    return {v.name: (v.type.tensor_type.elem_type, len(v.type.tensor_type.shape.dim)) for v in values}


@pytest.mark.parametrize("recipe_name", sorted(CASES))
def test_export_has_the_recipe_io_contract(recipe_name):
    """Same input and output names, dtypes and ranks as the recipe states for the published file."""
    recipe = load_recipe_file(RECIPES_DIR / f"{recipe_name}.toml")
    model = onnx.load(str(DATA / f"{CASES[recipe_name][0]}.onnx"))
    inputs, outputs = _io(model.graph.input), _io(model.graph.output)
    assert set(inputs) == set(recipe.inputs)
    assert set(outputs) == set(recipe.outputs)
    assert not [o.domain for o in model.opset_import if o.domain not in ("", "ai.onnx")]  # no custom ops
    for name, spec in recipe.inputs.items():
        if spec.dtype:
            assert onnx.helper.tensor_dtype_to_np_dtype(inputs[name][0]).name == spec.dtype
        if spec.shape:
            assert inputs[name][1] == len(spec.shape)


def _ops(name: str) -> list[onnx.NodeProto]:
    return list(onnx.load(str(DATA / f"{name}.onnx")).graph.node)


def test_exports_carry_the_published_graph_patterns():
    lama = _ops("lama")
    assert sum(n.op_type == "DFT" for n in lama) >= 2
    lama_model = onnx.load(str(DATA / "lama.onnx"))
    constants = {t.name: onnx.numpy_helper.to_array(t) for t in lama_model.graph.initializer}
    constants.update({n.output[0]: onnx.numpy_helper.to_array(n.attribute[0].t) for n in lama if n.op_type == "Constant" and n.attribute and n.attribute[0].type == onnx.AttributeProto.TENSOR})
    negative_steps = [n for n in lama if n.op_type == "Slice" and len(n.input) > 4 and n.input[4] in constants and (constants[n.input[4]] < 0).any()]
    assert negative_steps and any(int(constants[n.input[2]].min()) <= -(2**63) + 1 for n in negative_steps)

    wav = onnx.load(str(DATA / "wavtokenizer.onnx"))
    squeezed = {n.output[0] for n in wav.graph.node if n.op_type == "Squeeze"}
    stale = [v for v in wav.graph.value_info if v.name in squeezed and len(v.type.tensor_type.shape.dim) == 3]
    assert stale, "the ISTFT head must keep the stale 3-D value_info over its 1-D Squeeze"
    assert {"ConvTranspose", "Where", "Div", "Gather"} <= {n.op_type for n in wav.graph.node}

    assert {"GRU", "Atan"} <= {n.op_type for n in _ops("mpsenet")}
    assert {"LSTM", "ConvTranspose"} <= {n.op_type for n in _ops("scnet")}
    assert {"Softmax", "MatMul", "ConvTranspose"} <= {n.op_type for n in _ops("htdemucs")}
    assert {"Cast", "Round"} <= {n.op_type for n in _ops("migan")}


def _build(tmp_path: Path, recipe_name: str, browser: bool) -> tuple[int, dict, str]:
    export, shapes = CASES[recipe_name]
    source = DATA / f"{export}.onnx"
    args = ["build", recipe_name, "--source", str(source), "--sha256", _sha256(source), "--json", "--out", str(tmp_path / "dist")]
    for shape in shapes:
        args += ["--input", shape]
    if not browser:
        args.append("--no-browser")
    result = runner.invoke(app, args)
    report = json.loads(result.stdout) if result.stdout.startswith("{") else {}
    return result.exit_code, report, result.output


def _failed(report: dict) -> list:
    return [(c["stage"], c["ep"], c["variant"], c.get("output"), c.get("detail")) for c in report.get("checks", []) if c["status"] == "failed"]


def _assert_host_verified(recipe_name: str, code: int, report: dict, output: str, tmp_path: Path) -> None:
    assert code == 0, _failed(report) or output[-2000:]
    assert not _failed(report)
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


# uvr-mdx-vocals is uvr-mdx with another name and source file (same export, inputs and outputs):
# the browser build of uvr-mdx proves its package; it is built on the host only.
HOST_ONLY = {"uvr-mdx-vocals"}


@pytest.mark.parametrize("recipe_name", sorted(HOST_ONLY))
def test_flagship_recipe_builds_on_its_export_host(recipe_name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a built-in recipe's lock is ./pack.lock.json
    code, report, output = _build(tmp_path, recipe_name, browser=False)
    _assert_host_verified(recipe_name, code, report, output, tmp_path)


# Over a minute each on SwiftShader with the machine shared (measured 70-85 s; the rest 50-65 s).
SLOW_IN_BROWSER = {"lama", "htdemucs", "migan", "mp-senet"}


@pytest.mark.browser
@pytest.mark.parametrize("recipe_name", [pytest.param(n, marks=pytest.mark.slow_browser) if n in SLOW_IN_BROWSER else n for n in sorted(set(CASES) - HOST_ONLY)])
def test_flagship_recipe_builds_on_its_export_host_and_browser(recipe_name, tmp_path, monkeypatch):
    # One build proves both: the host checks run in every build, the browser checks after them.
    monkeypatch.chdir(tmp_path)
    code, report, output = _build(tmp_path, recipe_name, browser=True)
    _assert_host_verified(recipe_name, code, report, output, tmp_path)
    browser = {(c["ep"], c["variant"]): c["status"] for c in report["checks"] if c["stage"] == "browser"}
    # fp32 must pass on both EPs; fp16 on WebGPU needs shader-f16, which SwiftShader lacks.
    assert browser[("webgpu", "fp32")] == "passed" and browser[("wasm", "fp32")] == "passed", browser
    assert set(browser.values()) <= {"passed", "not-verifiable"}
