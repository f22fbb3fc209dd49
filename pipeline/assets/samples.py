"""Sample inputs: from --inputs NPZ, per-input .npy files, constants or seeded random ranges. The
`sample.bin` the package ships them in (with their fp32 reference outputs) is pipeline/sample_file.py.

A generated sample must make the decisions the checks judge (pipeline/verify/judgement/decisions.py):
where fp32 decides nothing on it (every CTC step blank, no box over the threshold, a mask on one
side), the next seeds are tried (`decisive_feeds`), and the one that decides is used, said in a
warning; a sample the user gives is used as given."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto

from pipeline.assets.patterns import generate
from pipeline.assets.sample_domain import guess_domain
from pipeline.assets.shape_example import example_shapes
from pipeline.cache import temporary_folder
from pipeline.dtypes import ONNX_TO_NAME
from pipeline.errors import PackError, warn
from pipeline.graph.model_io import model_bytes
from pipeline.graph.passes.util import dims_of
from pipeline.recipe import InputSpec, Recipe
from pipeline.verify.engines.host import run_model
from pipeline.verify.judgement.decisions import undecided

ONNX_TO_NUMPY = ONNX_TO_NAME  # the one dtype table (pipeline/dtypes.py)
SAMPLE_SEEDS = 8  # seeds tried for a generated sample on which fp32 decides something
MAX_TRIAL_BYTES = 1_900_000_000  # a model over protobuf's 2 GB is not written out for trial runs


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializers = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in initializers]


def tensor_dtype(info: onnx.ValueInfoProto) -> str:
    elem = info.type.tensor_type.elem_type
    if elem not in ONNX_TO_NUMPY:
        raise PackError(f"model input/output '{info.name}': element type {TensorProto.DataType.Name(elem)} is not supported by pack")
    return ONNX_TO_NUMPY[elem]


def declared_shape(info: onnx.ValueInfoProto) -> list[int | str]:
    """The declared shape: a size for each fixed dim, a name ('?' when it has none) for each dynamic one."""
    return [d if d is not None else "?" for d in dims_of(info) or []]


def _requested_shape(info: onnx.ValueInfoProto, spec: InputSpec | None) -> list[int | str]:
    return spec.shape if spec and spec.shape is not None else declared_shape(info)


def _resolve_shape(info: onnx.ValueInfoProto, spec: InputSpec | None, where: str) -> list[int]:
    model_shape = declared_shape(info)
    shape = _requested_shape(info, spec)
    if len(shape) != len(model_shape) and info.type.tensor_type.HasField("shape"):
        raise PackError(f"{where} '{info.name}': shape {shape} has rank {len(shape)}, the model expects {model_shape}")
    symbolic = [d for d in shape if not isinstance(d, int)]
    if symbolic:  # make_feeds names a size that runs before it gets here; this is a scalar of --inputs
        raise PackError(f"input '{info.name}' has dynamic dims {symbolic} ({model_shape}); give each a size for the sample with --input {info.name}=SHAPE or recipe key inputs.{info.name}.shape")
    for want, declared in zip(shape, model_shape):
        if isinstance(declared, int) and want != declared:
            raise PackError(f"{where} '{info.name}': shape {shape} does not match the model's {model_shape}")
    return shape


def _check_sized(model: onnx.ModelProto, inputs: list[onnx.ValueInfoProto], given: dict[str, np.ndarray], recipe: Recipe) -> None:
    """Inputs to be made up whose shape keeps dynamic dims: one error naming them all, with an
    --input example that onnxruntime runs (pipeline/assets/shape_example.py)."""
    def made_up(info: onnx.ValueInfoProto) -> bool:
        spec = recipe.inputs.get(info.name)
        return info.name not in given and not (spec and spec.file)

    shapes = {info.name: _requested_shape(info, recipe.inputs.get(info.name)) for info in inputs if made_up(info)}
    unsized = [name for name, shape in shapes.items() if any(not isinstance(d, int) for d in shape)]
    if not unsized:
        return
    others = {name: np.asarray(array) for name, array in given.items()}
    for info in inputs:  # a recipe's .npy files are read as make_feeds reads them, errors included
        spec = recipe.inputs.get(info.name)
        if info.name not in given and spec and spec.file:
            try:
                others[info.name] = np.load(spec.file, allow_pickle=False)
            except (OSError, ValueError):
                return  # make_feeds names the unreadable file
    example = example_shapes(model, shapes, {info.name: tensor_dtype(info) for info in inputs if info.name in shapes}, others)
    options = " ".join(f"--input {name}={'x'.join(str(d) for d in example.shapes[name])}" for name in unsized)
    what = "; ".join(f"'{name}' {shapes[name]}" for name in unsized)
    keys = ", ".join(f"inputs.{name}.shape" for name in unsized)
    raise PackError(f"dynamic dims without a size for the sample: {what}; give each a size, e.g. {options} ({example.tried}), or recipe key {keys}")


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


@dataclass
class Sample:
    feeds: dict[str, np.ndarray]
    step: dict  # the build's record of where each input came from (report.json `steps`)


def _made_up(model: onnx.ModelProto, info: onnx.ValueInfoProto, spec: InputSpec | None, shape: list[int], dtype: str, rng: np.random.Generator, seed: int) -> tuple[np.ndarray, str]:
    """A made-up sample for one input and what it is: the recipe's pattern, value or range, else the
    domain the graph suggests (pipeline/assets/sample_domain.py)."""
    if spec and spec.pattern:
        # Seeded by the recipe alone, so inputs that describe one signal stay consistent.
        return generate(spec, shape, dtype, seed), f"recipe pattern '{spec.pattern}'"
    if spec and spec.value is not None:
        return np.full(shape, spec.value).astype(dtype), f"recipe value {spec.value}"
    if spec and spec.range:
        low, high = spec.range
        what = f"recipe range [{low}, {high}]"
    elif np.dtype(dtype).kind == "b":
        return np.zeros(shape, dtype=bool), "all false: nothing in the recipe or the graph says its domain"
    else:
        domain = guess_domain(model, info.name, shape, dtype)
        if domain.pattern:
            made = generate(InputSpec(info.name, range=(domain.low, domain.high), pattern=domain.pattern), shape, dtype, seed)
            return made, f"{domain.pattern} pattern in [{domain.low:g}, {domain.high:g}], {domain.why}"
        low, high, what = domain.low, domain.high, domain.why
    if np.dtype(dtype).kind == "f":
        return rng.uniform(low, high, size=shape).astype(dtype), what
    return rng.integers(int(low), int(high), size=shape, endpoint=True).astype(dtype), what


def make_feeds(model: onnx.ModelProto, recipe: Recipe, npz: Path | None, seed: int | None = None) -> Sample:
    """The sample inputs and where each came from; generated ones from `seed` (default: the recipe's
    `verify.seed`)."""
    seed = recipe.seed if seed is None else seed
    check_recipe_io(model, recipe)
    inputs = graph_inputs(model)
    given = _read_npz(npz, inputs, recipe) if npz is not None else {}
    _check_sized(model, inputs, given, recipe)
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    origins: list[dict] = []
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
            feeds[info.name], what = _made_up(model, info, spec, shape, dtype, rng, seed)
            origins.append({"input": info.name, "synthetic": True, "what": f"{info.name}: synthetic, {what}"})
            continue
        array = _npz_array(array, dtype, info.name, where)
        if array.ndim == 0 and declared_shape(info):
            array = np.full(_resolve_shape(info, spec, where), array, dtype=dtype)
        _resolve_shape(info, InputSpec(info.name, shape=list(array.shape)), where)
        feeds[info.name] = array
        check_finite(array, info.name, where)
        origins.append({"input": info.name, "synthetic": False, "what": f"{info.name}: from {npz.name if info.name in given else spec.file.name}"})
    for name, array in feeds.items():  # what the recipe made: a value = nan in a recipe table
        check_finite(array, name, f"{_recipe_where(recipe)}key 'inputs.{name}'")
    synthetic = [o for o in origins if o["synthetic"]]
    # `changed` puts the step in the build summary: a made-up sample is worth a line there
    return Sample(feeds, {"name": "sample", "changed": bool(synthetic), "records": synthetic or origins})


def _seeded(model: onnx.ModelProto, recipe: Recipe, npz: Path | None) -> bool:
    """Whether some input of the sample is generated from the seed (not given, not a constant)."""
    given = set(_read_npz(npz, graph_inputs(model), recipe)) if npz is not None else set()
    return any(info.name not in given and not (spec and (spec.file or (spec.value is not None and not spec.pattern)))
               for info in graph_inputs(model) for spec in [recipe.inputs.get(info.name)])


def decisive_feeds(model: onnx.ModelProto, recipe: Recipe, npz: Path | None) -> Sample:
    """make_feeds, with the first of SAMPLE_SEEDS seeds (from the recipe's) on which fp32 decides
    something from every output of a decision kind (`recipe.outputs`, the graph's kinds included).
    A sample the user gives, or a model with no such output, is taken as it is; when no seed makes a
    decision the recipe's seed stays, the warning says so, and the checks say not-verifiable."""
    sample = make_feeds(model, recipe, npz)
    deciding = {name: spec.decision() for name, spec in recipe.outputs.items() if spec.decision()}
    if not deciding or not _seeded(model, recipe, npz) or model.ByteSize() > MAX_TRIAL_BYTES:
        return sample
    where = f"{_recipe_where(recipe)}key 'verify.seed'"
    with temporary_folder("pack-sample-") as folder:
        path = Path(folder) / "model.onnx"
        path.write_bytes(model_bytes(model))
        first: dict[str, str] = {}
        for seed in range(recipe.seed, recipe.seed + SAMPLE_SEEDS):
            candidate = sample if seed == recipe.seed else make_feeds(model, recipe, npz, seed)
            run = run_model(path, candidate.feeds)
            if run.outputs is None:
                return sample  # the reference run says why, with the recipe's sample
            idle = {name: why for name, decision in deciding.items() if name in run.outputs and (why := undecided(run.outputs[name], decision))}
            if not idle:
                if seed != recipe.seed:
                    warn(f"{where}: fp32 decides nothing on the sample of seed {recipe.seed} ({_told(first)}); the sample is made with seed {seed}, on which it does")
                return candidate
            first = first or idle
    warn(f"{where}: fp32 decides nothing on the samples of seeds {recipe.seed} to {recipe.seed + SAMPLE_SEEDS - 1} ({_told(first)}); "
         "its decision checks will be not-verifiable: give a sample that makes a decision (--inputs, or inputs.X.file)")
    return sample


def _told(idle: dict[str, str]) -> str:
    return "; ".join(f"{name}: {why}" for name, why in idle.items())


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
