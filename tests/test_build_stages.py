"""The build's stage table: every setting is keyed by some stage, keys chain down the table, and
each stage keeps its contract (pipeline/stage_table.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pipeline.build import RECIPE_KEYS_OUTSIDE_KEYS, BuildOptions, BuildSettings, _Build, build_table
from pipeline.progress import Progress
from pipeline.recipe import Recipe
from pipeline.stage_table import Stage, StageContractBroken, StageRun, run_stage, stage_keys


def _table():
    return build_table(_Build(BuildOptions(target="t"), Progress.quiet(), out_dir=None))


def _settings(**recipe_changes) -> BuildSettings:
    recipe = {field.name: None for field in dataclasses.fields(Recipe)}
    recipe.update({"name": "m", "variants": ["fp16", "fp32"], "outputs": {}, "inputs": {}}, **recipe_changes)
    return BuildSettings(recipe, {"inputs_npz": None, "input_shapes": [], "browser": True, "gpu": False}, None, "1.30.0", "Chromium 150", {})


def _fetched(sha256: str = "a" * 64, uri: str = "https://example.com/m.onnx") -> dict:
    """The ledger after the fetch: the source as found (recipe.source) and the file it gave."""
    fetched = type("Fetched", (), {"path": Path("m.onnx"), "sha256": sha256, "checked_against": "--sha256"})()
    return {"recipe": type("Found", (), {"source": uri})(), "fetched": fetched}


def _keys(settings: BuildSettings, **fetch) -> dict[str, str]:
    table = _table()
    table[0] = dataclasses.replace(table[0], content=lambda ledger: {"model.onnx": ledger["fetched"].sha256})
    return stage_keys(table, settings, _fetched(**fetch))


def test_every_recipe_key_is_read_by_a_stage():
    read = {key for stage in _table() for key in stage.settings.recipe_keys}
    assert read == {field.name for field in dataclasses.fields(Recipe)} - set(RECIPE_KEYS_OUTSIDE_KEYS)


def test_every_artefact_a_stage_reads_is_made_by_an_earlier_stage():
    made = {"recipe"}
    for stage in _table():
        assert set(stage.reads) <= made, stage.name
        made |= set(stage.makes)


@pytest.mark.parametrize("key, first_changed", [("repairs", "repair"), ("seed", "samples"), ("variants", "convert"), ("chunk_mib", "models"),
                                                ("outputs", "samples"), ("license", "files"), ("loader_select", "judge"), ("name", "write")])
def test_a_setting_changes_its_stage_and_every_stage_after_it_only(key, first_changed):
    before, after = _keys(_settings()), _keys(_settings(**{key: "changed"}))
    names = list(before)
    changed = [name for name in names if before[name] != after[name]]
    assert changed[0] == first_changed
    assert changed[-1] == names[-1]  # the package key follows every setting


def test_the_browser_and_the_source_bytes_are_keyed():
    base = _keys(_settings())
    other_browser = _keys(dataclasses.replace(_settings(), browser="Chromium 151"))
    assert other_browser["convert"] == base["convert"] and other_browser["write"] != base["write"]
    other_source = _keys(_settings(), sha256="b" * 64)
    assert all(other_source[name] != base[name] for name in base)


def test_where_the_source_was_found_keys_only_the_write_that_records_it():
    """The same bytes from another URL: every stage's result is the same, but the report names the
    source, so the stored package of the other URL is not reused."""
    base, elsewhere = _keys(_settings()), _keys(_settings(), uri="https://mirror.example.org/m.onnx")
    assert [name for name in base if base[name] != elsewhere[name]] == ["write"]


def test_a_stage_that_breaks_its_contract_is_named():
    record = StageRun()
    reads_missing = Stage("late", lambda ledger: {}, lambda settings: None, reads=("feeds",))
    with pytest.raises(StageContractBroken, match="stage late reads feeds"):
        run_stage(reads_missing, {}, record)
    makes_other = Stage("sloppy", lambda ledger: {"extra": 1}, lambda settings: None, makes=("model",))
    with pytest.raises(StageContractBroken, match="stage sloppy made \\['extra'\\]"):
        run_stage(makes_other, {}, record)
    good = Stage("good", lambda ledger: {"model": 1}, lambda settings: None, makes=("model",))
    ledger: dict = {}
    run_stage(good, ledger, record)
    assert ledger == {"model": 1} and "good" in record.seconds


def test_a_cached_stage_is_kept_under_its_key_and_read_back(tmp_path, monkeypatch):
    from pipeline.stage_table import StageCache

    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PACK_CACHE_URL", raising=False)
    runs = []

    def run(ledger):
        runs.append(1)
        return {"value": ledger["x"] * 2}

    def save(made, folder):
        (folder / "value.txt").write_text(str(made["value"]))
        return True

    stage = Stage("double", run, lambda settings: None, reads=("x",), makes=("value",), cache=StageCache(save, lambda folder: {"value": int((folder / "value.txt").read_text())}))
    for key in ("k1", "k1", "k2"):
        ledger = {"x": 21}
        record = StageRun()
        run_stage(stage, ledger, record, key=key)
        assert ledger["value"] == 42
    assert len(runs) == 2 and (tmp_path / "cache" / "stages" / "double" / "k1" / ".pack-entry.json").is_file()
