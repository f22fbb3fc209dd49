"""The flagship exports (tests/data/flagship/): the committed files, with the graph patterns and the
I/O contract of the published models. Their builds: test_build_flagship_{images,separation,speech}.py."""

import onnx
import pytest

from flagship_helpers import BROWSER_BUILDS, CASES, DATA, HOST_ONLY, sha256
from pipeline.recipe import RECIPES_DIR, load_recipe_file


def _table() -> dict[str, str]:
    rows = [line.split() for line in (DATA / "SHA256SUMS").read_text().splitlines() if line.strip()]
    return {name: sha for sha, name in rows}


def test_the_committed_exports_are_the_ones_the_table_lists():
    table = _table()
    assert sorted(table) == sorted(p.name for p in DATA.glob("*.onnx"))
    for name, sha in table.items():
        assert sha256(DATA / name) == sha, f"{name} changed: re-run tests/data/generators/make_flagship_models.py and update SHA256SUMS"
    assert all((DATA / name).stat().st_size < 2_000_000 for name in table)


def test_every_flagship_recipe_has_an_export():
    flagship = {load_recipe_file(p).name for p in RECIPES_DIR.glob("*.toml")} - {"gtcrn", "isnet-fp16", "isnet-uint8"}
    assert flagship == set(CASES)
    builds = [name for group in BROWSER_BUILDS.values() for name in group]
    assert sorted(builds + sorted(HOST_ONLY)) == sorted(CASES)  # each recipe built once, by one module


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
