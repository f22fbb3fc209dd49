"""onnxruntime-web at a pinned version, installed with npm into a cache keyed by version, or a
local build (a folder with its package.json, e.g. onnxruntime's js/web after `npm run build`).

A version is exact: a release (`1.30.0`) or a published dev build (`1.31.0-dev.20260914-8d85527a0`,
see `npm view onnxruntime-web versions --json`). The file names of each entry point are read from
the package (package.json "exports" and the strings inside the bundle), never hard-coded: they have
changed between releases.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.cache import cache_dir as pipeline_cache_dir
from pipeline.errors import PackError
from pipeline.progress import Progress

PACKAGE = "onnxruntime-web"
DEFAULT_VERSION = "1.30.0"

# The newest ONNX IR version each onnxruntime-web release loads; it refuses newer ones ("Unsupported
# model IR version"). Rows are (release, IR version), each measured by creating a wasm session on
# the same one-node model stamped IR 8..14 in that release under Node (docs/graph.md has the
# figures); a release between rows reads what the row below it says.
MAX_IR_VERSIONS: tuple[tuple[tuple[int, int], int], ...] = (
    ((1, 19), 10), ((1, 20), 10), ((1, 21), 10), ((1, 22), 10),
    ((1, 23), 11),
    ((1, 24), 13), ((1, 25), 13), ((1, 26), 13), ((1, 27), 13), ((1, 29), 13), ((1, 30), 13),
)

# bundle key -> the package.json "exports" subpath of its entry point
ENTRY_SUBPATHS: dict[str, str] = {"webgpu": "./webgpu", "wasm": "./wasm", "root": "."}

# npm accepts tags and ranges too; a pin must be an exact version so the cache key means something.
_EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")
# the bundles name their .wasm as a string literal: new URL("ort-wasm-....wasm", import.meta.url)
_WASM_LITERAL = re.compile(r"[\"']([A-Za-z0-9_.-]+\.wasm)[\"']")
_COMPLETE_MARKER = ".pack-complete"


@dataclass(frozen=True)
class Bundle:
    key: str  # 'webgpu' | 'wasm' | 'root'
    entry: str  # 'onnxruntime-web/webgpu' | 'onnxruntime-web/wasm' | 'onnxruntime-web'
    module: Path  # the installed *.bundle.min.mjs of that entry (exports, import/default)
    wasm: Path  # the .wasm that module fetches (read from the module, not hard-coded)


@dataclass(frozen=True)
class Runtime:
    version: str
    root: Path  # the installed package folder, or the local build's folder
    bundles: dict[str, Bundle]
    local: bool = False  # a local build (`[runtime] path`, `--runtime DIR`), not from npm

    @property
    def label(self) -> str:
        """How reports and tables name it: the version, marked when it is a local build."""
        return f"{self.version} (local)" if self.local else self.version


def is_exact_version(version: str) -> bool:
    """A release or a published dev build; npm's ranges and tags are not (the cache is keyed by it)."""
    return bool(_EXACT_VERSION.match(version))


def recipe_runtime(version: str, path: Path | None, progress: Progress | None = None) -> Runtime:
    """The runtime a recipe ships: its local build (`[runtime] path`) or the npm version."""
    return local_runtime(path) if path is not None else resolve_runtime(version, progress)


def max_ir_version(version: str) -> tuple[int, str | None]:
    """The newest IR version onnxruntime-web `version` loads, and a note when the table has to guess:
    a release newer than its newest row is assumed to read what that row reads (IR versions only grow)."""
    match = re.match(r"^(\d+)\.(\d+)\.", version)
    if match is None:
        raise PackError(f"runtime version {version!r}: not an exact version; pin one such as {DEFAULT_VERSION!r}")
    release = (int(match[1]), int(match[2]))
    oldest, newest = MAX_IR_VERSIONS[0], MAX_IR_VERSIONS[-1]
    if release < oldest[0]:
        raise PackError(
            f"onnxruntime-web {version} is older than {oldest[0][0]}.{oldest[0][1]}, the oldest release whose IR version "
            f"pack knows; pin {oldest[0][0]}.{oldest[0][1]}.0 or newer"
        )
    ir = next(ir for first, ir in reversed(MAX_IR_VERSIONS) if first <= release)
    if release > newest[0]:
        return ir, (
            f"onnxruntime-web {version} is newer than pack's IR table (newest row {newest[0][0]}.{newest[0][1]}: IR {ir}); "
            f"assumed to read IR {ir}"
        )
    return ir, None


