"""The contract every graph repair follows, and the hazard record detection returns.

A repair is one module in this folder that defines one `Repair`: its name (the name recipes use and
report.json `steps` record), its order, the stage that runs it, `find(model)` (the hazards it
repairs, as hazard records) and `rewrite(model, settings)`. The rewrite returns a `PassResult`: a
new model (the input is never mutated) and a record of what changed. Rewrites are idempotent:
running one on its own output changes nothing. A rewrite that finds nothing to do returns
`changed=False` and an equal model. pipeline.graph.repairs discovers the modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import onnx

from pipeline.runtime import DEFAULT_VERSION

# Where a repair runs (pipeline.graph.repairs.run_passes keeps this order within one run):
#   source       - the build runs it when `find` reports a hazard it repairs (and recipes may name it)
#   fp16-before  - the fp16 stage runs it on the model it is about to convert (the conversion is
#                  typed by construction: its output needs no repair, precision/typed_fp16.py)
#   last         - every build ends with it, whatever else ran
STAGES = ("source", "fp16-before", "last")

# bundle/EP pairs a hazard can break (bundles as in pipeline.runtime), and the fp16 variant.
BUNDLE_EPS = ("root/webgpu", "root/wasm", "webgpu/webgpu", "webgpu/wasm")
FP16 = "fp16-conversion"


@dataclass
class PassResult:
    model: onnx.ModelProto
    changed: bool
    # One entry per edit, JSON-able: {"node": name, "what": "...", ...}.
    records: list[dict[str, Any]] = field(default_factory=list)

    def as_step(self, name: str) -> dict[str, Any]:
        """The shape of a `steps[]` entry in report.json."""
        return {"name": name, "changed": self.changed, "records": self.records}


@dataclass(frozen=True)
class PassSettings:
    """What a rewrite may depend on besides the model: the onnxruntime-web version the package pins
    and the newest IR version it loads (measured from the release: pipeline.runtime.max_ir_version;
    None where no runtime is known, e.g. `pack inspect`: the IR cap then changes nothing)."""

    runtime_version: str = DEFAULT_VERSION
    max_ir_version: int | None = None


def _finds_nothing(model: onnx.ModelProto) -> list[dict[str, Any]]:
    return []


@dataclass(frozen=True)
class Repair:
    name: str
    order: int  # run order among the repairs of one run: lower first (structure before shapes)
    stage: str
    rewrite: Callable[[onnx.ModelProto, PassSettings], PassResult]
    # The hazards in a model that this repair is about, as `hazard()` records. Records whose
    # `repair` is this repair's name make the build run it (stage "source"); records with
    # `repair=None` are the related patterns it cannot repair, reported all the same.
    find: Callable[[onnx.ModelProto], list[dict[str, Any]]] = _finds_nothing

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"repair '{self.name}': stage {self.stage!r} is not one of {', '.join(STAGES)}")

    def __call__(self, model: onnx.ModelProto, settings: PassSettings | None = None) -> PassResult:
        return self.rewrite(model, settings or PassSettings())


def hazard(node: str, op: str, kind: str, affects: list[str], repair: str | None, detail: str) -> dict[str, Any]:
    """A hazard record: `affects` lists the bundle/EP pairs where it goes wrong, or FP16; `repair`
    is the name of the repair that fixes it, or None when pack cannot."""
    return {"node": node, "op": op, "hazard": kind, "affects": affects, "repair": repair, "detail": detail}
