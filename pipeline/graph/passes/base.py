"""The contract every graph repair follows.

A pass takes an `onnx.ModelProto` and returns a `PassResult`: a new model (the input is never
mutated) and a record of what changed. Passes are idempotent: running one on its own output changes
nothing. A pass that finds nothing to do returns `changed=False` and an equal model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import onnx


@dataclass
class PassResult:
    model: onnx.ModelProto
    changed: bool
    # One entry per edit, JSON-able: {"node": name, "what": "...", ...}.
    records: list[dict[str, Any]] = field(default_factory=list)

    def as_step(self, name: str) -> dict[str, Any]:
        """The shape of a `steps[]` entry in report.json."""
        return {"name": name, "changed": self.changed, "records": self.records}


class GraphPass(Protocol):
    name: str

    def __call__(self, model: onnx.ModelProto) -> PassResult: ...
