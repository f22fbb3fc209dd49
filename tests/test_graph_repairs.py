"""The repair registry: discovery of the repair modules, a repair added from outside the folder
running end to end (detection, the build's repair stage, `pack inspect`), the runner's order and
its last stage, the IR version table, and the fp16 conversion cache key."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
from typer.testing import CliRunner

from graph_helpers import assert_no_op, assert_repair, clean_conv_model, neg_slice_model, parse
from pipeline.stages.repair import repair as _repair, repair_settings
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.graph import repairs
from pipeline.graph.hazards import detect_hazards
from pipeline.graph.passes.base import PassSettings
from pipeline.keys import clear_code_hashes, code_hash, code_sources
from pipeline.precision.variants import CONVERSION_CODE
from pipeline.recipe import Recipe

PASSES_DIR = Path(repairs.__file__).resolve().parent / "passes"

# A repair written the way a contributor adds one: a module with one Repair, nothing else to edit.
DOUBLE_NEG = '''
"""Neg(Neg(x)) is x."""
from pipeline.graph.passes.base import BUNDLE_EPS, PassResult, Repair, hazard
from pipeline.graph.passes.util import copy_model, node_label


def _pairs(graph):
    producers = {o: n for n in graph.node for o in n.output}
    return [(i, n) for i, n in enumerate(graph.node)
            if n.op_type == "Neg" and producers.get(n.input[0]) is not None and producers[n.input[0]].op_type == "Neg"]


def find(model):
    return [hazard(node_label(n, i), "Neg", "double-neg", list(BUNDLE_EPS), "double_neg", "two Negs in a row")
            for i, n in _pairs(model.graph)]


def rewrite(model, settings):
    pairs = _pairs(model.graph)
    if not pairs:
        return PassResult(model, False)
    model = copy_model(model)
    producers = {o: n for n in model.graph.node for o in n.output}
    records = []
    for index, _ in pairs:
        node = model.graph.node[index]
        node.op_type = "Identity"
        node.input[0] = producers[node.input[0]].input[0]
        records.append({"node": node_label(node, index), "what": "Neg(Neg(x)) -> Identity(x)"})
    return PassResult(model, True, records)


double_neg = Repair(name="double_neg", order=15, stage="source", find=find, rewrite=rewrite)
'''


def _double_neg_model() -> onnx.ModelProto:
    return parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
  a = Neg (x)
  b = Neg (a)
  y = Relu (b)
}""")


