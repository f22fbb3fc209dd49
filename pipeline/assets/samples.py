"""Sample inputs: from --inputs NPZ, per-input .npy files, constants or seeded random ranges. The
`sample.bin` the package ships them in (with their fp32 reference outputs) is pipeline/sample_file.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from pipeline.assets.patterns import generate
from pipeline.dtypes import ONNX_TO_NAME
from pipeline.errors import PackError, warn
from pipeline.recipe import InputSpec, Recipe

ONNX_TO_NUMPY = ONNX_TO_NAME  # the one dtype table (pipeline/dtypes.py)


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def tensor_dtype(info: onnx.ValueInfoProto) -> str:
    elem = info.type.tensor_type.elem_type
    if elem not in ONNX_TO_NUMPY:
        raise PackError(f"model input/output '{info.name}': element type {TensorProto.DataType.Name(elem)} is not supported by pack")
    return ONNX_TO_NUMPY[elem]


def declared_shape(info: onnx.ValueInfoProto) -> list[int | str]:
    dims = info.type.tensor_type.shape.dim
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]


def _resolve_shape(info: onnx.ValueInfoProto, spec: InputSpec | None, where: str) -> list[int]:
    model_shape = declared_shape(info)
    shape = spec.shape if spec and spec.shape is not None else model_shape
    if len(shape) != len(model_shape) and info.type.tensor_type.HasField("shape"):
        raise PackError(f"{where} '{info.name}': shape {shape} has rank {len(shape)}, the model expects {model_shape}")
    symbolic = [d for d in shape if not isinstance(d, int)]
    if symbolic:
        # The example is a shape --input accepts as printed: a size (1) in place of each symbolic dim.
        example = "x".join(str(d) if isinstance(d, int) else "1" for d in shape)
        raise PackError(f"input '{info.name}' has symbolic dims {symbolic} ({model_shape}); give each a size for the sample, e.g. --input {info.name}={example} or recipe key inputs.{info.name}.shape")
    for want, declared in zip(shape, model_shape):
        if isinstance(declared, int) and declared and want != declared:
            raise PackError(f"{where} '{info.name}': shape {shape} does not match the model's {model_shape}")
    return shape


def check_recipe_io(model: onnx.ModelProto, recipe: Recipe) -> None:
    """Every `inputs.<name>` and `outputs.<name>` table of the recipe names a real input/output."""
    names = {i.name for i in graph_inputs(model)}
    for name, spec in recipe.inputs.items():
        if name not in names:
            where = f"--input '{spec.option}'" if spec.option else f"{_recipe_where(recipe)}key 'inputs.{name}'"
            raise PackError(f"{where}: the model has no input '{name}'; its inputs are: {', '.join(sorted(names))}")
    outputs = [o.name for o in model.graph.output]
    for name in recipe.outputs:
        if name not in outputs:
            raise PackError(f"{_recipe_where(recipe)}key 'outputs.{name}': the model has no output '{name}'; its outputs are: {', '.join(outputs)}; rename the table")


def _recipe_where(recipe: Recipe) -> str:
    return f"{recipe.path}: " if recipe.path else "recipe "


def _read_npz(npz: Path, inputs: list[onnx.ValueInfoProto], recipe: Recipe) -> dict[str, np.ndarray]:
    """The arrays of an --inputs archive: no unknown keys, and every input that the recipe does
    not fill itself (file, value or range) present, so no input is silently made up."""
    names = {i.name for i in inputs}
    try:
        with np.load(npz, allow_pickle=False) as archive:
            given = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise PackError(f"--inputs {npz}: cannot read as .npz ({error}); save with numpy.savez(path, name=array)") from None
    unknown = sorted(set(given) - names)
    if unknown:
        raise PackError(f"--inputs {npz}: keys {unknown} are not model inputs; expected {sorted(names)}")

    def recipe_fills(name: str) -> bool:
        spec = recipe.inputs.get(name)
        return bool(spec and (spec.file or spec.value is not None or spec.range))

    missing = [i.name for i in inputs if i.name not in given and not recipe_fills(i.name)]
    if missing:
        raise PackError(f"--inputs {npz}: no array for input(s) {', '.join(missing)}; add them to the .npz (numpy.savez(path, {missing[0]}=array, ...)) or give them in the recipe's inputs table")
    return given


def _npz_array(array: np.ndarray, dtype: str, name: str, where: str) -> np.ndarray:
    """The array in the model's dtype: equal dtypes pass, an exact widening (float16 -> float32,
    int32 -> int64, ..., or a scalar whose value survives the cast) is cast with one warning
    line, anything else is refused (a silent
    narrowing would verify the package on other numbers than the ones given)."""
    if array.dtype == np.dtype(dtype):
        return array
    cast = array.astype(dtype)
    if np.can_cast(array.dtype, dtype, casting="safe") or (array.ndim == 0 and cast == array):
        warn(f"{where}: '{name}' is {array.dtype}, cast to the model's {dtype} (exact, no value changes)")
        return cast
    raise PackError(f"{where}: '{name}' is {array.dtype}, the model expects {dtype}; save it as {dtype} (array.astype('{dtype}'))")


def make_feeds(model: onnx.ModelProto, recipe: Recipe, npz: Path | None) -> dict[str, np.ndarray]:
    check_recipe_io(model, recipe)
    inputs = graph_inputs(model)
    given = _read_npz(npz, inputs, recipe) if npz is not None else {}
    rng = np.random.default_rng(recipe.seed)
    feeds: dict[str, np.ndarray] = {}
    for info in inputs:
        dtype = tensor_dtype(info)
        spec = recipe.inputs.get(info.name)
        if spec and spec.dtype and spec.dtype != dtype:
            raise PackError(f"recipe key 'inputs.{info.name}.dtype': '{spec.dtype}' but the model's input is {dtype}; remove the key or fix it")
        if info.name in given:
            array = np.asarray(given[info.name])
            where = f"--inputs {npz}"
        elif spec and spec.file:
            try:
                array = np.load(spec.file, allow_pickle=False)
            except (OSError, ValueError) as error:
                raise PackError(f"recipe key 'inputs.{info.name}.file': cannot read {spec.file} ({error}); give a .npy file") from None
            where = f"inputs.{info.name}.file"
        else:
            shape = _resolve_shape(info, spec, "--input" if spec and spec.option else "recipe input")
            if spec and spec.pattern:
                # Seeded by the recipe alone, so inputs that describe one signal stay consistent.
                feeds[info.name] = generate(spec, shape, dtype, recipe.seed)
                continue
            if spec and spec.value is not None:
                array = np.full(shape, spec.value)
            elif np.dtype(dtype).kind == "f":
                low, high = spec.range if spec and spec.range else (-1.0, 1.0)
                array = rng.uniform(low, high, size=shape)
            elif np.dtype(dtype).kind in "iu":
                low, high = spec.range if spec and spec.range else (0, 1)
                array = rng.integers(int(low), int(high), size=shape, endpoint=True)
            else:
                array = np.zeros(shape, dtype=bool)
            feeds[info.name] = array.astype(dtype)
            continue
        array = _npz_array(array, dtype, info.name, where)
        if array.ndim == 0 and declared_shape(info):
            array = np.full(_resolve_shape(info, spec, where), array, dtype=dtype)
        _resolve_shape(info, InputSpec(info.name, shape=list(array.shape)), where)
        feeds[info.name] = array
        check_finite(array, info.name, where)
    for name, array in feeds.items():  # what the recipe made: a value = nan in a recipe table
        check_finite(array, name, f"{_recipe_where(recipe)}key 'inputs.{name}'")
    return feeds


def check_finite(array: np.ndarray, name: str, where: str) -> None:
    """Every value of a float sample input is finite: the checks compare the variants' outputs on
    these inputs, and NaN or Inf in them makes every comparison vacuous."""
    if array.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(array)
    if bad.any():
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        value = array[index] if index else array.item()
        raise PackError(f"{where}: input '{name}' is {value} at index {list(index)} ({int(bad.sum())} of its {array.size} values are NaN or Inf); "
                        "give finite sample values: a non-finite input makes every check vacuous")
