"""onnxruntime-web at a pinned version: cache, names read from the package, errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline.errors import PackError
from pipeline.runtime import read_runtime, resolve_runtime, runtime_dir


def test_pinned_runtime_names_come_from_the_installed_package() -> None:
    runtime = resolve_runtime("1.30.0")
    exports = json.loads((runtime.root / "package.json").read_text())["exports"]
    assert runtime.version == "1.30.0"
    assert set(runtime.bundles) == {"webgpu", "wasm", "root"}
    for key, subpath in (("webgpu", "./webgpu"), ("wasm", "./wasm"), ("root", ".")):
        bundle = runtime.bundles[key]
        assert bundle.module == (runtime.root / exports[subpath]["import"]["default"]).resolve()
        assert bundle.wasm.parent == bundle.module.parent and bundle.wasm.is_file()
        assert bundle.wasm.name in bundle.module.read_text()
    # the three builds fetch three different wasm files
    assert len({b.wasm.name for b in runtime.bundles.values()}) == 3
    assert runtime.bundles["wasm"].entry == "onnxruntime-web/wasm" and runtime.bundles["root"].entry == "onnxruntime-web"


def test_second_call_uses_the_cache_without_npm(monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve_runtime("1.30.0")
    monkeypatch.setenv("PATH", "")  # no npm reachable: the cache must answer
    second = resolve_runtime("1.30.0")
    assert second == first
    assert first.root == runtime_dir("1.30.0")


def test_missing_npm_names_version_and_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    with pytest.raises(PackError, match=r"onnxruntime-web@1\.30\.0: npm not found.*install Node\.js"):
        resolve_runtime("1.30.0")
    assert not runtime_dir("1.30.0").exists()


def test_a_range_or_tag_is_refused_before_any_network() -> None:
    for version in ("latest", "^1.30.0", "1.30"):
        with pytest.raises(PackError, match="not an exact version"):
            resolve_runtime(version)


@pytest.mark.network_registry
def test_unknown_version_names_it_and_leaves_no_cache_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(PackError, match=r"onnxruntime-web@1\.99\.0: npm has no such version"):
        resolve_runtime("1.99.0")
    assert not runtime_dir("1.99.0").exists()
    assert [p.name for p in runtime_dir("1.99.0").parent.iterdir()] == []  # the temp dir is gone too


def _fake_package(root: Path, wasm_literal: str, files: list[str]) -> Path:
    (root / "out").mkdir(parents=True)
    exports = {sub: {"import": {"default": f"./out/{name}.mjs"}} for sub, name in (("./webgpu", "gpu"), ("./wasm", "cpu"), (".", "all"))}
    (root / "package.json").write_text(json.dumps({"name": "onnxruntime-web", "version": "9.9.9", "exports": exports}))
    for name in ("gpu", "cpu", "all"):
        (root / "out" / f"{name}.mjs").write_text(f'let u=new URL("{wasm_literal.format(name=name)}",import.meta.url);let v="other.wasm";')
    for name in files:
        (root / "out" / name).write_bytes(b"\0asm")
    return root


def test_layouts_other_than_1_30_are_read_not_assumed(tmp_path: Path) -> None:
    root = _fake_package(tmp_path / "pkg", "runtime-{name}.wasm", ["runtime-gpu.wasm", "runtime-cpu.wasm", "runtime-all.wasm"])
    runtime = read_runtime(root, "9.9.9")
    assert runtime.bundles["webgpu"].module.name == "gpu.mjs"
    assert runtime.bundles["webgpu"].wasm.name == "runtime-gpu.wasm"  # "other.wasm" does not exist, so it is not it
    assert runtime.bundles["root"].wasm.name == "runtime-all.wasm"


def test_a_module_whose_wasm_is_missing_is_refused(tmp_path: Path) -> None:
    root = _fake_package(tmp_path / "pkg", "runtime-{name}.wasm", ["runtime-gpu.wasm"])
    with pytest.raises(PackError, match=r"cpu\.mjs: names no \.wasm \(nor a glue module naming one\)"):
        read_runtime(root, "9.9.9")


def test_cached_folder_of_another_version_is_refused(tmp_path: Path) -> None:
    root = _fake_package(tmp_path / "pkg", "runtime-{name}.wasm", ["runtime-gpu.wasm", "runtime-cpu.wasm", "runtime-all.wasm"])
    with pytest.raises(PackError, match=r"version '9\.9\.9', expected '1\.30\.0'.*delete"):
        read_runtime(root, "1.30.0")


def _local_build(tmp_path: Path, version: str = "1.30.0") -> Path:
    """A folder laid out like onnxruntime's js/web after a build: package.json and dist/ (links
    into the npm copy, so no 100 MB copy)."""
    installed = resolve_runtime(version)
    local = tmp_path / "ort-local"
    (local / "dist").mkdir(parents=True)
    shutil.copy(installed.root / "package.json", local / "package.json")
    for bundle in installed.bundles.values():
        for path in (bundle.module, bundle.wasm):
            target = local / "dist" / path.name
            if not target.exists():
                target.symlink_to(path)
    return local


def test_a_local_build_is_read_from_its_package_json(tmp_path: Path) -> None:
    from pipeline.runtime import local_runtime, runtime_from_option

    local = _local_build(tmp_path)
    runtime = local_runtime(local)
    assert runtime.local and runtime.version == "1.30.0" and runtime.label == "1.30.0 (local)"
    assert set(runtime.bundles) == {"webgpu", "wasm", "root"}
    assert runtime_from_option(str(local)).root == runtime.root
    with pytest.raises(PackError, match=r"--runtime '.*nowhere': no such directory"):
        runtime_from_option(str(tmp_path / "nowhere"))
    (local / "dist" / runtime.bundles["wasm"].module.name).unlink()
    with pytest.raises(PackError, match=r"ort.wasm.bundle.min.mjs: missing from onnxruntime-web in .*; build it"):
        local_runtime(local)


def test_a_local_build_must_be_onnxruntime_web(tmp_path: Path) -> None:
    from pipeline.runtime import local_runtime

    (tmp_path / "empty").mkdir()
    with pytest.raises(PackError, match=r"runtime.path '.*empty': no package.json there"):
        local_runtime(tmp_path / "empty")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "package.json").write_text(json.dumps({"name": "left-pad", "version": "1.0.0"}))
    with pytest.raises(PackError, match=r"names 'left-pad', not 'onnxruntime-web'"):
        local_runtime(tmp_path / "other")


def test_recipe_runtime_takes_a_dev_version_or_a_path_never_both(tmp_path: Path) -> None:
    from pipeline.recipe import parse_recipe

    file = tmp_path / "r.toml"
    dev = parse_recipe({"name": "r", "runtime": {"version": "1.31.0-dev.20260914-8d85527a0"}}, file)
    assert dev.runtime_version == "1.31.0-dev.20260914-8d85527a0" and dev.runtime_path is None
    _local_build(tmp_path)
    local = parse_recipe({"name": "r", "runtime": {"path": "ort-local"}}, file)  # relative to the recipe
    assert local.runtime_path == tmp_path / "ort-local" and local.runtime_version == "1.30.0"
    with pytest.raises(PackError, match=r"r.toml: keys 'runtime.version' and 'runtime.path' both set"):
        parse_recipe({"name": "r", "runtime": {"version": "1.30.0", "path": "ort-local"}}, file)
    with pytest.raises(PackError, match=r"r.toml: key 'runtime.path' '.*missing': no such directory"):
        parse_recipe({"name": "r", "runtime": {"path": "missing"}}, file)
    with pytest.raises(PackError, match=r"r.toml: key 'runtime.version': expected an exact version"):
        parse_recipe({"name": "r", "runtime": {"version": "^1.30"}}, file)
