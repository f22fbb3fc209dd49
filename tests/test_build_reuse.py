"""An unchanged rebuild reuses the stored package of the build with the same inputs: byte-identical
files (manifest and report included), no stage re-run; any input that changes the result builds again."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import onnx
import onnx.numpy_helper
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from build_helpers import STAGE_WORK, conv_model, save

runner = CliRunner()


def build(*args: str):
    return runner.invoke(app, ["build", *args])


def files_of(package: Path) -> dict[str, bytes]:
    return {p.relative_to(package).as_posix(): p.read_bytes() for p in sorted(package.rglob("*")) if p.is_file()}


# Bytes no earlier run built: the suite's cache (and the shared store behind it) outlives a run,
# and a stored build of an earlier run would answer the "changed" builds below.
RUN_NONCE = uuid.uuid4().hex


def reused_model():
    model = conv_model(channels=5)  # no other test builds these bytes: the stored builds are this file's
    model.doc_string = f"test_build_reuse run {RUN_NONCE}"
    return model


@pytest.fixture
def model_file(tmp_path) -> Path:
    return save(reused_model(), tmp_path / "reused-conv.onnx")


def _must_not_run(*args, **kwargs):
    raise AssertionError("a stage ran although the stored build has the same inputs")


def test_an_unchanged_rebuild_links_the_stored_package_byte_for_byte(model_file, tmp_path, monkeypatch):
    first = build(str(model_file), "--no-browser", "--out", str(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    for work in STAGE_WORK:
        monkeypatch.setattr(work, _must_not_run)
    again = build(str(model_file), "--no-browser", "--out", str(tmp_path / "b"))
    assert again.exit_code == 0, again.output
    assert "unchanged: the inputs match the stored build" in again.output
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")
    # in place, over the same package: still the same bytes, and nothing left beside it
    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["reused-conv"]
    # --json prints the stored report
    as_json = build(str(model_file), "--no-browser", "--json", "--out", str(tmp_path / "c"))
    assert json.loads(as_json.stdout) == json.loads((tmp_path / "a" / "reused-conv" / "report.json").read_text())


@pytest.mark.parametrize("change", ["source bytes", "recipe key", "pack setting", "option", "--no-reuse"])
def test_any_input_that_changes_the_result_builds_again(model_file, tmp_path, monkeypatch, change):
    import pipeline.stages.convert

    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    ran = []
    real = pipeline.stages.convert.make_variants
    monkeypatch.setattr(pipeline.stages.convert, "make_variants", lambda *a, **k: ran.append(1) or real(*a, **k))
    args = [str(model_file), "--no-browser", "--out", str(tmp_path / "b")]
    if change == "source bytes":
        model = reused_model()
        weights = model.graph.initializer[0]  # halved: zeros would make the reference degenerate (not-verifiable)
        weights.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(weights) / 2, weights.name))
        save(model, model_file)
    elif change == "recipe key":
        recipe = tmp_path / "reused-conv.toml"
        recipe.write_text(f'source.uri = "{model_file.name}"\nvariants = ["fp32"]\n')
        args[0] = str(recipe)
    elif change == "pack setting":
        monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    elif change == "option":
        args += ["--input", "x=1x3x16x16"]
    else:
        args.append("--no-reuse")
    result = build(*args)
    assert result.exit_code == 0, result.output
    assert ran == [1] and "unchanged:" not in result.output, result.output


def test_a_failed_build_is_never_reused(model_file, tmp_path):
    recipe = tmp_path / "strict.toml"
    # fp16 refused and required: the package fails (a refused variant alone would not fail it)
    recipe.write_text(f'source.uri = "{model_file.name}"\n[outputs.y.fp16]\nmax_abs = 0.0\n[verify]\nrequire = ["fp16"]\n')
    for out in ("a", "b"):
        result = build(str(recipe), "--no-browser", "--out", str(tmp_path / out))
        assert result.exit_code == 1 and "unchanged:" not in result.output


def test_where_caches_live_and_other_commands_settings_key_nothing(model_file, tmp_path, monkeypatch):
    """A build keyed with the shared cache's URL in it would miss on every machine that spells the
    URL differently or has none: the settings of the caches, of parallelism and of the commands
    that only move built packages (publish, export, cache; a CI job may set them for all its
    steps) leave every key as it is."""
    from pipeline.cli import load_command
    from pipeline.build import result_settings

    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    declared = {
        name for command in ("publish", "export", "cache") for param in load_command(command).params
        for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    }
    assert {"PACK_CACHE_URL", "PACK_BUCKET", "PACK_EXPORT_HOST"} <= declared
    (tmp_path / "store").mkdir()
    for name in sorted(declared | {"PACK_JOBS", "PACK_TEST_WORKERS"}):
        monkeypatch.setenv(name, str(tmp_path / "store") if name == "PACK_CACHE_URL" else "1")
    assert not set(result_settings()) & (declared | {"PACK_JOBS", "PACK_TEST_WORKERS", "PACK_CACHE_DIR"})
    again = build(str(model_file), "--no-browser", "--out", str(tmp_path / "b"))
    assert again.exit_code == 0, again.output
    assert "unchanged: the inputs match the stored build" in again.output
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")


def test_a_reused_package_says_its_warnings_and_writes_its_lock_entry_as_building_would(model_file, tmp_path):
    """A second machine (another folder: its own lock file) that links the stored package gets
    what building gives besides it: the warning about its float16 inputs, the fp16 entry of its
    lock file; and a source found elsewhere is not answered with a package that names the first."""
    import shutil

    import numpy as np

    npz = tmp_path / "half.npz"
    np.savez(npz, x=np.random.default_rng(1).uniform(-1, 1, (1, 3, 16, 16)).astype(np.float16))
    results = {}
    for machine in ("a", "b"):
        folder = tmp_path / machine
        folder.mkdir()
        shutil.copy(model_file, folder / "model.onnx")
        (folder / "kept.toml").write_text('source.uri = "model.onnx"\n[fp16]\nkeep_nodes = ["conv2"]\n')
        results[machine] = build(str(folder / "kept.toml"), "--inputs", str(npz), "--no-browser", "--out", str(folder / "dist"))
        assert results[machine].exit_code == 0, results[machine].output
        warnings = [line for line in results[machine].output.splitlines() if line.startswith("warning:")]
        assert warnings == [f"warning: --inputs {npz}: 'x' is float16, cast to the model's float32 (exact, no value changes)"], machine
        lock = json.loads((folder / "kept.lock.json").read_text())
        assert [entry["node"] for entry in lock["kept"]["fp16"]["kept"]] == ["conv2"], machine
    assert "unchanged:" not in results["a"].output and "unchanged:" in results["b"].output
    assert files_of(tmp_path / "a" / "dist" / "kept") == files_of(tmp_path / "b" / "dist" / "kept")
    # the same bytes under another name: built again (from the cached stages), the report names it
    shutil.copy(model_file, tmp_path / "b" / "renamed.onnx")
    (tmp_path / "b" / "kept.toml").write_text('source.uri = "renamed.onnx"\n[fp16]\nkeep_nodes = ["conv2"]\n')
    renamed = build(str(tmp_path / "b" / "kept.toml"), "--inputs", str(npz), "--no-browser", "--out", str(tmp_path / "c"))
    assert renamed.exit_code == 0 and "unchanged:" not in renamed.output, renamed.output
    assert json.loads((tmp_path / "c" / "kept" / "report.json").read_text())["source"]["uri"] == "renamed.onnx"
