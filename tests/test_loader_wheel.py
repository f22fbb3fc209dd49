"""A wheel of pack (not an editable install) carries the browser files and the built-in recipes as
package data: installed into a fresh virtual environment it lists the recipes and builds a package
with the loader's modules, demo page and types."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from pipeline.web.render import static_files
from build_helpers import conv_model, save

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.network_registry  # pip may fetch the build backend (setuptools) into its cache once
def test_wheel_install_renders_the_loader_and_lists_recipes(tmp_path):
    # From a clean copy of the sources: setuptools reuses a build/ folder, whose stale modules would ship.
    source = shutil.copytree(ROOT, tmp_path / "source", ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "build", "dist", "*.egg-info", "__pycache__", "node_modules", ".pytest_cache",
    ))
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q", "-w", str(wheels), str(source)],
        capture_output=True, text=True, timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    [wheel] = wheels.glob("pack-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # what a browser check and a manifest check read at run time travels in the wheel too
    assert {"pipeline/manifest.schema.json", "pipeline/verify/engines/browser/page/runner.js", "pipeline/verify/engines/browser/page/runner.html",
            "pipeline/web_template/loader/policy.js", "pipeline/recipes/lama.toml"} <= names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    # pack's dependencies come from this interpreter's site-packages, appended after the fresh
    # venv's own (a path listed in a .pth is not a site dir: the editable install's hook there does not run).
    (site / "pack-test-deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--disable-pip-version-check", "-q", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([str(python), "-c", "import pipeline; print(pipeline.__file__)"], cwd=work, env=env, capture_output=True, text=True, check=True)
    assert Path(where.stdout.strip()).is_relative_to(site), where.stdout

    listed = subprocess.run([str(venv / "bin" / "pack"), "recipes"], cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    for recipe in sorted((ROOT / "recipes").glob("*.toml")):
        assert recipe.stem in listed.stdout, listed.stdout

    model = save(conv_model(channels=2, size=8), work / "tiny-wheel.onnx")
    build = subprocess.run(
        [str(venv / "bin" / "pack"), "build", str(model), "--no-browser", "--out", str(work / "dist"), "--json"],
        cwd=work, env=env, capture_output=True, text=True, timeout=900,  # a cold brotli cache: minutes
    )
    assert build.returncode == 0, build.stderr[-3000:]
    package = work / "dist" / "tiny-wheel"
    for path in [*static_files(), "loader.d.ts", "index.html"]:
        assert (package / path).is_file(), path
    assert json.loads((package / "manifest.json").read_text())["name"] == "tiny-wheel"
