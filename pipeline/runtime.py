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

from pipeline.keys import stage_key
from pipeline.cache import FOLDER_SEAL, atomic_write, cached_entry, folder_commit, seal_folder, sealed_folder
from pipeline.cache import cache_dir as pipeline_cache_dir
from pipeline.errors import PackError
from pipeline.progress import Progress

PACKAGE = "onnxruntime-web"
DEFAULT_VERSION = "1.30.0"

# bundle key -> the package.json "exports" subpath of its entry point
ENTRY_SUBPATHS: dict[str, str] = {"webgpu": "./webgpu", "wasm": "./wasm", "root": "."}

# npm accepts tags and ranges too; a pin must be an exact version so the cache key means something.
_EXACT_VERSION = re.compile(r"^\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?$")
# the bundles name their .wasm as a string literal: new URL("ort-wasm-....wasm", import.meta.url)
_WASM_LITERAL = re.compile(r"[\"']([A-Za-z0-9_.-]+\.wasm)[\"']")
# releases up to 1.22 keep emscripten's glue module apart: the bundle imports "ort-wasm-....mjs",
# and that module names the .wasm
_GLUE_LITERAL = re.compile(r"[\"'](ort-wasm-[A-Za-z0-9_.-]+\.mjs)[\"']")
# older releases ship no ES module bundle for every entry point (1.18's webgpu entry is dist/esm/*.js)
OLDEST_RELEASE = (1, 19)
# what the IR probe (runtime_probe.mjs, run under Node) found, stored beside the installed release
_IR_PROBE_FILE = ".pack-max-ir.json"


@dataclass(frozen=True)
class Bundle:
    key: str  # 'webgpu' | 'wasm' | 'root'
    entry: str  # 'onnxruntime-web/webgpu' | 'onnxruntime-web/wasm' | 'onnxruntime-web'
    module: Path  # the installed *.bundle.min.mjs of that entry (exports, import/default)
    wasm: Path  # the .wasm that module fetches (read from the module, not hard-coded)
    glue: Path | None = None  # emscripten's glue module, where the release keeps it apart (<= 1.22)


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


def max_ir_version(runtime: Runtime, progress: Progress | None = None) -> int:
    """The newest ONNX IR version this release loads, measured once per release: a wasm session is
    created under Node on a one-node model stamped IR 3..14 (`runtime_probe.mjs`). Stored beside an
    installed release; for a local build, in the cache keyed by its wasm module's hash."""
    stored = runtime.root / _IR_PROBE_FILE if not runtime.local else cache_dir() / "runtime-probes" / f"{stage_key('ir-probe', inputs={'wasm': _file_sha256(runtime.bundles['wasm'].module)}, code=('pipeline.runtime',))}.json"
    # beside an installed release the folder's seal checks it; in the cache, its own record
    present = cached_entry(stored) is not None if runtime.local else stored.is_file()
    if present:
        return int(json.loads(stored.read_text())["maxIr"])
    ir = _probe_max_ir(runtime.root, progress or Progress.quiet())
    atomic_write(stored, (json.dumps({"version": runtime.version, "maxIr": ir}) + "\n").encode(), entry=runtime.local)
    return ir


def _probe_max_ir(package_root: Path, progress: Progress) -> int:
    from importlib import resources

    node = shutil.which("node")
    if node is None:
        raise PackError("node: not found on PATH; install Node.js (it comes with npm), needed to read which ONNX IR versions the runtime loads")
    progress.note(f"measuring which ONNX IR versions {package_root.name} loads (once per release)")
    probe = resources.files("pipeline").joinpath("runtime_probe.mjs")
    with resources.as_file(probe) as probe_path:
        try:
            done = subprocess.run([node, str(probe_path), str(package_root)], capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            raise PackError(f"{package_root}: the IR version probe took over 5 minutes under Node; check the runtime") from None
    try:
        loads = json.loads(done.stdout.strip().splitlines()[-1])["loads"]
    except (IndexError, ValueError, KeyError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise PackError(f"{package_root}: the IR version probe failed under Node ({last[:200]}); this onnxruntime-web build may be broken") from None
    newest = max((int(ir) for ir, ok in loads.items() if ok), default=None)
    if newest is None:
        raise PackError(f"{package_root}: this onnxruntime-web loads no ONNX IR version from 3 to 14 under Node; pin another version")
    return newest


def _file_sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


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
    release = tuple(int(part) for part in version.split("-")[0].split(".")[:2])
    if release < OLDEST_RELEASE:
        oldest = ".".join(map(str, OLDEST_RELEASE))
        raise PackError(f"onnxruntime-web {version} is older than {oldest}, the oldest release whose entry points are ES module bundles pack can ship; pin {oldest}.0 or newer")
    target = runtime_dir(version)
    if not sealed_folder(target):
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
    wasm = _one_beside(module, _WASM_LITERAL)
    if wasm is not None:
        return Bundle(key=key, entry=entry, module=module, wasm=wasm)
    glue = _one_beside(module, _GLUE_LITERAL)
    wasm = _one_beside(glue, _WASM_LITERAL) if glue is not None else None
    if wasm is None:
        raise PackError(
            f"{module}: names no .wasm (nor a glue module naming one) that exists beside it; "
            "this onnxruntime-web layout is not supported, pin another version"
        )
    return Bundle(key=key, entry=entry, module=module, wasm=wasm, glue=glue)


def _one_beside(module: Path, literal: re.Pattern) -> Path | None:
    """The one file beside `module` whose name the module's code contains as a `literal` string."""
    names = set(literal.findall(module.read_text(encoding="utf-8", errors="replace")))
    present = sorted(name for name in names if (module.parent / name).is_file())
    if len(present) > 1:
        raise PackError(f"{module}: names {', '.join(present)}, expected one; this onnxruntime-web layout is not supported, pin another version")
    return module.parent / present[0] if present else None


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
        installed = read_runtime(package, version)  # refuse a layout we cannot read before it enters the cache
        max_ir_version(installed, progress)  # measured once, stored beside the release
        seal_folder(package)
        with folder_commit(target):
            # Another process may have finished first: its sealed folder stays.
            if not (target / FOLDER_SEAL).is_file():
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
