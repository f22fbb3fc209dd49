"""A build as a table of keyed stages, and the small runner that runs one.

A `Stage` declares its name, the slice of the build's settings it reads, the artefacts it reads
and makes (names in the build's ledger), the code and libraries that compute it, and its run
function. `stage_keys` keys every stage with the one key function (pipeline/keys.py): its settings
slice, the keys of the stages that made what it reads, its code and its libraries. So a stage's key
changes exactly when something upstream of it changes, and the whole table's keys are known before
any stage after the first runs (the first, the fetch, also keys the bytes it fetched). The last
stage's key names the whole package: a stored package under it is the build (pipeline/reuse.py).

`run_stage` runs one stage, timed, and checks its contract: what it reads is in the ledger before
it runs, and it makes exactly what it declares. A stage with a `StageCache` keeps what it made as a
folder entry of the cache under its key (`stages/<name>/<key>`, shared like any entry) and, when
the entry is there, reads it instead of running.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from pipeline.cache import cache_dir, folder_commit, note_written, remove_orphans, seal_folder, sealed_folder
from pipeline.keys import stage_key

Ledger = dict[str, Any]  # artefact name -> value: everything the stages made so far


@dataclass(frozen=True)
class StageCache:
    """How a stage's artefacts are kept in a folder and read back."""

    save: Callable[[Mapping[str, Any], Path], bool]  # artefacts -> files in the folder; False: not kept
    load: Callable[[Path], dict]


@dataclass(frozen=True)
class Stage:
    name: str
    run: Callable[[Ledger], Mapping[str, Any]]  # the ledger in, the artefacts it makes out
    settings: Callable[[Any], Any]  # the build's settings -> the slice this stage reads (keyed)
    reads: tuple[str, ...] = ()
    makes: tuple[str, ...] = ()
    code: tuple[str, ...] = ()  # pipeline modules/packages that compute it (keys.code_hash)
    libraries: tuple[str, ...] = ()
    # content the stage keys besides its slice (the fetch: the bytes it fetched; the write: how they
    # were found): ledger -> data
    content: Callable[[Ledger], Mapping[str, str]] | None = None
    cache: StageCache | None = None  # kept under its key, read back instead of running


class StageContractBroken(RuntimeError):
    """A stage ran without an artefact it reads, or made other artefacts than it declares: a bug."""


@dataclass
class StageRun:
    """The keys and wall times of one run of a table."""

    keys: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)  # stages read from the cache under their key


def stage_keys(table: list[Stage], settings: Any, ledger: Ledger) -> dict[str, str]:
    """Every stage's key, in order, chained through the artefacts each reads. `content` reads the
    ledger as it stands: call this once what it reads is there (the fetch keys its own result)."""
    keys: dict[str, str] = {}
    maker: dict[str, str] = {}
    for stage in table:
        inputs = {f"{name}<-{maker[name]}": keys[maker[name]] for name in stage.reads if name in maker}
        if stage.content is not None:
            inputs.update({f"content:{name}": value for name, value in stage.content(ledger).items()})
        keys[stage.name] = stage_key(stage.name, stage.settings(settings), inputs, stage.code, stage.libraries)
        maker.update({name: stage.name for name in stage.makes})
    return keys


def run_stage(stage: Stage, ledger: Ledger, record: StageRun, boundary: Callable[[str], None] = lambda name: None, key: str | None = None) -> None:
    """Run one stage on the ledger, timed, its contract checked; a cached stage with its `key` is
    read from its entry when there is one, and kept there when it ran."""
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
            made = dict(stage.run(ledger))
            if folder is not None:
                _keep(stage, made, folder)
    finally:
        record.seconds[stage.name] = round(time.perf_counter() - start, 3)
    if set(made) != set(stage.makes):
        raise StageContractBroken(f"stage {stage.name} made {sorted(made)}, not what it declares: {sorted(stage.makes)}")
    ledger.update(made)


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