def cache_dir() -> Path:
    """`$PACK_CACHE_DIR`, else `~/.cache/pack` (created; an unwritable cache is a PackError)."""
    return pipeline_cache_dir()


def runtime_dir(version: str) -> Path:
    return cache_dir() / "runtime" / PACKAGE / version


def resolve_runtime(version: str = DEFAULT_VERSION, progress: Progress | None = None) -> Runtime:
    """The installed onnxruntime-web `version`, installing it on first use (no network afterwards)."""
    if not _EXACT_VERSION.match(version):
        raise PackError(
            f"runtime version {version!r}: not an exact version; pin one such as {DEFAULT_VERSION!r} "
            "(see `npm view onnxruntime-web versions`)"
        )
    target = runtime_dir(version)
    if not (target / _COMPLETE_MARKER).is_file():
        _install(version, target, progress or Progress.quiet())
    return read_runtime(target, version)


def local_runtime(path: Path, key: str = "runtime.path") -> Runtime:
    """A local onnxruntime-web build at `path`: its package.json names the version and the entry
    points, as for an installed one. Errors name `key` (the recipe key or CLI option)."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise PackError(f"{key} {str(path)!r}: no such directory; point at an onnxruntime-web package folder (js/web of a build, with package.json and dist/)")
    package_json = root / "package.json"
    try:
        manifest = json.loads(package_json.read_text())
    except FileNotFoundError:
        raise PackError(f"{key} {str(path)!r}: no package.json there; point at the onnxruntime-web package folder (js/web of a build)") from None
    except (OSError, json.JSONDecodeError) as error:
        raise PackError(f"{key} {str(path)!r}: package.json unreadable ({error})") from None
    if manifest.get("name") != PACKAGE:
        raise PackError(f"{key} {str(path)!r}: package.json names {manifest.get('name')!r}, not {PACKAGE!r}; point at onnxruntime-web's package folder")
    version = manifest.get("version")
    if not isinstance(version, str) or not _EXACT_VERSION.match(version):
        raise PackError(f"{key} {str(path)!r}: package.json has no exact version ({version!r})")
    hint = f"build it (`npm run build` in onnxruntime's js/web) or fix {key}"
    bundles = {name: _read_bundle(root, manifest, name, subpath, hint) for name, subpath in ENTRY_SUBPATHS.items()}
    return Runtime(version=version, root=root.resolve(), bundles=bundles, local=True)


def runtime_from_option(value: str, key: str = "--runtime", progress: Progress | None = None) -> Runtime:
    """`--runtime VALUE`: an exact npm version (installed on first use), or a local build's folder
    (a value with a path separator, or an existing directory)."""
    if os.sep in value or "/" in value or Path(value).is_dir():
        return local_runtime(Path(value), key)
    if not _EXACT_VERSION.match(value):
        raise PackError(f"{key} {value!r}: neither an exact onnxruntime-web version (like {DEFAULT_VERSION!r} or a dev build from `npm view {PACKAGE} versions --json`) nor a folder")
    return resolve_runtime(value, progress)


def read_runtime(root: Path, version: str) -> Runtime:
    """Read the entry points of an installed package folder."""
    package_json = root / "package.json"
    try:
        manifest = json.loads(package_json.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise PackError(f"{package_json}: unreadable ({error}); delete {root} to reinstall") from None
    if manifest.get("version") != version:
        raise PackError(
            f"{package_json}: version {manifest.get('version')!r}, expected {version!r}; delete {root} to reinstall"
        )
    hint = f"delete {root} to reinstall"
    bundles = {key: _read_bundle(root, manifest, key, subpath, hint) for key, subpath in ENTRY_SUBPATHS.items()}
    return Runtime(version=version, root=root, bundles=bundles)


def _read_bundle(root: Path, manifest: dict, key: str, subpath: str, hint: str) -> Bundle:
    entry = PACKAGE if subpath == "." else f"{PACKAGE}/{subpath[2:]}"
    exports = manifest.get("exports") or {}
    condition = (exports.get(subpath) or {}).get("import") if isinstance(exports, dict) else None
    relative = condition.get("default") if isinstance(condition, dict) else condition
    if not isinstance(relative, str):
        raise PackError(
            f"{root / 'package.json'}: exports[{subpath!r}].import has no default module for {entry}; "
            "pin an onnxruntime-web version that ships bundled entry points (>= 1.19)"
        )
    module = (root / relative).resolve()
    if not module.is_file():
        raise PackError(f"{module}: missing from {PACKAGE} in {root}; {hint}")
    return Bundle(key=key, entry=entry, module=module, wasm=_wasm_of(module))


def _wasm_of(module: Path) -> Path:
    """The one .wasm beside `module` whose name the module's code contains."""
    names = set(_WASM_LITERAL.findall(module.read_text(encoding="utf-8", errors="replace")))
    present = sorted(name for name in names if (module.parent / name).is_file())
    if len(present) != 1:
        raise PackError(
            f"{module}: expected one .wasm name that exists beside it, found {present or 'none'}; "
            "this onnxruntime-web layout is not supported, pin another version"
        )
    return module.parent / present[0]


