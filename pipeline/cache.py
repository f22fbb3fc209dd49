"""Where pack keeps downloads and reusable work: $PACK_CACHE_DIR, default ~/.cache/pack."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = Path(os.environ.get("PACK_CACHE_DIR") or Path.home() / ".cache" / "pack")
    path = root.joinpath(*parts)
    path.mkdir(parents=True, exist_ok=True)
    return path


def file_sha256(path: Path) -> str:
    """sha256 hex of a file, read in 1 MiB blocks (models are too large to read whole)."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write through a temporary file in the same folder, then rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_copy(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.")
    os.close(fd)
    try:
        shutil.copyfile(source, tmp)
        os.replace(tmp, destination)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
