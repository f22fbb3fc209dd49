"""Shared test set-up: one pack cache for the whole run (downloads, brotli, runtime), so tests that
build packages reuse each other's work; CI points PACK_CACHE_DIR at a folder it keeps."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("PACK_CACHE_DIR", str(REPO / ".cache" / "pack"))


@pytest.fixture
def repo_root() -> Path:
    return REPO
