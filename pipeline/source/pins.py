"""A model pinned whole: the graph file and each external data file it names, each by sha256.

A pin of the graph alone does not cover the weights of an Optimum-style export (`model.onnx` +
`model.onnx.data`): the graph names its data file by location only, so a changed data file would
build against the old pin. The hashes of the data files come from `--sha256 FILE=HEX` (repeatable,
beside `--sha256 HEX` for the graph), the recipe's `source.data_sha256` table, or the lock's pin.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.errors import PackError
from pipeline.reuse import source_hashes

HEX64 = re.compile(r"[0-9a-fA-F]{64}")


def parse_sha256_options(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """`--sha256 HEX` (the graph file) and `--sha256 FILE=HEX` (an external data file beside it)."""
    graph: str | None = None
    data: dict[str, str] = {}
    for value in values:
        name, sep, digest = value.rpartition("=")
        if not HEX64.fullmatch(digest):
            raise PackError(f"--sha256 {value!r}: expected 64 hex digits, or FILE=<64 hex digits> for an external data file (`sha256sum FILE` prints them)")
        if not sep:
            if graph is not None:
                raise PackError(f"--sha256 {value!r}: the graph file's sha256 is given twice; give one, and FILE=HEX for each external data file")
            graph = digest.lower()
        elif not name or "/" in name or "\\" in name:
            raise PackError(f"--sha256 {value!r}: FILE must be the data file's name as the model names it (beside the model), e.g. model.onnx.data=HEX")
        else:
            data[name] = digest.lower()
    if data and graph is None:
        raise PackError(f"--sha256 {next(iter(data))}=HEX pins an external data file beside the graph; give the graph's --sha256 HEX with it")
    return graph, data


def data_hashes(model_path: Path, graph_sha256: str | None) -> dict[str, str]:
    """sha256 of each external data file the model names, by the name it gives it."""
    return {name: sha for name, sha in source_hashes(model_path, graph_sha256).items() if name != model_path.name}


def check_data(model_path: Path, actual: dict[str, str], expected: dict[str, str], where: str, add: str) -> None:
    """Every data file the model names is pinned in `expected` and has its hash, and `expected`
    names no other file; `where` names the pins (an option, a recipe key, a lock file), `add` how
    to add one (formatted with `name` and `sha`)."""
    unknown = sorted(set(expected) - set(actual))
    if unknown:
        names = ", ".join(sorted(actual)) or "none"
        raise PackError(f"{where}: {model_path.name} names no external data file {unknown[0]}; the files it names: {names}")
    for name, sha in sorted(actual.items()):
        if name not in expected:
            raise PackError(f"{model_path.name}: its external data file {name} (sha256 {sha}) is not pinned by {where}; add {add.format(name=name, sha=sha)}")
        if expected[name] != sha:
            raise PackError(f"{model_path.parent / name}: external data of {model_path.name} has sha256 {sha}, {where} expects {expected[name]}; a changed data file: restore it, or if it is meant, pin it again ({add.format(name=name, sha=sha)})")
