"""What a build hands every stage besides its artefacts: the options as given, progress, the
staging folder, and the lock files it reads.

A stage's result may depend only on what its key holds: the options and locks are here so a stage
can reach the files they name (the sample npz, the fp16 entry's file for its messages); what in them
changes results is in the build's settings (pipeline/build.py `BuildSettings`) and keyed from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.lockfile import LockFile
from pipeline.progress import Progress


@dataclass
class BuildOptions:
    target: str  # recipe name, recipe path, or model path
    source: str | None = None
    source_sha256: str | None = None  # --sha256: the hash --source must have (else the recipe's or the lock's)
    source_data_sha256: dict[str, str] = field(default_factory=dict)  # --sha256 FILE=HEX: its external data files'
    name: str | None = None  # --name: a bare model's package name
    inputs_npz: Path | None = None
    input_shapes: list[str] = field(default_factory=list)
    out_dir: Path = Path("dist")
    browser: bool = True
    gpu: bool = False
    lock: Path | None = None  # --lock; default: beside the recipe (pipeline/lockfile.py)
    reuse: bool = True  # link a stored passed build with the same inputs (pipeline/reuse.py)
    grid: Any = None  # verify.browser.grid.GridSettings: --browser/--cdp endpoints; None: the local browser
    engines: tuple[str, ...] = ("chromium",)  # --engines: where the browser checks (harness.py) and the default load (default_load.py) run


@dataclass(frozen=True)
class BuildLocks:
    """The build's two lock files (pipeline/lockfile.py says where each lies), found once."""

    source: LockFile  # the source pins the fetch checks and writes
    fp16: LockFile  # the fp16 nodes kept in fp32: read by convert, written by the runner

    @property
    def path(self) -> Path | None:
        """The one that exists (the summary names it)."""
        for lock in (self.source, self.fp16):
            if lock.path is not None and lock.path.is_file():
                return lock.path
        return None


@dataclass
class StageContext:
    options: BuildOptions
    progress: Progress
    locks: BuildLocks
    staging: Path | None = None  # the package's staging folder, from the models stage on