def _package(tmp_path: Path, name: str, modules: dict[str, str]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    for module, text in modules.items():
        (folder / f"{module}.py").write_text(textwrap.dedent(text))
    return name


@pytest.fixture
def extra_package(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield lambda name, modules: _package(tmp_path, name, modules)
    for module in [m for m in sys.modules if m.startswith("extra_")]:
        del sys.modules[module]


def test_every_module_in_the_passes_folder_is_a_registered_repair_in_run_order():
    modules = {p.stem for p in PASSES_DIR.glob("*.py")} - {"__init__"} - repairs.HELPER_MODULES
    assert {r.rewrite.__module__.rsplit(".", 1)[1] for r in repairs.repairs()} == modules
    orders = [r.order for r in repairs.repairs()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)
    assert repairs.repairs()[-1].name == "ir_version_cap" and repairs.repairs()[-1].stage == "last"
    assert [r.name for r in repairs.in_stage("source")] == ["fold_if", "neg_step_slice", "lift_constant_weights", "stale_shapes"]


def test_a_repair_added_as_one_module_runs_end_to_end(extra_package, monkeypatch, tmp_path):
    package = extra_package("extra_repairs", {"double_neg": DOUBLE_NEG})
    assert [r.name for r in repairs.discover(package)] == ["double_neg"]
    monkeypatch.setattr(repairs, "repairs", lambda: repairs.discover(repairs.PACKAGE, package))
    model = _double_neg_model()

    assert_repair("double_neg", model)
    assert_no_op("double_neg", clean_conv_model())
    assert [(h["node"], h["hazard"], h["repair"]) for h in detect_hazards(model)] == [("Neg#1", "double-neg", "double_neg")]
    assert repairs.auto_repairs(model) == ["double_neg"]

    repaired, steps = _repair(model, Recipe(name="neg"))
    assert [s["name"] for s in steps] == ["double_neg"] and steps[0]["changed"]
    assert [n.op_type for n in repaired.graph.node] == ["Neg", "Identity", "Relu"]

    path = tmp_path / "neg.onnx"
    onnx.save(model, path)
    result = CliRunner().invoke(app, ["inspect", str(path), "--no-browser", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["repairs"] == ["double_neg"]


def test_discovery_refuses_modules_that_break_the_rules(extra_package):
    empty = extra_package("extra_empty", {"nothing": "X = 1\n"})
    with pytest.raises(repairs.RegistryError, match="extra_empty.nothing: a repair module defines exactly one Repair, found 0"):
        repairs.discover(empty)
    clash = extra_package("extra_clash", {"double_neg": DOUBLE_NEG, "other": DOUBLE_NEG.replace('name="double_neg"', 'name="other"')})
    with pytest.raises(repairs.RegistryError, match="share the order 15"):
        repairs.discover(clash)
    twice = extra_package("extra_twice", {"fold_if": DOUBLE_NEG.replace('name="double_neg"', 'name="fold_if"')})
    with pytest.raises(repairs.RegistryError, match="repairs 'fold_if' and 'fold_if' share the name"):
        repairs.discover(repairs.PACKAGE, twice)


def test_run_passes_sorts_dedupes_and_always_finishes_with_the_ir_cap():
    model = neg_slice_model()
    model.ir_version = 14
    settings = PassSettings(runtime_version="1.30.0", max_ir_version=13)
    repaired, steps = repairs.run_passes(model, ["stale_shapes", "neg_step_slice", "neg_step_slice"], settings)
    assert [s["name"] for s in steps] == ["neg_step_slice", "stale_shapes", "ir_version_cap"]
    assert repaired.ir_version == 13 and model.ir_version == 14
    _, unfinished = repairs.run_passes(model, ["neg_step_slice"], finish=False)
    assert [s["name"] for s in unfinished] == ["neg_step_slice"]
    _, clean = repairs.run_passes(neg_slice_model(), [])
    assert clean == []  # the cap records a step only when it changes something or has a note
    with pytest.raises(KeyError, match="unknown repair 'nope'; known: .*fold_if"):
        repairs.run_passes(model, ["nope"])


def test_the_ir_cap_lowers_to_the_runtimes_measured_ceiling_and_never_below_what_the_opsets_need():
    cap = repairs.get("ir_version_cap")
    model = clean_conv_model()
    model.ir_version = 14
    capped = cap(model, PassSettings(runtime_version="1.22.0", max_ir_version=10))
    assert capped.changed and capped.model.ir_version == 10 and model.ir_version == 14
    assert capped.records == [{"what": "IR version 14 -> 10 (onnxruntime-web 1.22.0 reads up to 10)"}]
    assert not cap(capped.model, PassSettings(runtime_version="1.22.0", max_ir_version=10)).changed  # idempotent
    assert not cap(model, PassSettings()).changed  # no runtime known (pack inspect): nothing to cap to
    # the cap never goes below what the opsets need: opset 17 needs IR 8
    assert cap(model, PassSettings(runtime_version="x", max_ir_version=5)).model.ir_version == 8


def test_the_build_caps_the_ir_version_for_the_recipe_runtime():
    model = clean_conv_model()
    model.ir_version = 14
    capped, steps = _repair(model, Recipe(name="m"))  # the default runtime, its IR ceiling measured from the release
    settings = repair_settings(Recipe(name="m"))
    assert settings.max_ir_version == 13 and capped.ir_version == 13
    assert steps == [{"name": "ir_version_cap", "changed": True, "records": [{"what": f"IR version 14 -> 13 (onnxruntime-web {settings.runtime_version} reads up to 13)"}]}]


def test_conversion_key_follows_every_module_the_conversion_imports(tmp_path):
    package_dir = Path(repairs.__file__).resolve().parent.parent
    copy = tmp_path / "pipeline"
    shutil.copytree(package_dir, copy, ignore=shutil.ignore_patterns("__pycache__"))
    names = {p.relative_to(copy).as_posix() for p in code_sources(CONVERSION_CODE, copy)}
    assert {"graph/passes/util.py", "graph/passes/base.py", "graph/repairs.py", "precision/fp16.py", "runtime.py"} <= names
    key = code_hash(CONVERSION_CODE, copy)
    assert key == code_hash(CONVERSION_CODE, copy)
    for edited in ("graph/passes/util.py", "graph/passes/base.py", "runtime.py"):
        path = copy / edited
        original = path.read_text()
        path.write_text(original + "\n# a comment changes nothing that runs\n")
        clear_code_hashes()
        assert code_hash(CONVERSION_CODE, copy) == key, edited
        path.write_text(original + "\nEDITED = 1\n")
        clear_code_hashes()
        assert code_hash(CONVERSION_CODE, copy) != key, edited
        path.write_text(original)
    clear_code_hashes()
    assert code_hash(CONVERSION_CODE, copy) == key
    (copy / "publish" / "plan.py").write_text("NOT_PART_OF_THE_CONVERSION = 1\n")
    clear_code_hashes()
    assert code_hash(CONVERSION_CODE, copy) == key


def test_fp16_conversion_keeps_the_ir_version_the_build_capped():
    """The build caps once, before conversion; the shipped fp16 variant relies on this."""
    from pipeline.precision.fp16 import convert_to_fp16

    model = clean_conv_model()
    model.ir_version = 14
    capped, _ = _repair(model, Recipe(name="m"), PassSettings(runtime_version="1.20.1", max_ir_version=10))
    converted, steps = convert_to_fp16(capped)
    assert converted.ir_version == 10
    assert [s["name"] for s in steps] == [
        "rename_converter_names", "detach_consumed_outputs", "name_unnamed_nodes", "fp16_convert", "onnx_checker",
    ]


@pytest.mark.parametrize(
    "recipe_tail, message",
    [
        ('[repairs]\npasses = ["nope"]\n', "m.toml: key 'repairs.passes': unknown repair 'nope'; known: detach_consumed_outputs, fold_if"),
        # the after-conversion repairs the typed conversion made dead, removed
        ('[repairs]\npasses = ["topological_sort"]\n', "m.toml: key 'repairs.passes': unknown repair 'topological_sort'; known: detach_consumed_outputs, fold_if"),
        ('[repairs]\npasses = ["cast_retarget"]\n', "m.toml: key 'repairs.passes': unknown repair 'cast_retarget'; known: detach_consumed_outputs, fold_if"),
        ('[runtime]\nversion = "1.18.0"\n', "m.toml: key 'runtime.version': onnxruntime-web 1.18.0 is older than 1.19, the oldest release whose entry points are ES module bundles"),
    ],
    ids=["unknown-repair", "removed-topological-sort", "removed-cast-retarget", "runtime-older-than-1.19"],
)
def test_build_refuses_what_the_registry_cannot_run_with_one_error_line(tmp_path, recipe_tail, message):
    onnx.save(clean_conv_model(), tmp_path / "m.onnx")
    recipe = tmp_path / "m.toml"
    recipe.write_text('source.uri = "m.onnx"\n' + recipe_tail)
    result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "dist")])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and message in errors[0], result.output
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").iterdir())


def test_changing_the_runtime_version_gives_every_variant_the_ir_that_runtime_reads(tmp_path, monkeypatch):
    """The fp16 conversion is cached; its key must follow the repairs' settings, or a build for an
    older runtime reuses the fp16 model converted for a newer one (seen: fp32 at IR 11, fp16 at 12)."""
    from pipeline.precision.variants import make_variants

    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    source = clean_conv_model()
    source.ir_version = 12
    source_sha = hashlib.sha256(source.SerializeToString()).hexdigest()
    # (the ceilings as measured from those releases: runtime tests check them on the real packages)
    for version, ir in (("1.30.0", 12), ("1.23.2", 11), ("1.20.1", 10), ("1.30.0", 12)):
        recipe = Recipe(name="m", runtime_version=version, variants=["fp16", "fp32"])
        settings = PassSettings(runtime_version=version, max_ir_version={"1.30.0": 13, "1.23.2": 11, "1.20.1": 10}[version])
        repaired, _ = _repair(source, recipe, settings)
        made = make_variants(repaired, recipe, source_sha, settings=settings)
        assert {v.name: v.model.ir_version for v in made.variants} == {"fp16": ir, "fp32": ir}, version
