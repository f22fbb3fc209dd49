"""The lock file: decisions a build found once and the next build reuses (source pins, fp16 nodes kept
in fp32), as JSON `{"schema": 1, "<recipe name>": {"<section>": {...}}}`.

Where: `--lock PATH` when given; else for a recipe file `x.toml` → `x.lock.json` beside it; for a
built-in recipe → `pack.lock.json` in the current directory; for a bare `.onnx` model → no source
pins, and its fp16 kept nodes in the pack cache (`locks/<name>.lock.json`, nothing written outside
`--out` and the cache unless `--lock` asks; the build summary prints the path).
Written atomically (temporary file and rename) with sorted keys and indent 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pipeline.cache import file_mode
from pipeline.errors import PackError
from pipeline.recipe import RECIPES_DIR, Recipe

SCHEMA = 1


@dataclass
class LockFile:
    path: Path | None  # None: nothing is read or written

    def _read(self) -> dict:
        if self.path is None or not self.path.exists():
            return {"schema": SCHEMA}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise PackError(f"{self.path}: cannot read the lock file ({error}); fix or delete it") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PackError(f"{self.path}: not a pack lock file of schema {SCHEMA}; delete it to have it written again")
        return data

    def entry(self, recipe_name: str) -> dict | None:
        """Everything the lock holds for one recipe (what a build reads from it)."""
        entry = self._read().get(recipe_name)
        return entry if isinstance(entry, dict) else None

    def get(self, recipe_name: str, section: str) -> dict | None:
        entry = self._read().get(recipe_name, {})
        value = entry.get(section) if isinstance(entry, dict) else None
        return value if isinstance(value, dict) else None

    def put(self, recipe_name: str, section: str, value: dict) -> None:
        if self.path is None:
            return
        from pipeline.cache import cache_dir, made_once

        # Builds running at once (`pack build A B --jobs 2`, CI jobs on one machine) share a lock
        # file: each read-modify-write holds an exclusive lock, so no build's entry is lost. The
        # lock lives in the cache, keyed by the file's real path, to leave nothing beside it.
        held = cache_dir("lock-writes") / hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()
        with made_once(held):
            self._put(recipe_name, section, value)

    def _put(self, recipe_name: str, section: str, value: dict) -> None:
        data = self._read()
        data.setdefault(recipe_name, {})[section] = value
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        if self.path.exists() and self.path.read_text(encoding="utf-8") == text:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
            # mkstemp's 0600 would hide a lock file a team commits from everyone but its writer
            os.chmod(tmp, stat.S_IMODE(self.path.stat().st_mode) if self.path.exists() else file_mode())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def lock_for(recipe: Recipe, override: Path | None) -> LockFile:
    if override is not None:
        return LockFile(override)
    if recipe.path is None:
        return LockFile(None)
    if recipe.path.resolve().parent == RECIPES_DIR.resolve():
        return LockFile(Path.cwd() / "pack.lock.json")
    return LockFile(recipe.path.with_name(f"{recipe.path.stem}.lock.json"))


def fp16_lock_for(recipe: Recipe, override: Path | None) -> LockFile:
    """Where the fp16 kept nodes are recorded: as lock_for, and for a bare model (no recipe) the
    pack cache's `locks/<name>.lock.json`, so its next build applies them instead of searching
    (the entry names the model's sha256: another model of the same name searches again)."""
    if override is None and recipe.path is None:
        from pipeline.cache import cache_root

        return LockFile(cache_root() / "locks" / f"{recipe.name}.lock.json")
    return lock_for(recipe, override)
