"""Reusing a finished build when nothing it depends on has changed.

The build's last stage key (pipeline/build.py, chained through every stage: the source bytes and
their external data, the recipe as data, the options that change results, the lock's fp16 entry, the
runtime, each stage's code and libraries, the browser's and Mesa's versions, the `PACK_*` settings
a stage declares as changing its result) names a stored copy
of a package that passed; a rebuild with the same key links that copy into place instead of
building again, so an unchanged rebuild is byte-identical (manifest and report included) and costs
about one hash of the source. Failed builds are never stored: a failure is re-checked on every build.
`PACK_BUILD_REUSE=off` (or `pack build --no-reuse`) builds from scratch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from pipeline.cache import atomic_write, cache_dir, cached_entry, file_sha256, folder_commit, folder_mode, note_written, remembered_digest, remove_orphans, seal_folder, sealed_folder
from pipeline.errors import PackError

REUSE_ENV = "PACK_BUILD_REUSE"
# The fault tests' stage at which a build kills itself (pipeline/build.py stage_boundary)
KILL_AT_ENV = "PACK_TEST_KILL_AT_STAGE"
_HASHED_NAME = re.compile(r"\.[0-9a-f]{16}\.")


def reuse_enabled() -> bool:
    return os.environ.get(REUSE_ENV, "").strip().lower() not in ("off", "0", "false", "no")


def source_hashes(model_path: Path, known_sha256: str | None) -> dict[str, str]:
    """sha256 of the model file and of each external data file it names. Hashes are remembered
    per file as it is on disk, and the names a model gives its external data per model hash, so a
    rebuild neither reads the weights again nor parses the model."""
    sha = known_sha256 or remembered_digest(model_path, "sha256", file_sha256)
    hashes = {model_path.name: sha}
    for location in _external_data_names(model_path, sha):
        data = model_path.parent / location
        if data.is_file() and location not in hashes:
            hashes[location] = remembered_digest(data, "sha256", file_sha256)
    return hashes


def _external_data_names(model_path: Path, sha256: str) -> list[str]:
    """The external data files the model names (read without its data), remembered per model hash."""
    try:
        memo: Path | None = cache_dir("external-data-names") / f"{sha256}.json"
    except PackError:
        memo = None  # no usable cache: parsed every time
    try:
        if memo is not None and cached_entry(memo):
            return json.loads(memo.read_text())
    except (OSError, ValueError):
        pass
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    try:
        header = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # noqa: BLE001 - an unreadable model is reported by the build itself
        return []
    names = sorted({entry.value for tensor in _get_all_tensors(header) if uses_external_data(tensor) for entry in tensor.external_data if entry.key == "location"})
    if memo is not None:
        try:
            atomic_write(memo, json.dumps(names).encode(), entry=True)
        except OSError:
            pass  # a cache that cannot be written only costs the next build a parse
    return names


def browser_version(executable: str | None) -> str | None:
    if executable is None:
        return None
    try:
        return subprocess.run([executable, "--version"], capture_output=True, text=True, timeout=30).stdout.strip() or executable
    except (OSError, subprocess.SubprocessError):
        return executable


def stored_package(key: str) -> Path | None:
    """The stored package of a passed build with this key, if there is one whose files all have
    their recorded hashes (a damaged one is removed with a warning: never linked into place)."""
    folder = cache_dir("builds") / key
    return folder / "package" if sealed_folder(folder) else None


def stored_outcome(key: str) -> dict:
    """What the stored build with this key did besides its package (store_package's `outcome`)."""
    path = cache_dir("builds") / key / "outcome.json"
    try:
        outcome = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return outcome if isinstance(outcome, dict) else {}


def store_package(key: str, package_dir: Path, outcome: dict | None = None) -> None:
    """Keep a passed package under its key (hard links where the file system allows: no copy),
    sealed with its files' hashes, and renamed into place whole; `outcome` beside it: what the build
    did besides the package (its warnings about the inputs, the lock entry it wrote), which a build
    that reuses the package does again."""
    folder = cache_dir("builds") / key
    if sealed_folder(folder):
        return
    remove_orphans(folder.parent, f".{key}.")
    scratch = folder.with_name(f".{key}.{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        link_tree(package_dir, scratch / "package")
        (scratch / "outcome.json").write_text(json.dumps(outcome or {}, sort_keys=True) + "\n", encoding="utf-8")
        seal_folder(scratch)
        with folder_commit(folder):
            shutil.rmtree(folder, ignore_errors=True)
            os.rename(scratch, folder)
    except OSError as error:
        note_written(error, scratch)
        shutil.rmtree(scratch, ignore_errors=True)
        if not folder.is_dir():  # else another build stored the same key first
            raise error from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


def link_tree(source: Path, destination: Path) -> None:
    """`destination` as a copy of `source`. Content-hashed files (`name.<16 hex>.ext`, immutable:
    nothing rewrites them in place) are hard-linked where the file system allows; the small
    unhashed ones (manifest, reports, loader) are copied, so editing them never reaches the store."""
    destination.mkdir(parents=True, exist_ok=True)
    os.chmod(destination, folder_mode())
    for path in sorted(source.rglob("*")):
        target = destination / path.relative_to(source)
        if path.is_dir():
            target.mkdir(exist_ok=True)
            os.chmod(target, folder_mode())
            continue
        if _HASHED_NAME.search(path.name):
            try:
                os.link(path, target)
                continue
            except OSError:
                pass
        shutil.copy2(path, target)
