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
from build_helpers import conv_model, save

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
    import pipeline.build

    first = build(str(model_file), "--no-browser", "--out", str(tmp_path / "a"))
    assert first.exit_code == 0, first.output
    for stage in ("make_variants", "write_models", "_host_verify", "webgpu_kernel_stage", "make_feeds"):
        monkeypatch.setattr(pipeline.build, stage, _must_not_run)
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
    import pipeline.build

    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    ran = []
    real = pipeline.build.make_variants
    monkeypatch.setattr(pipeline.build, "make_variants", lambda *a, **k: ran.append(1) or real(*a, **k))
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
    from pipeline.reuse import pack_settings

    assert build(str(model_file), "--no-browser", "--out", str(tmp_path / "a")).exit_code == 0
    declared = {
        name for command in ("publish", "export", "cache") for param in load_command(command).params
        for name in ([param.envvar] if isinstance(param.envvar, str) else param.envvar or [])
    }
    assert {"PACK_CACHE_URL", "PACK_BUCKET", "PACK_EXPORT_HOST"} <= declared
    (tmp_path / "store").mkdir()
    for name in sorted(declared | {"PACK_JOBS", "PACK_TEST_WORKERS"}):
        monkeypatch.setenv(name, str(tmp_path / "store") if name == "PACK_CACHE_URL" else "1")
    assert pack_settings() == {}
    again = build(str(model_file), "--no-browser", "--out", str(tmp_path / "b"))
    assert again.exit_code == 0, again.output
    assert "unchanged: the inputs match the stored build" in again.output
    assert files_of(tmp_path / "a" / "reused-conv") == files_of(tmp_path / "b" / "reused-conv")
