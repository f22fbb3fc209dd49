"""The repair registry: every module in pipeline/graph/passes/ that defines a `Repair`, and the one
runner that applies repairs (the build's repair stage, the fp16 stage and `pack inspect` use it).

Adding a repair is adding a module to that folder (with its sibling test): discovery finds it, the
build runs it when its `find` reports what it repairs, and hazard detection lists its findings.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, Iterable

import onnx

from pipeline.graph.passes.base import STAGES, PassSettings, Repair
from pipeline.graph.passes.topo_sort import check_order

PACKAGE = "pipeline.graph.passes"
# Modules of the folder that hold the shared contract and helpers rather than a repair.
HELPER_MODULES = frozenset({"base", "topo_sort", "util"})


class RegistryError(Exception):
    """A repair module breaks the registry's rules; the message names the module."""


def discover(*packages: str) -> tuple[Repair, ...]:
    """The repairs defined in the modules of `packages` (default: pipeline/graph/passes), in run
    order. Every module there except the helpers defines exactly one `Repair`; names and orders are
    unique across all the packages."""
    found: list[Repair] = []
    for package in packages or (PACKAGE,):
        root = importlib.import_module(package)
        for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda i: i.name):
            if info.name in HELPER_MODULES:
                continue
            module = importlib.import_module(f"{package}.{info.name}")
            # A Repair imported from a sibling belongs to that sibling: count only this module's own.
            own = {id(v): v for v in vars(module).values() if isinstance(v, Repair) and v.rewrite.__module__ == module.__name__}
            if len(own) != 1:
                raise RegistryError(f"{module.__name__}: a repair module defines exactly one Repair, found {len(own)}")
            found.extend(own.values())
    return _checked(found)


def _checked(repairs: Iterable[Repair]) -> tuple[Repair, ...]:
    ordered = tuple(sorted(repairs, key=lambda r: r.order))
    for kind, key in (("name", lambda r: r.name), ("order", lambda r: r.order)):
        seen: dict[Any, Repair] = {}
        for repair in ordered:
            other = seen.setdefault(key(repair), repair)
            if other is not repair:
                raise RegistryError(f"repairs '{other.name}' and '{repair.name}' share the {kind} {key(repair)!r}")
    return ordered


@functools.cache
def repairs() -> tuple[Repair, ...]:
    """Every registered repair, in run order."""
    return discover()


def names() -> list[str]:
    return [r.name for r in repairs()]


def get(name: str) -> Repair:
    """The repair called `name`; KeyError names the known ones."""
    for repair in repairs():
        if repair.name == name:
            return repair
    raise KeyError(f"unknown repair '{name}'; known: {', '.join(sorted(names()))}")


def in_stage(*stages: str) -> list[Repair]:
    unknown = set(stages) - set(STAGES)
    if unknown:
        raise ValueError(f"unknown stage {sorted(unknown)}; stages: {', '.join(STAGES)}")
    return [r for r in repairs() if r.stage in stages]


def find_hazards(model: onnx.ModelProto, *stages: str) -> list[dict[str, Any]]:
    """What the repairs of `stages` find in the model, repair by repair in run order."""
    return [record for repair in in_stage(*stages) for record in repair.find(model)]


def auto_repairs(model: onnx.ModelProto) -> list[str]:
    """The source-stage repairs this model needs (their `find` reports something they repair), in run order."""
    wanted = {record["repair"] for record in find_hazards(model, "source")}
    return [r.name for r in in_stage("source") if r.name in wanted]


def run_passes(
    model: onnx.ModelProto,
    selected: Iterable[str | Repair],
    settings: PassSettings | None = None,
    *,
    finish: bool = True,
) -> tuple[onnx.ModelProto, list[dict[str, Any]]]:
    """Apply the selected repairs (names or entries) in run order, each once, and return the model
    with one report.json step per repair. A repair that leaves an ordered graph out of order is a
    bug in it: OrderBroken names it. `finish` appends the "last" stage (the IR version cap),
    whose step is recorded only when it changed something or has a note: it runs on every model."""
    settings = settings or PassSettings()
    chosen = {r.name: r for r in (get(s) if isinstance(s, str) else s for s in selected)}
    if finish:
        chosen.update({r.name: r for r in in_stage("last") if r.name not in chosen})
    steps = []
    for repair in sorted(chosen.values(), key=lambda r: r.order):
        result = repair(model, settings)
        if result.changed:
            check_order(model, result.model, f"repair {repair.name}")
        model = result.model
        if repair.stage != "last" or result.changed or result.records:
            steps.append(result.as_step(repair.name))
    return model, steps
