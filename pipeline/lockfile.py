"""The lock file: facts a build pinned once and checks ever after, per recipe and section.

JSON `{"schema": 1, "<recipe name>": {"<section>": {...}}}`, written atomically with sorted keys
and indent 2 so it diffs well under version control. Sections: `source` (uri, sha256, size: the
file a source without a published hash turned out to be on first download) and `fp16` (the
precision stage's decisions). Where it lives: `--lock PATH` when given; else `x.lock.json` beside a
recipe file `x.toml`; for a built-in recipe `pack.lock.json` in the current directory; a bare
`.onnx` model has no lock unless `--lock` names one.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pipeline.errors import PackError
from pipeline.recipe import RECIPES_DIR, Recipe

SCHEMA = 1
PROJECT_LOCK = "pack.lock.json"


class LockFile:
    """One lock file, read lazily; `path` None is a lock that remembers nothing."""

    def __init__(self, path: Path | None):
        self.path = path
        self._data: dict | None = None

    def _load(self) -> dict:
        if self._data is not None:
            return self._data
        if self.path is None or not self.path.exists():
            self._data = {"schema": SCHEMA}
            return self._data
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise PackError(f"{self.path}: cannot read the lock file ({error}); fix it or delete it to pin again") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PackError(f"{self.path}: not a pack lock file of schema {SCHEMA}; delete it to pin again")
        for name, sections in data.items():
            if name != "schema" and (not isinstance(sections, dict) or any(not isinstance(v, dict) for v in sections.values())):
                raise PackError(f"{self.path}: entry '{name}' must map section names to tables; fix it or delete the entry")
        self._data = data
        return data

    def get(self, recipe_name: str, section: str) -> dict | None:
        entry = self._load().get(recipe_name, {}).get(section)
        return dict(entry) if entry is not None else None

    def put(self, recipe_name: str, section: str, value: dict) -> None:
        if self.path is None:
            return
        data = self._load()
        data.setdefault(recipe_name, {})[section] = value
        self._write(data)

    def drop(self, recipe_name: str, section: str) -> None:
        if self.path is None:
            return
        data = self._load()
        if data.get(recipe_name, {}).pop(section, None) is not None:
            if not data[recipe_name]:
                del data[recipe_name]
            self._write(data)

    def _write(self, data: dict) -> None:
        assert self.path is not None
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.chmod(temporary, 0o644)
            os.replace(temporary, self.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def lock_for(recipe: Recipe, override: Path | None) -> LockFile:
    """The lock a build of `recipe` reads and writes (see the module docstring for where)."""
    if override is not None:
        if override.is_dir():
            raise PackError(f"--lock {override}: is a folder; give a file such as {override / PROJECT_LOCK}")
        return LockFile(override)
    if recipe.path is None:
        return LockFile(None)
    if recipe.path.resolve().parent == RECIPES_DIR.resolve():
        return LockFile(Path.cwd() / PROJECT_LOCK)
    return LockFile(recipe.path.with_name(f"{recipe.path.stem}.lock.json"))
