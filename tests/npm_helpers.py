"""npm packages the tests drive (vite, serve, the hosts' own config parsers), installed once per
package-lock.json under PACK_CACHE_DIR and shared by every test and benchmark that needs them."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path


def npm(*args: str, cwd: Path, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(["npm", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"npm {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
    return done


def locked_node_modules(project: Path, place: str, command: str) -> Path:
    """The node_modules of `project`'s package-lock.json (`npm ci`), kept under
    PACK_CACHE_DIR/<place><lock hash>; `command` is a bin it installs (present: installed)."""
    from pipeline.cache import cache_root

    lock = (project / "package-lock.json").read_bytes()
    folder = cache_root() / f"{place}{hashlib.sha256(lock).hexdigest()[:16]}"
    if not (folder / "node_modules" / ".bin" / command).exists():
        staging = folder.with_name(folder.name + f".tmp-{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(project / name, staging / name)
        npm("ci", "--no-audit", "--no-fund", cwd=staging)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return folder / "node_modules"
