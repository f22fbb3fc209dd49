"""A size for each dynamic dim of the sample that the model accepts: the example the error printed
when no shape is given.

A size of 1 for every dynamic dim is what most exporters' graphs refuse (a detector's Concat across
strides, a conv net that pools below 1x1), so the example is tried on onnxruntime: the batch-like
leading dim gets 1, every other dynamic dim the first of a few multiples of 32 (the strides of image
models divide them) at which the model runs on zeros. Only the error path runs it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from pipeline.cache import temporary_folder
from pipeline.graph.model_io import PROTOBUF_LIMIT, save_model
from pipeline.verify.engines.host import run_model

CANDIDATE_SIZES = (32, 64, 128, 256, 320, 640)


@dataclass
class ShapeExample:
    shapes: dict[str, list[int]]  # input -> a size for every dim
    tried: str  # how the example was found, for the error line


def _sized(shape: list[int | str], size: int) -> list[int]:
    return [d if isinstance(d, int) else (1 if i == 0 else size) for i, d in enumerate(shape)]


def example_shapes(model: onnx.ModelProto, shapes: dict[str, list[int | str]], dtypes: dict[str, str], others: dict[str, np.ndarray]) -> ShapeExample:
    """Sizes for every input in `shapes` (each dim an int or a dynamic name); the first candidate
    at which onnxruntime runs the model, fed `others` for the remaining inputs, or the last tried
    with a note saying none ran."""
    if model.ByteSize() > PROTOBUF_LIMIT:
        return ShapeExample({name: _sized(shape, CANDIDATE_SIZES[0]) for name, shape in shapes.items()}, "not tried: the model is over 2 GiB")
    errors: list[str] = []
    with temporary_folder("pack-shape-") as folder:
        path = Path(folder) / "model.onnx"
        save_model(model, path)
        for size in CANDIDATE_SIZES:
            sized = {name: _sized(shape, size) for name, shape in shapes.items()}
            run = run_model(path, {**others, **{name: np.zeros(shape, dtype=dtypes[name]) for name, shape in sized.items()}})
            if run.outputs is not None:
                return ShapeExample(sized, "onnxruntime runs the model at this size")
            errors.append(run.error or "")
    return ShapeExample(sized, f"onnxruntime ran none of the sizes {', '.join(str(s) for s in CANDIDATE_SIZES)} on zeros (last: {errors[-1][:160]}); give the size the model was made for")
