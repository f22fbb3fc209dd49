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

import ast
import hashlib
import json
import re
import sys
from dataclasses import asdict, is_dataclass
from functools import lru_cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pipeline
from pipeline.cache import remembered_digest

PACKAGE_DIR = Path(pipeline.__file__).resolve().parent
_MODULE_NAME = re.compile(r"pipeline(?:\.\w+)+")
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
    """The files `names` stand for: a module's file, every file under a package (its .py modules
    and the data beside them, e.g. the browser page's .js), a file named by its path under pipeline/
    (`pipeline/manifest.schema.json`), and every pipeline module those import, followed through
    imports resolved with `ast` (late imports included, `if TYPE_CHECKING:` blocks not: they never
    run). A package's `__init__.py` counts when the package itself is imported, not when one of its
    modules is."""
    sources: set[Path] = set()
    for name in names:
        if "/" in name:  # a data file the code reads by path
            path = package_dir / name.split("/", 1)[1]
            if not path.is_file():
                raise ValueError(f"code {name!r}: no such file under pipeline/")
            sources.add(path)
            continue
        found = _module_files(name, package_dir)
        if found:
            sources.update(found)
        elif name not in _DATA_PACKAGES:
            raise ValueError(f"code {name!r}: no such pipeline module or package")
    todo = [path for path in sources if path.suffix == ".py"]
    while todo:
        for imported in _imported_files(todo.pop(), str(package_dir)):
            if imported not in sources:
                sources.add(imported)
                todo.append(imported)
    return sorted(path for path in sources if "__pycache__" not in path.parts)


def _module_files(name: str, package_dir: Path) -> list[Path]:
    """The files of a dotted pipeline name: a package's every file, or a module's .py."""
    relative = Path(*name.split(".")[1:])
    folder, module = package_dir / relative, (package_dir / relative).with_suffix(".py")
    if folder.is_dir():
        return [path for path in folder.rglob("*") if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"]
    return [module] if module.is_file() else []


def _imported_files(path: Path, package_dir: str) -> tuple[Path, ...]:
    """The pipeline modules one file imports (`from pipeline.a import b` is pipeline/a/b.py when b is
    a module, else pipeline/a.py or pipeline/a/__init__.py)."""
    root = Path(package_dir)
    found: set[Path] = set()
    for dotted in _code_facts(path)[1]:
        relative = Path(*dotted.split(".")[1:])
        for file in ((root / relative).with_suffix(".py"), root / relative / "__init__.py"):
            if file.is_file():
                found.add(file)
                break
    return tuple(sorted(found))


@lru_cache(maxsize=None)
def _code_facts(path: Path) -> tuple[str, tuple[str, ...]]:
    """(sha256 of `normalised_code`, the pipeline names the file imports or runs by name), read once
    per file as it is on disk (remembered in the cache: a build does not parse ~100 modules)."""
    facts = remembered_digest(path, "code-facts-1", _compute_code_facts) or ""
    digest, _, names = facts.partition(";")
    return digest, tuple(name for name in names.split(",") if name)


def _compute_code_facts(path: Path) -> str:
    if path.suffix != ".py":
        return hashlib.sha256(path.read_bytes()).hexdigest() + ";"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.update([node.module, *(f"{node.module}.{alias.name}" for alias in node.names)])
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_NAME.fullmatch(node.value):
            names.add(node.value)  # a module run by name (`python -m pipeline.verify.engines.session_worker`)
    pipeline_names = sorted(name for name in names if name.startswith("pipeline."))
    return hashlib.sha256(_normalised(tree)).hexdigest() + ";" + ",".join(pipeline_names)


def _runtime_nodes(tree: ast.AST) -> Iterable[ast.AST]:
    """Every node of the tree but those under `if TYPE_CHECKING:` (imports for annotations only)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                todo.extend(child.orelse)
                continue
            todo.append(child)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def normalised_code(path: Path) -> bytes:
    """What a file computes, without what only people read: a Python module as its syntax tree with
    docstrings dropped (comments and layout are not in the tree); any other file as its bytes."""
    return path.read_bytes() if path.suffix != ".py" else _normalised(ast.parse(path.read_text(encoding="utf-8")))


def _normalised(tree: ast.Module) -> bytes:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False).encode()


def code_hash(names: tuple[str, ...], package_dir: Path = PACKAGE_DIR) -> str:
    """A hash of the code `names` stand for (see `code_sources`), each module as `normalised_code`,
    package data included when named (`pipeline.web_template`, `pipeline.recipes`), and the Python
    minor version (the same tree can compute otherwise on another). A comment or docstring edit
    changes nothing; any edit to code a name reaches changes it; no version needs bumping."""
    return _code_hash(names, str(package_dir))


@lru_cache(maxsize=None)
def _code_hash(names: tuple[str, ...], package_dir: str) -> str:
    root = Path(package_dir)
    digest = hashlib.sha256("python {}.{}\0".format(*sys.version_info[:2]).encode())
    for source in code_sources(names, root):
        digest.update(source.relative_to(root).as_posix().encode() + b"\0" + _code_facts(source)[0].encode() + b"\0")
    for data_package in sorted(set(names) & set(_DATA_PACKAGES)):
        for name, data in _package_data(data_package):
            digest.update(f"{data_package}/{name}".encode() + b"\0" + data + b"\0")
    return digest.hexdigest()


def clear_code_hashes() -> None:
    """Forget the hashes and parsed files of this process (tests that edit code in place)."""
    for cached in (_code_hash, _code_facts):
        cached.cache_clear()


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
