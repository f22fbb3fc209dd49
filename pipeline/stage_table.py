"""A build as a table of keyed stages, and the small runner that runs one.

A `Stage` declares, as data, its name, the settings it reads (dotted names into the build's
settings: `recipe.repairs`, `runtime`, `environment.PACK_WEBGPU_KERNELS`), the artefacts it reads
and makes (names in the build's ledger), the code and libraries that compute it, and its run
function. `stage_keys` keys every stage with the one key function (pipeline/keys.py): its settings
slice, the keys of the stages that made what it reads, its code (its own module and all it
imports, plus the packages it names) and its libraries. So a stage's key changes exactly when
something upstream of it changes, and the whole table's keys are known before any stage after the
first runs (the first, the fetch, also keys the bytes it fetched). The last stage's key names the
whole package: a stored package under it is the build (pipeline/reuse.py).

`run_stage` runs one stage, timed, and checks its contract: it is handed a read-only view of the
artefacts it declares (reading another is a `StageContractBroken`), what it reads is in the ledger
before it runs, it makes exactly what it declares, each of the declared type (`ARTEFACT_TYPES` of the
table). A stage with a `StageCache` keeps what it made as a folder entry of the cache under its key
(`stages/<name>/<key>`, shared like any entry) and, when the entry is there, reads it instead of
running.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from pipeline.cache import cache_dir, folder_commit, note_written, remove_orphans, seal_folder, sealed_folder
from pipeline.keys import as_data, stage_key

Ledger = dict[str, Any]  # artefact name -> value: everything the stages made so far


@dataclass(frozen=True)
class StageCache:
    """How a stage's artefacts are kept in a folder and read back."""

    save: Callable[[Mapping[str, Any], Path], bool]  # artefacts -> files in the folder; False: not kept
    load: Callable[[Path], dict]


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[["Artefacts", Any], Mapping[str, Any]]  # (its artefacts, the build's context) -> what it makes
    settings: tuple[str, ...] = ()  # dotted names into the build's settings: the slice it reads (keyed)
    reads: tuple[str, ...] = ()
    makes: tuple[str, ...] = ()
    # besides its own module (and all that imports, keys.code_sources): the packages and data files
    # it reaches without an import (repairs found by discovery, the loader's template files)
    code: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()
    # content the stage keys besides its slice (the fetch: the bytes it fetched; the write: how they
    # were found): its artefacts -> data
    content: Callable[["Artefacts"], Mapping[str, str]] | None = None
    cache: StageCache | None = None  # kept under its key, read back instead of running

    @property
    def code_names(self) -> tuple[str, ...]:
        return (self.run.__module__, *self.code)


class StageContractBroken(RuntimeError):
    """A stage ran without an artefact it reads, read one it does not declare, or made other
    artefacts than it declares: a bug."""


class Artefacts(Mapping):
    """The read-only view of the ledger a stage is handed: the artefacts it declares, no others."""

    def __init__(self, stage: Stage, ledger: Ledger, own: bool = False):
        self._stage, self._ledger = stage, ledger
        # a stage's `content` keys what it made (the fetch: the bytes it fetched) besides what it read
        self._names = (*stage.reads, *stage.makes) if own else stage.reads

    def __getitem__(self, name: str) -> Any:
        if name not in self._names:
            raise StageContractBroken(f"stage {self._stage.name} read '{name}', which it does not declare in its reads")
        return self._ledger[name]

    def __contains__(self, name: object) -> bool:
        return name in self._names and name in self._ledger

    def __iter__(self) -> Iterator[str]:
        return (name for name in self._names if name in self._ledger)

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class StageRun:
    """The keys and wall times of one run of a table."""

    keys: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)  # stages read from the cache under their key


def settings_slice(settings: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The settings a stage reads, by dotted name (`recipe.seed` is `settings.recipe["seed"]`)."""
    data = as_data(settings)
    found = {}
    for name in names:
        value = data
        for part in name.split("."):
            if not isinstance(value, Mapping) or part not in value:
                value = None
                break
            value = value[part]
        found[name] = value
    return found


def stage_keys(table: list[Stage], settings: Any, ledger: Ledger) -> dict[str, str]:
    """Every stage's key, in order, chained through the artefacts each reads. `content` reads the
    ledger as it stands: call this once what it reads is there (the fetch keys its own result)."""
    keys: dict[str, str] = {}
    maker: dict[str, str] = {}
    for stage in table:
        inputs = {f"{name}<-{maker[name]}": keys[maker[name]] for name in stage.reads if name in maker}
        if stage.content is not None:
            inputs.update({f"content:{name}": value for name, value in stage.content(Artefacts(stage, ledger, own=True)).items()})
        keys[stage.name] = stage_key(stage.name, settings_slice(settings, stage.settings), inputs, stage.code_names, stage.libraries)
        maker.update({name: stage.name for name in stage.makes})
    return keys


def run_stage(stage: Stage, ledger: Ledger, record: StageRun, context: Any = None, boundary: Callable[[str], None] = lambda name: None,
              key: str | None = None, types: Mapping[str, str] | None = None) -> None:
    """Run one stage on its view of the ledger, timed, its contract checked; a cached stage with
    its `key` is read from its entry when there is one, and kept there when it ran. `types`:
    artefact name -> "module:Class" that what it makes must be."""
    missing = [name for name in stage.reads if name not in ledger]
    if missing:
        raise StageContractBroken(f"stage {stage.name} reads {', '.join(missing)}, which no earlier stage made")
    boundary(stage.name)
    folder = cache_dir("stages", stage.name) / key if stage.cache is not None and key is not None else None
    start = time.perf_counter()
    try:
        if folder is not None and sealed_folder(folder):
            made = dict(stage.cache.load(folder / "made"))
            record.reused.append(stage.name)
        else:
            made = dict(stage.run(Artefacts(stage, ledger), context))
            if folder is not None:
                _keep(stage, made, folder)
    finally:
        record.seconds[stage.name] = round(time.perf_counter() - start, 3)
    if set(made) != set(stage.makes):
        raise StageContractBroken(f"stage {stage.name} made {sorted(made)}, not what it declares: {sorted(stage.makes)}")
    for name, value in made.items():
        expected = _artefact_type((types or {}).get(name))
        if expected is not None and value is not None and not isinstance(value, expected):
            raise StageContractBroken(f"stage {stage.name} made '{name}' as {type(value).__name__}, not {expected.__name__}")
    ledger.update(made)


def _artefact_type(spec: str | None) -> type | None:
    if spec is None:
        return None
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def _keep(stage: Stage, made: Mapping[str, Any], folder: Path) -> None:
    """The stage's artefacts as a sealed folder entry, renamed into place whole (shared from there)."""
    remove_orphans(folder.parent, f".{folder.name}.")
    scratch = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        (scratch / "made").mkdir(parents=True)
        if not stage.cache.save(made, scratch / "made"):
            return
        seal_folder(scratch)
        with folder_commit(folder):
            if not folder.is_dir():  # else another build kept the same key first
                os.rename(scratch, folder)
    except OSError as error:
        note_written(error, scratch)
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
