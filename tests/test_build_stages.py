"""The build's stage table: every setting is keyed by some stage, keys chain down the table and
change exactly when a result could (settings, code that runs, tools by version, not by path), and
each stage keeps its contract (pipeline/stage_table.py, pipeline/stages/)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from pipeline.build import RECIPE_KEYS_OUTSIDE_KEYS, BuildSettings, result_settings
from pipeline.keys import clear_code_hashes, code_hash
from pipeline.recipe import Recipe
from pipeline.stage_table import Stage, StageContractBroken, StageRun, run_stage, stage_keys
from pipeline.stages import ARTEFACTS, RUNNER_ARTEFACTS, STAGES

PIPELINE = Path(__file__).resolve().parent.parent / "pipeline"


def _settings(**recipe_changes) -> BuildSettings:
    recipe = {field.name: None for field in dataclasses.fields(Recipe)}
    recipe.update({"name": "m", "variants": ["fp16", "fp32"], "outputs": {}, "inputs": {}}, **recipe_changes)
    return BuildSettings(recipe, {"inputs_npz": None, "input_shapes": [], "browser": True, "gpu": False, "engines": ["chromium"]}, None, "1.30.0", "Chromium 150", "25.2.0", {}, {})


def _fetched(sha256: str = "a" * 64, uri: str = "https://example.com/m.onnx") -> dict:
    """The ledger after the fetch: the file it gave and how it was found."""
    fetched = type("Fetched", (), {"path": Path("m.onnx"), "sha256": sha256, "checked_against": "--sha256", "uri": uri})()
    return {"recipe": None, "fetched": fetched}


def _keys(settings: BuildSettings, **fetch) -> dict[str, str]:
    table = list(STAGES)
    table[0] = dataclasses.replace(table[0], content=lambda artefacts: {"model.onnx": artefacts["fetched"].sha256})
    return stage_keys(table, settings, _fetched(**fetch))


def test_every_recipe_key_is_read_by_a_stage_and_every_setting_named_exists():
    read = {name.split(".", 1)[1] for stage in STAGES for name in stage.settings if name.startswith("recipe.")}
    assert read == {field.name for field in dataclasses.fields(Recipe)} - set(RECIPE_KEYS_OUTSIDE_KEYS)
    fields = {field.name for field in dataclasses.fields(BuildSettings)}
    options = set(_settings().options)
    for stage in STAGES:
        for name in stage.settings:
            top, _, rest = name.partition(".")
            assert top in fields, (stage.name, name)
            assert top != "options" or rest in options, (stage.name, name)


def test_every_artefact_is_typed_made_by_one_stage_and_read_after_it():
    made = set(RUNNER_ARTEFACTS)
    for stage in STAGES:
        assert set(stage.reads) <= made, stage.name
        assert not set(stage.makes) & made, f"{stage.name} remakes {set(stage.makes) & made}"
        made |= set(stage.makes)
    assert made == set(ARTEFACTS)


def test_the_environment_keyed_is_an_allow_list_of_result_settings():
    # where tools and caches lie, how many builds run, what publish/export do: none is keyed
    assert set(result_settings()) == {"PACK_WEBGPU_KERNELS", "PACK_WEBGPU_KERNELS_MAX_GMAC", "PACK_WEBGPU_KERNELS_TIMEOUT_S", "PACK_WEBGPU_KERNELS_AUDIT_TIMEOUT_S"}


def test_a_different_chromium_path_of_the_same_version_keeps_every_key(tmp_path, monkeypatch):
    from pipeline.build import build_settings, build_locks
    from pipeline.stages.context import BuildOptions

    versions = {}
    for name in ("a", "b"):
        chromium = tmp_path / name / "chromium"
        chromium.parent.mkdir()
        chromium.write_text("#!/bin/sh\necho 'Chromium 150.0.7871.100 built on Debian'\n")
        chromium.chmod(0o755)
        monkeypatch.setenv("PACK_CHROMIUM", str(chromium))
        monkeypatch.setenv("PACK_LAVAPIPE_DIR", str(tmp_path / name / "mesa"))
        (tmp_path / name / "mesa").mkdir()
        (tmp_path / name / "mesa" / "ready").write_text("25.2.0\n")
        recipe = Recipe(name="m")
        options = BuildOptions(target="m.onnx")
        settings = build_settings(recipe, options, build_locks(recipe, options))
        assert settings.browser == "Chromium 150.0.7871.100 built on Debian" and settings.mesa == "25.2.0"
        versions[name] = _keys(settings)
        firefox = tmp_path / name / "firefox"  # the other engines are keyed by version too, not by path
        firefox.write_text("#!/bin/sh\necho 'Mozilla Firefox 140.12.0esr'\n")
        firefox.chmod(0o755)
        monkeypatch.setenv("PACK_FIREFOX", str(firefox))
        with_firefox = build_settings(recipe, BuildOptions(target="m.onnx", engines=("chromium", "firefox")), build_locks(recipe, options))
        assert with_firefox.engines == {"firefox": "Mozilla Firefox 140.12.0esr"}
        versions[name + "-firefox"] = _keys(with_firefox)
    assert versions["a"] == versions["b"] and versions["a-firefox"] == versions["b-firefox"]


@pytest.mark.parametrize("key, first_changed", [("repairs", "repair"), ("seed", "samples"), ("variants", "convert"), ("chunk_mib", "models"),
                                                ("outputs", "samples"), ("license", "files"), ("loader_select", "judge"), ("name", "write")])
def test_a_setting_changes_its_stage_and_every_stage_after_it_only(key, first_changed):
    before, after = _keys(_settings()), _keys(_settings(**{key: "changed"}))
    names = list(before)
    changed = [name for name in names if before[name] != after[name]]
    assert changed[0] == first_changed
    assert changed[-1] == names[-1]  # the package key follows every setting


def test_the_browser_the_lock_entry_and_the_source_bytes_are_keyed():
    base = _keys(_settings())
    other_browser = _keys(dataclasses.replace(_settings(), browser="Chromium 151"))
    assert other_browser["convert"] == base["convert"] and other_browser["write"] != base["write"]
    locked = _keys(dataclasses.replace(_settings(), fp16_lock={"model_sha256": "c" * 64, "kept": []}))
    assert [name for name in base if locked[name] != base[name]][0] == "convert"
    other_firefox = _keys(dataclasses.replace(_settings(), engines={"firefox": "Mozilla Firefox 141.0"}))
    assert [name for name in base if other_firefox[name] != base[name]][0] == "browser_verify"
    other_source = _keys(_settings(), sha256="b" * 64)
    assert all(other_source[name] != base[name] for name in base)


def test_where_the_source_was_found_keys_only_the_write_that_records_it():
    """The same bytes from another URL: every stage's result is the same, but the report names the
    source, so the stored package of the other URL is not reused."""
    base, elsewhere = _keys(_settings()), _keys(_settings(), uri="https://mirror.example.org/m.onnx")
    assert [name for name in base if base[name] != elsewhere[name]] == ["write"]


@pytest.fixture
def pipeline_copy(tmp_path):
    copy = tmp_path / "pipeline"
    shutil.copytree(PIPELINE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    yield copy
    clear_code_hashes()


def _code_hashes(copy: Path) -> dict[str, str]:
    clear_code_hashes()
    return {stage.name: code_hash(stage.code_names, copy) for stage in STAGES}


def test_a_comment_or_docstring_edit_in_any_stage_module_keeps_every_code_key(pipeline_copy):
    before = _code_hashes(pipeline_copy)
    for module in sorted((pipeline_copy / "stages").glob("*.py")):
        text = module.read_text()
        edited = text.replace('"""', '"""Reworded. ', 1) + "\n# a note for the next reader\n"
        edited = edited.replace("\ndef ", "\n# why this function exists\ndef ", 1)
        module.write_text(edited)
    assert _code_hashes(pipeline_copy) == before


# (file, text, replacement, the first stage whose code it is): a one-token change in code a stage
# reaches through its imports or declares
REACHED = [
    ("stages/repair.py", "_KEPT_MODEL_LIMIT = 1_900_000_000", "_KEPT_MODEL_LIMIT = 1_900_000_001", "repair"),  # the stored format
    ("graph/passes/neg_step_slice.py", None, None, "repair"),  # a repair's rewrite, found by discovery
    ("verify/judgement/thresholds.py", None, None, "convert"),  # a bound
    ("verify/engines/session_worker.py", None, None, "samples"),  # run as `python -m`, never imported (the samples stage tries shapes on onnxruntime)
    ("verify/engines/browser/page/runner.js", None, None, "browser_verify"),  # the page's code
    ("manifest.schema.json", '"type": "object"', '"type":  "object"', "judge"),
    ("report/render.py", None, None, "write"),
]


@pytest.mark.parametrize("relative, text, replacement, first", REACHED)
def test_a_one_token_change_in_code_a_stage_reaches_changes_its_code_key_and_none_above(pipeline_copy, relative, text, replacement, first):
    before = _code_hashes(pipeline_copy)
    path = pipeline_copy / relative
    original = path.read_text()
    if text is None:  # a new statement at the end of the module (or of the page's script)
        edited = original + ("\nCHANGED = 1\n" if path.suffix == ".py" else "\nconst changed = 1;\n")
    else:
        assert text in original, relative
        edited = original.replace(text, replacement, 1)
    path.write_text(edited)
    after = _code_hashes(pipeline_copy)
    names = [stage.name for stage in STAGES]
    changed = [name for name in names if before[name] != after[name]]
    assert changed and changed[0] == first, changed
    # the stages above it never reach it; those below follow through their keys' chaining
    assert all(before[name] == after[name] for name in names[: names.index(first)])


def test_the_python_minor_version_is_keyed(monkeypatch, pipeline_copy):
    import sys

    before = _code_hashes(pipeline_copy)["fetch"]
    monkeypatch.setattr(sys, "version_info", (3, 99, 0))
    assert _code_hashes(pipeline_copy)["fetch"] != before


def test_a_stage_that_breaks_its_contract_is_named():
    record = StageRun()
    reads_missing = Stage("late", lambda artefacts, context: {}, reads=("feeds",))
    with pytest.raises(StageContractBroken, match="stage late reads feeds"):
        run_stage(reads_missing, {}, record)
    makes_other = Stage("sloppy", lambda artefacts, context: {"extra": 1}, makes=("model",))
    with pytest.raises(StageContractBroken, match="stage sloppy made \\['extra'\\]"):
        run_stage(makes_other, {}, record)
    peeks = Stage("peeking", lambda artefacts, context: {"model": artefacts["feeds"]}, reads=("recipe",), makes=("model",))
    with pytest.raises(StageContractBroken, match="stage peeking read 'feeds', which it does not declare"):
        run_stage(peeks, {"recipe": 1, "feeds": 2}, record)
    mistyped = Stage("mistyped", lambda artefacts, context: {"model": "not a model"}, makes=("model",))
    with pytest.raises(StageContractBroken, match="stage mistyped made 'model' as str, not ModelProto"):
        run_stage(mistyped, {}, record, types={"model": "onnx:ModelProto"})
    good = Stage("good", lambda artefacts, context: {"model": artefacts["recipe"] + 1}, reads=("recipe",), makes=("model",))
    ledger: dict = {"recipe": 1, "feeds": 2}
    run_stage(good, ledger, record)
    assert ledger["model"] == 2 and "good" in record.seconds


def test_a_cached_stage_is_kept_under_its_key_and_read_back(tmp_path, monkeypatch):
    from pipeline.stage_table import StageCache

    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    runs = []

    def run(artefacts, context):
        runs.append(1)
        return {"value": artefacts["x"] * 2}

    def save(made, folder):
        (folder / "value.txt").write_text(str(made["value"]))
        return True

    stage = Stage("double", run, reads=("x",), makes=("value",), cache=StageCache(save, lambda folder: {"value": int((folder / "value.txt").read_text())}))
    for key in ("k1", "k1", "k2"):
        ledger = {"x": 21}
        record = StageRun()
        run_stage(stage, ledger, record, key=key)
        assert ledger["value"] == 42
    assert len(runs) == 2 and (tmp_path / "cache" / "stages" / "double" / "k1" / ".pack-entry.json").is_file()


def test_a_rebuild_right_after_a_lock_write_reuses_its_stored_package(tmp_path):
    """The first build of a recipe searches the fp16 nodes to keep and writes them in its lock; the
    next build reads that entry (its convert key holds it) and must still find the package."""
    from typer.testing import CliRunner

    import pipeline.stages.convert
    from build_helpers import conv_model, save
    from pipeline.cli import app

    model = conv_model(channels=6)
    model.doc_string = f"lock write {tmp_path.name}"  # bytes no other run stored
    save(model, tmp_path / "locked.onnx")
    recipe = tmp_path / "locked.toml"
    recipe.write_text('source.uri = "locked.onnx"\nvariants = ["fp16", "fp32"]\n[fp16]\nkeep_nodes = ["conv2"]\n')
    runner = CliRunner()
    first = runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "a")])
    assert first.exit_code == 0, first.output
    lock = json.loads((tmp_path / "locked.lock.json").read_text())
    assert [entry["node"] for entry in lock["locked"]["fp16"]["kept"]] == ["conv2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pipeline.stages.convert, "make_variants", lambda *a, **k: pytest.fail("converted again after the lock write"))
        again = runner.invoke(app, ["build", str(recipe), "--no-browser", "--out", str(tmp_path / "b")])
    assert again.exit_code == 0, again.output
    assert "unchanged: the inputs match the stored build" in again.output
    assert (tmp_path / "a" / "locked" / "manifest.json").read_bytes() == (tmp_path / "b" / "locked" / "manifest.json").read_bytes()