def _install(version: str, target: Path, progress: Progress) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise PackError(
            f"{PACKAGE}@{version}: npm not found on PATH; install Node.js with npm (e.g. `apt-get install npm`)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    progress.note(f"Installing {PACKAGE}@{version} with npm into {target}")
    # Everything happens in a temporary sibling and is renamed into place, so an interrupted
    # install never leaves a half-filled version folder behind.
    with tempfile.TemporaryDirectory(prefix=f".{version}.", dir=target.parent) as scratch:
        scratch_dir = Path(scratch)
        tarball = _npm_pack(npm, version, scratch_dir)
        extracted = scratch_dir / "extract"
        with tarfile.open(tarball) as archive:
            archive.extractall(extracted, filter="data")
        package = extracted / "package"
        if not (package / "package.json").is_file():
            raise PackError(f"{tarball.name}: no package/package.json inside; the npm tarball is not a package")
        read_runtime(package, version)  # refuse a layout we cannot read before it enters the cache
        (package / _COMPLETE_MARKER).write_text(version + "\n")
        try:
            os.rename(package, target)
        except OSError:
            # Another process finished first (target exists and is complete) or left a broken one.
            if not (target / _COMPLETE_MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(package, target)


def _npm_pack(npm: str, version: str, destination: Path) -> Path:
    spec = f"{PACKAGE}@{version}"
    try:
        completed = subprocess.run(
            [npm, "pack", spec, "--pack-destination", str(destination), "--silent", "--json"],
            cwd=destination,
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        raise PackError(f"{spec}: `npm pack` took over 10 minutes; check access to the npm registry") from None
    if completed.returncode != 0:
        message = completed.stderr + completed.stdout
        if "E404" in message or "ETARGET" in message or "No matching version" in message:
            raise PackError(
                f"{spec}: npm has no such version; pin a published one (`npm view {PACKAGE} versions`)"
            )
        last_line = next((line for line in reversed(message.splitlines()) if line.strip()), "no output")
        raise PackError(f"{spec}: `npm pack` failed ({last_line.strip()}); check npm and registry access")
    tarballs = sorted(destination.glob("*.tgz"))
    if len(tarballs) != 1:
        raise PackError(f"{spec}: `npm pack` produced {len(tarballs)} tarballs in {destination}, expected one")
    return tarballs[0]
