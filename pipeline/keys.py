"""The one key function of pack's reusable work.

Every result pack keeps for reuse (a stage of a build, a host run, a brotli encoding, a converted
variant, a whole package) is named by `stage_key`: a sha256 of the stage's name, the slice of the
settings it reads, the keys or content hashes of what it reads, the hash of the code that computes
it and the versions of the libraries it uses. Keys chain: a stage's inputs are its upstream stages'
keys, so a change anywhere upstream changes every key below it, and a key can be computed before
any work runs. Nothing else names cached work, so a shared cache (pipeline/shared_cache.py) can
trust an entry exactly as far as its key covers: the code, the libraries and the inputs.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pipeline

PACKAGE_DIR = Path(pipeline.__file__).resolve().parent
# `from pipeline.x import ...` / `import pipeline.x` at any indentation (late imports count too).
_PIPELINE_IMPORT = re.compile(r"^\s*(?:from|import)\s+pipeline\.(\w+)", re.MULTILINE)
_DATA_PACKAGES = ("pipeline.web_template", "pipeline.recipes")  # package data mapped from the repository root


def stage_key(stage: str, settings: Any = None, inputs: Mapping[str, str] | None = None, code: Sequence[str] = (), libraries: Sequence[str] = ()) -> str:
    """The key of one piece of reusable work.

    stage: what the work is ("host-run", "brotli", "convert", a build stage's name).
    settings: the settings it reads (JSON-able; dataclasses and paths are turned into data).
    inputs: name -> the key of an upstream stage or the sha256 of content it reads.
    code: the pipeline modules or packages that compute it (`code_hash`); () when the result is a
        library's alone (a brotli encoding).
    libraries: the distributions whose versions decide the result (their installed versions are keyed).
    """
    record = {
        "stage": stage,
        "settings": as_data(settings),
        "inputs": dict(sorted((inputs or {}).items())),
        "code": code_hash(tuple(code)) if code else None,
        "libraries": library_versions(tuple(libraries)),
    }
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def arrays_sha256(arrays: Mapping[str, Any]) -> str:
    """sha256 of named arrays (sample inputs, feeds): names, dtypes, shapes and bytes."""
    import numpy as np

    digest = hashlib.sha256()
    for name in sorted(arrays):
        array = np.ascontiguousarray(arrays[name])
        digest.update(f"|{name}|{array.dtype}|{array.shape}|".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def code_sources(names: Iterable[str], package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The files `names` stand for: a module's file, every .py under a package, and each top-level
    pipeline module one of those imports (shared helpers such as pipeline/dtypes.py)."""
    sources: set[Path] = set()
    for name in names:
        relative = Path(*name.split(".")[1:])
        folder, module = package_dir / relative, (package_dir / relative).with_suffix(".py")
        if folder.is_dir():
            sources.update(folder.rglob("*.py"))
        elif module.is_file():
            sources.add(module)
        elif name not in _DATA_PACKAGES:
            raise ValueError(f"code {name!r}: no such pipeline module or package")
    imported = {match for source in sources for match in _PIPELINE_IMPORT.findall(source.read_text(encoding="utf-8"))}
    sources.update(package_dir / f"{name}.py" for name in imported if (package_dir / f"{name}.py").is_file())
    return sorted(path for path in sources if "__pycache__" not in path.parts)


def code_hash(names: tuple[str, ...], package_dir: Path = PACKAGE_DIR) -> str:
    """A hash of the code `names` stand for (file names and bytes, see `code_sources`), package data
    included when named (`pipeline.web_template`, `pipeline.recipes`). Editing any of those files
    changes it; no version needs bumping."""
    return _code_hash(names, str(package_dir))


@lru_cache(maxsize=None)
def _code_hash(names: tuple[str, ...], package_dir: str) -> str:
    root = Path(package_dir)
    digest = hashlib.sha256()
    for source in code_sources(names, root):
        digest.update(source.relative_to(root).as_posix().encode() + b"\0" + source.read_bytes() + b"\0")
    for data_package in sorted(set(names) & set(_DATA_PACKAGES)):
        for name, data in _package_data(data_package):
            digest.update(f"{data_package}/{name}".encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def _package_data(data_package: str) -> list[tuple[str, bytes]]:
    try:
        root = resources.files(data_package)
    except ModuleNotFoundError:
        return []
    return sorted(_walk(root))


def _walk(root, prefix: str = ""):
    for child in root.iterdir():
        name = f"{prefix}{child.name}"
        if child.is_dir():
            if child.name != "__pycache__":
                yield from _walk(child, name + "/")
        else:
            yield name, child.read_bytes()


@lru_cache(maxsize=None)
def library_versions(names: tuple[str, ...]) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def as_data(value: Any) -> Any:
    """A settings object as JSON-able data (dataclasses as dicts, paths as strings, sets sorted)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {key: as_data(item) for key, item in asdict(value).items()}
    if isinstance(value, Mapping):
        return {str(key): as_data(item) for key, item in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(as_data(item) for item in value)
    if isinstance(value, (list, tuple)):
        return [as_data(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
