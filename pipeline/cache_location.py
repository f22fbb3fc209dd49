"""Where pack's local cache lies: `PACK_CACHE_DIR`, else ~/.cache/pack. Its own module so the
modules below the cache (the S3 client's model memo) can find it without importing the cache,
which reads through the shared store that uses them."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PACK_CACHE_DIR"


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "pack"
