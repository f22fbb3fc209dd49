"""manifest.json, schema 2: its types, its one builder, its one validator, and the refusal rule.

The JSON Schema shipped beside this module (manifest.schema.json) is the contract every reader
codes against (the browser loader, `pack verify`, `pack publish`, the test helpers);
`validate()` adds the cross-references a schema cannot state (every path named is listed in
`files`, every EP of a chain has variants and a bundle). docs/ARCHITECTURE.md explains the keys.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Literal, NotRequired, TypedDict


from pipeline.errors import PackError

SCHEMA_VERSION = 2
BROWSER_EPS = ("webgpu", "wasm")
WILDCARD = "*"
# The browser engines pack verifies in (`--engines`, recipe `[verify] engines`). Chromium is the
# build's own engine: its browser runs carry no `engine` key, as in every manifest before engines.
ENGINES = ("chromium", "firefox", "webkit")
BUILD_ENGINE = "chromium"

Status = Literal["passed", "failed", "not-verifiable", "skipped"]


class Encoding(TypedDict):
    path: str
    size: int


class FileEntry(TypedDict):
    sha256: str
    integrity: str  # SRI string of the decoded bytes
    size: int  # decoded bytes
    mediaType: str
    encodings: dict[str, Encoding]  # {"br": ...} where a brotli copy pays, else {}
    cache: Literal["immutable", "short"]  # immutable: content-hashed name
    stored: NotRequired[Literal["br"]]  # an export's folder holds only this encoding's body (pack export)


class Chunk(TypedDict):
    file: str  # a package file: the chunk's bytes as coded (files[file] has their sha256 and size)
    offset: int  # where the decoded bytes go in the external data
    size: int
    sha256: str  # of the decoded bytes
    coding: dict[str, int]  # {"planes": n}: n byte planes, re-interleaved after brotli (1: as is)


class Widened(TypedDict):
    offset: int  # fp16 values from here to the end of the external data, widened to float32
    size: int  # of the widened external data: offset + 2 * (externalData.size - offset)
    sha256: str  # of the widened external data


class ExternalData(TypedDict):
    path: str  # the location the graph's initializers name (onnxruntime-web's externalData path)
    size: int
    sha256: str
    chunks: list[Chunk]  # in offset order, covering [0, size)
    widened: NotRequired[Widened]  # fp16w: what the loader widens the external data to


class VariantEntry(TypedDict):
    precision: str  # fp32 | fp16 | fp16w (fp32 graph, fp16-stored weights) | quantized
    model: str
    requires: list[str]
    externalData: NotRequired[ExternalData]  # weights in chunks; absent when the model is one file
    widen: NotRequired[str]  # "fp16-initializers": the loader widens the model first


class SampleTensor(TypedDict):
    dtype: str
    dims: list[int]
    offset: int
    length: int
    values: NotRequired[list[float]]  # a small input's values, flattened, for the loader's pre-warm


class SplitFile(TypedDict):
    sha256: str  # of the whole file: its parts' bytes joined in order
    size: int
    mediaType: str
    parts: list[str]  # package files (listed in `files`), each at most [assets] max_file_mib


class Sample(TypedDict):
    file: str
    tensors: dict[str, SampleTensor]  # the sample inputs
    outputs: dict[str, SampleTensor]  # their fp32 reference outputs, after the inputs


class Run(TypedDict):
    stage: Literal["host", "browser", "webgpu-kernels"]
    bundle: str  # webgpu | wasm | *
    ep: str  # cpu | webgpu | wasm | *
    variant: str
    status: Status
    detail: NotRequired[str]  # the first failed check with figure and bound; absent when passed
    engine: NotRequired[str]  # a browser run in another engine than the build's own (Chromium): firefox | webkit


class AdapterRuns(TypedDict):
    adapter: dict[str, Any]  # vendor, architecture, description, fallback
    browsers: list[str]  # "Chromium 150.0.7871.100 on Linux"
    runs: list[Run]  # the browser runs on devices of this adapter class


class RefusedEp(TypedDict):
    ep: str
    platforms: list[str]  # the platform chains it had no usable variant in
    evidence: str  # the failed runs


# evidence: each pair whose default load failed, in which engine, and the error ("from" is a keyword: the functional form)
NarrowedChain = TypedDict("NarrowedChain", {"platform": str, "from": list[str], "to": list[str], "evidence": str})


class Verification(TypedDict):
    browser: bool
    passed: bool  # package_verdict: every chain keeps a verified variant per EP
    runs: list[Run]
    adapters: NotRequired[list[AdapterRuns]]  # per adapter class, when verified on several browsers
    require: NotRequired[list[str]]  # [verify] require: variants and EPs
    requireEngines: NotRequired[list[str]]  # [verify] engines: the package rule must hold read in each
    refusedEps: NotRequired[list[RefusedEp]]  # EPs no variant is usable on (they left the chains they could)
    narrowedChains: NotRequired[list[NarrowedChain]]  # chains a failed default load narrowed (verify/engines/browser/default_load.py)


class Measurement(TypedDict):
    source: Literal["build", "gpu", "benchmark"]
    browser: str
    adapter: dict[str, str] | None
    bundle: str
    ep: str
    variant: str
    createMs: float | None
    firstMs: float | None
    steadyMs: float | None


class LoaderSettings(TypedDict):
    watchdogMs: int
    prewarm: bool
    select: Literal["measured", "chain"]


# thresholds[ep][variant][output][metric] = bound (metric names of pipeline/verify/judgement/metrics.py)
Thresholds = dict[str, dict[str, dict[str, dict[str, float]]]]


class Manifest(TypedDict):
    schema: int
    name: str
    description: NotRequired[str | None]
    files: dict[str, FileEntry]
    split: NotRequired[dict[str, SplitFile]]  # files over [assets] max_file_mib, stored as parts
    variants: dict[str, VariantEntry]
    variantFor: dict[str, list[str]]
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    sample: Sample
    runtime: dict[str, Any]
    executionProviders: dict[str, list[str]]
    epOptions: dict[str, dict[str, Any]]
    loader: LoaderSettings
    thresholds: Thresholds
    verification: Verification
    measurements: list[Measurement]
    license: str | None
    fp16: NotRequired[dict[str, Any]]


def chain_bundle(chain: Iterable[str]) -> str:
    """The runtime bundle a platform chain loads: webgpu when the chain has webgpu, else wasm."""
    return "webgpu" if "webgpu" in chain else "wasm"


def variant_files(variant: VariantEntry | dict) -> list[str]:
    """The package files a variant's session needs: its model file, then its weight chunks, if any."""
    return [variant["model"], *(chunk["file"] for chunk in (variant.get("externalData") or {}).get("chunks", []))]


def file_parts(manifest: Manifest | dict, path: str) -> list[str]:
    """The package files that hold `path`: its parts when it is split, else itself."""
    split = (manifest.get("split") or {}).get(path)
    return list(split["parts"]) if split else [path]


def stored_body(path: str, entry: FileEntry | dict) -> str:
    """Where a listed file's own body lies: the file, or its encoded body where only that is `stored` (an export)."""
    stored = entry.get("stored")
    return entry["encodings"][stored]["path"] if stored else path


def stored_paths(manifest: Manifest | dict) -> list[str]:
    """Every package path the folder holds for the listed files: each one's body, then its other encodings."""
    paths = []
    for path, entry in manifest["files"].items():
        paths.append(stored_body(path, entry))
        paths += [encoding["path"] for name, encoding in entry["encodings"].items() if name != entry.get("stored")]
    return paths


def make_manifest(
    *,
    name: str,
    files: dict[str, FileEntry],
    variants: dict[str, VariantEntry],
    variant_for: dict[str, list[str]],
    inputs: list[dict[str, Any]],
    outputs: list[dict[str, Any]],
    sample: Sample,
    runtime: dict[str, Any],
    execution_providers: dict[str, list[str]],
    loader: LoaderSettings,
    ep_options: dict[str, dict[str, Any]] | None = None,
    thresholds: Thresholds | None = None,
    verification: Verification | None = None,
    measurements: list[Measurement] | None = None,
    license: str | None = None,
    description: str | None = None,
    fp16: dict[str, Any] | None = None,
    split: dict[str, SplitFile] | None = None,
    where: str = "manifest.json",
) -> Manifest:
    """The one way a manifest is made (the build, and test packages); validated before it is returned."""
    manifest: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "name": name,
        "description": description,
        "files": dict(sorted(files.items())),
        **({"split": dict(sorted(split.items()))} if split else {}),
        "variants": variants,
        "variantFor": variant_for,
        "inputs": inputs,
        "outputs": outputs,
        "sample": sample,
        "runtime": runtime,
        "executionProviders": execution_providers,
        "epOptions": ep_options or {},
        "loader": loader,
        "thresholds": thresholds or {},
        "verification": verification or {"browser": False, "passed": False, "runs": []},
        "measurements": measurements or [],
        "license": license,
    }
    if fp16 is not None:
        manifest["fp16"] = fp16
    return validate(manifest, where)


@functools.cache
def _schema_text() -> str:
    return resources.files(__package__).joinpath("manifest.schema.json").read_text(encoding="utf-8")


@functools.cache
def required_keys() -> dict[str, list[str]]:
    """The keys the schema requires, by where they sit: "" (the top level), "variants.*" (each
    variant), and each required top-level object's own ("sample", "runtime", ...). The loader's
    check (web_template/loader/manifest_keys.js, `loader_keys_module`) is generated from this."""
    schema = json.loads(_schema_text())
    keys = {"": list(schema["required"])}
    for name, spec in schema["properties"].items():
        if name in schema["required"] and isinstance(spec.get("required"), list):
            keys[name] = list(spec["required"])
        item = spec.get("additionalProperties")
        if isinstance(item, dict) and isinstance(item.get("required"), list):
            keys[f"{name}.*"] = list(item["required"])
    return keys


def loader_keys_module() -> str:
    """web_template/loader/manifest_keys.js: the schema's required keys for the loader's check."""
    body = "{\n" + "".join(f"  {json.dumps(where)}: {json.dumps(keys)},\n" for where, keys in required_keys().items()) + "}"
    return ("// Generated from pipeline/manifest.schema.json by pipeline/manifest.py `loader_keys_module`\n"
            "// (tests/test_manifest.py checks it is current): the keys a manifest must have, by where they sit.\n"
            f"export const REQUIRED_KEYS = Object.freeze({body});\n")


def _validator():  # -> jsonschema.Draft202012Validator; imported here, as commands that never validate need it not
    import jsonschema

    return jsonschema.Draft202012Validator(json.loads(_schema_text()))


def _first_error(manifest: Any):
    import jsonschema.exceptions

    return jsonschema.exceptions.best_match(_validator().iter_errors(manifest))


def key_path(parts: Iterable[Any]) -> str:
    """`outputs[0].dtype`, `files["model.fp16.0123456789abcdef.onnx"].cache`: a key as a reader finds it."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            text += f".{part}" if text else part
        else:
            text += f"[{json.dumps(part)}]"
    return text


def validate(manifest: Any, where: str | Path, schema_checked: bool = False) -> Manifest:
    """`manifest` unchanged when it is a valid schema-2 manifest; else PackError naming the key.
    `schema_checked`: these exact bytes already passed this schema (see read_manifest)."""
    if not isinstance(manifest, dict):
        raise PackError(f"{where}: not a JSON object; rebuild the package with this version of pack")
    if manifest.get("schema") != SCHEMA_VERSION:
        raise PackError(
            f'{where}: key "schema": {manifest.get("schema")!r} is not {SCHEMA_VERSION}; '
            "rebuild the package with this version of pack"
        )
    error = None if schema_checked else _first_error(manifest)
    if error is not None:
        parts = list(error.absolute_path)
        message = error.message
        if error.validator == "required":
            missing = next(key for key in error.validator_value if key not in error.instance)
            parts.append(missing)
            message = "missing"
        elif error.validator == "additionalProperties" and error.validator_value is False:
            parts.append(sorted(key for key in error.instance if key not in error.schema.get("properties", {}))[0])
            message = "not a key of schema 2"
        elif error.validator in ("minProperties", "minItems"):
            message = "empty"
        elif error.validator == "pattern" and error.schema.get("description"):
            message = f"{error.instance!r}: {error.schema['description']}"
        raise PackError(f'{where}: key "{key_path(parts)}": {_short(message)}; rebuild the package with this version of pack')
    _check_references(manifest, where)
    return manifest  # type: ignore[return-value]


def _check_references(manifest: dict[str, Any], where: str | Path) -> None:
    """What the schema cannot say: each path the loader fetches is listed in `files`, and each
    platform chain has a bundle and variants for every EP it names."""

    def fail(parts: list[Any], message: str) -> None:
        raise PackError(f'{where}: key "{key_path(parts)}": {message}; rebuild the package with this version of pack')

    files = manifest["files"]
    for path, entry in files.items():
        if path == "manifest.json":
            fail(["files", path], "the manifest does not list itself")
        if "stored" in entry and entry["stored"] not in entry["encodings"]:
            fail(["files", path, "stored"], f"{entry['stored']!r}, but 'encodings' has no such body")
    referenced: list[tuple[list[Any], str]] = [(["variants", name, "model"], v["model"]) for name, v in manifest["variants"].items()]
    referenced.append((["sample", "file"], manifest["sample"]["file"]))
    for key, bundle in manifest["runtime"]["bundles"].items():
        referenced += [(["runtime", "bundles", key, part], bundle[part]) for part in ("module", "wasm", "glue") if part in bundle]
    decoder = manifest["runtime"].get("decoder")
    if decoder:
        referenced += [(["runtime", "decoder", part], decoder[part]) for part in ("module", "wasm")]
    for name, variant in manifest["variants"].items():
        external = variant.get("externalData")
        if external is None:
            continue
        at = 0
        for index, chunk in enumerate(external["chunks"]):
            parts = ["variants", name, "externalData", "chunks", index]
            referenced.append((parts + ["file"], chunk["file"]))
            if chunk["offset"] < at:
                fail(parts + ["offset"], f"{chunk['offset']} overlaps the chunk before it (which ends at {at})")
            if chunk["size"] % chunk["coding"]["planes"]:
                fail(parts + ["coding", "planes"], f"{chunk['size']} bytes are not whole {chunk['coding']['planes']}-byte elements")
            if chunk["file"] in files and files[chunk["file"]]["size"] != chunk["size"]:
                fail(parts + ["size"], f"{chunk['size']}, but files[{chunk['file']!r}].size is {files[chunk['file']]['size']}")
            at = chunk["offset"] + chunk["size"]
        if at > external["size"]:
            fail(["variants", name, "externalData", "size"], f"{external['size']}, but the chunks end at {at}")
        widened = external.get("widened")
        if bool(widened) != bool(variant.get("widen")):
            fail(["variants", name, "externalData", "widened"], "present without 'widen'" if widened else "missing: a variant with 'widen' in chunks needs it")
        if widened:
            start = widened["offset"]
            if start % 4 or start > external["size"] or widened["size"] != start + 2 * (external["size"] - start):
                fail(["variants", name, "externalData", "widened"], f"offset {start}, size {widened['size']}: not a multiple of 4 within {external['size']} bytes, widened to offset + 2 × the rest")
            for index, chunk in enumerate(external["chunks"]):
                inside = chunk["offset"] >= start
                if inside and ((chunk["offset"] - start) % 2 or chunk["size"] % 2 or chunk["coding"]["planes"] > 2):
                    fail(["variants", name, "externalData", "chunks", index], "fp16 values to widen, but not whole fp16 values in 1 or 2 byte planes")
                if not inside and chunk["offset"] + chunk["size"] > start:
                    fail(["variants", name, "externalData", "chunks", index], f"spans externalData.widened.offset {start}")
    split = manifest.get("split") or {}
    for path, whole in split.items():
        if path in files:
            fail(["split", path], "is listed in 'files' too: a file is either whole or split")
        sizes = []
        for index, part in enumerate(whole["parts"]):
            if part not in files:
                fail(["split", path, "parts", index], f"{part!r} is not listed in 'files'")
            sizes.append(files[part]["size"])
        if sum(sizes) != whole["size"]:
            fail(["split", path, "size"], f"{whole['size']}, but its parts hold {sum(sizes)} bytes")
    for parts, path in referenced:
        if path not in files and path not in split:
            fail(parts, f"{path!r} is not listed in 'files'")
    for ep, names in manifest["variantFor"].items():
        for index, name in enumerate(names):
            if name not in manifest["variants"]:
                fail(["variantFor", ep, index], f"unknown variant {name!r}")
    for platform, chain in manifest["executionProviders"].items():
        if chain_bundle(chain) not in manifest["runtime"]["bundles"]:
            fail(["executionProviders", platform], f"needs the {chain_bundle(chain)!r} runtime bundle, which runtime.bundles lacks")
        for ep in chain:
            if not manifest["variantFor"].get(ep):
                fail(["executionProviders", platform], f"names EP {ep!r}, for which variantFor has no variants")
    input_names = {item["name"] for item in manifest["inputs"]}
    output_names = {item["name"] for item in manifest["outputs"]}
    for name, tensor in manifest["sample"]["tensors"].items():
        if name not in input_names:
            fail(["sample", "tensors", name], "not a model input")
        if "values" in tensor and len(tensor["values"]) != math.prod(tensor["dims"]):
            fail(["sample", "tensors", name, "values"], f"{len(tensor['values'])} values for dims {tensor['dims']}")
    for name in input_names - set(manifest["sample"]["tensors"]):
        fail(["sample", "tensors"], f"no sample for input {name!r}")
    for name in manifest["sample"]["outputs"]:
        if name not in output_names:
            fail(["sample", "outputs", name], "not a model output")


def _short(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def read_manifest(package_dir: Path) -> Manifest:
    """The validated manifest of the package folder `package_dir`."""
    path = Path(package_dir) / "manifest.json"
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        raise PackError(f"{path}: not found; point at a folder made by `pack build` (dist/<name>)") from None
    except OSError as error:
        raise PackError(f"{path}: cannot read ({error.strerror}); check its permissions") from None
    try:
        manifest = json.loads(text)
    except ValueError as error:
        raise PackError(f"{path}: not valid JSON ({error}); rebuild the package") from None
    # The schema's verdict on these bytes is remembered (content-addressed): a re-publish of an
    # unchanged package neither loads jsonschema nor walks the schema again.
    from pipeline.cache import cache_dir

    from pipeline.keys import stage_key

    sha = lambda value: hashlib.sha256(value.encode("utf-8")).hexdigest()  # noqa: E731
    verdict = stage_key("manifest-valid", inputs={"schema": sha(_schema_text()), "manifest": sha(text)}, libraries=("jsonschema",))
    try:
        memo = cache_dir("valid-manifests") / verdict
        known = memo.is_file()
    except (OSError, PackError):
        memo, known = None, False
    valid = validate(manifest, path, schema_checked=known)
    if memo is not None and not known:
        try:
            memo.touch()
        except OSError:
            pass
    return valid


def manifest_bytes(manifest: Manifest) -> bytes:
    """The bytes of manifest.json: indented, keys in builder order, one trailing newline. What
    `write_manifest` writes, and what the build's browser stage serves from memory."""
    return (json.dumps(manifest, indent=2) + "\n").encode("utf-8")


def write_manifest(package_dir: Path, manifest: Manifest) -> Path:
    """manifest.json (validated first), as `manifest_bytes`."""
    path = Path(package_dir) / "manifest.json"
    validate(manifest, path)
    path.write_bytes(manifest_bytes(manifest))
    return path


# --- verification runs and the refusal rule ---------------------------------------------------


def run_sort_key(run: Run) -> tuple[str, str, str, str, str]:
    return (run["stage"], run.get("engine", ""), run["bundle"], run["ep"], run["variant"])


def engine_runs(runs: list[Run], engine: str = BUILD_ENGINE) -> list[Run]:
    """The runs that speak for `engine` (the refusal rule per engine; `engineRuns` in the loader's
    policy.js): every run of no engine but a browser run of the build's engine (Chromium) that
    `engine` has a verdict of its own on (passed or failed) for the same (bundle, EP, variant);
    and `engine`'s own runs, except a not-verifiable or skipped one where Chromium has a run. An
    engine without evidence thus keeps what Chromium found; one that failed a pair refuses it
    there only, and one that passed a pair Chromium failed may use it."""
    triple = lambda run: (run["bundle"], run["ep"], run["variant"])  # noqa: E731
    own = [run for run in runs if run.get("engine") == engine and engine != BUILD_ENGINE]
    decided = {triple(run) for run in own if run["status"] in ("passed", "failed")}
    build = {triple(run) for run in runs if run["stage"] == "browser" and run.get("engine", BUILD_ENGINE) == BUILD_ENGINE}
    kept: list[Run] = []
    for run in runs:
        mine = run.get("engine", BUILD_ENGINE)
        if mine == BUILD_ENGINE:
            if not (run["stage"] == "browser" and triple(run) in decided):
                kept.append(run)
        elif mine == engine and (triple(run) in decided or triple(run) not in build):
            kept.append(run)
    return kept


def in_engine(manifest: Manifest, engine: str) -> Manifest:
    """`manifest` as `engine` reads it: an in-memory view (never written) whose refusal rule and
    package rule use `engine_runs(…, engine)`; `engine` is one of ENGINES."""
    return {**manifest, "verification": {**manifest["verification"], "engine": engine}}  # type: ignore[typeddict-unknown-key]


def _runs(manifest: Manifest) -> list[Run]:
    """The runs the rules read: the build engine's unless `manifest` is an `in_engine` view."""
    verification = manifest["verification"]
    return engine_runs(list(verification["runs"]), verification.get("engine", BUILD_ENGINE))  # type: ignore[arg-type]


def _matches(recorded: str, wanted: str) -> bool:
    return recorded == WILDCARD or wanted == WILDCARD or recorded == wanted


def refused(manifest: Manifest, bundle: str, ep: str, variant: str, adapter: dict | None = None) -> Run | None:
    """The refusal rule: the first run recorded `failed` that matches (bundle, ep, variant),
    a `*` in the run matching anything; with `adapter` (vendor, architecture, description) also
    a failed run of `verification.adapters` for the same adapter class. None when the triple may
    be used. Per engine: the runs of `_runs` (an `in_engine` view reads that engine's).
    (The loader's policy module implements the same rule in JS.)"""
    runs = _runs(manifest)
    if adapter is not None:
        for entry in manifest["verification"].get("adapters") or []:
            if same_adapter_class(entry["adapter"], adapter):
                runs += entry["runs"]
    for run in runs:
        if run["status"] == "failed" and _matches(run["bundle"], bundle) and _matches(run["ep"], ep) and _matches(run["variant"], variant):
            return run
    return None


def same_adapter_class(a: dict, b: dict) -> bool:
    """Vendor and architecture match (description when both lack an architecture), case-blind:
    `sameAdapterClass` in the loader's policy.js."""
    key = lambda adapter: [str(adapter.get(k) or "").strip().lower() for k in ("vendor", "architecture", "description")]  # noqa: E731
    (va, aa, da), (vb, ab, db) = key(a), key(b)
    if va != vb:
        return False
    return aa == ab if (aa or ab) else da == db


def usable_variants(manifest: Manifest, bundle: str, ep: str) -> list[str]:
    """The variants of `ep` in `bundle` that no run refuses and some run passed."""
    runs = _runs(manifest)
    return [
        v for v in manifest["variantFor"].get(ep, [])
        if refused(manifest, bundle, ep, v) is None
        and any(r["status"] == "passed" and _matches(r["bundle"], bundle) and _matches(r["ep"], ep) and r["variant"] == v for r in runs)
    ]


def _why_refused(manifest: Manifest, bundle: str, ep: str) -> str:
    """What stopped `ep` in `bundle`: its failed runs, else the first run that could not verify (a degenerate sample)."""
    here = [r for r in _runs(manifest) if _matches(r["bundle"], bundle) and _matches(r["ep"], ep)]
    return "; ".join(describe_run(r) for r in here if r["status"] == "failed") or next((describe_run(r) for r in here if r["status"] == "not-verifiable"), "")


def refused_eps(manifest: Manifest) -> list[RefusedEp]:
    """The EPs that a platform chain keeps no usable variant on, with the evidence (the failed runs)."""
    found: dict[str, RefusedEp] = {}
    for platform, chain in manifest["executionProviders"].items():
        bundle = chain_bundle(chain)
        for ep in chain:
            if not usable_variants(manifest, bundle, ep):
                entry = found.setdefault(ep, {"ep": ep, "platforms": [], "evidence": _why_refused(manifest, bundle, ep) or "no check passed on it"})
                entry["platforms"].append(platform)
    return [found[ep] for ep in sorted(found)]


def chains_without_refused_eps(manifest: Manifest) -> dict[str, list[str]]:
    """An EP refused is not a failed package: it leaves each platform chain whose other EPs keep a
    usable variant in the shorter chain's bundle (a bundle the package ships; the loader then
    loads the smaller one), and stays in chains that would be left with nothing (package_verdict
    fails those)."""
    chains = {}
    for platform, chain in manifest["executionProviders"].items():
        kept = [ep for ep in chain if usable_variants(manifest, chain_bundle(chain), ep)]
        shorter = chain_bundle(kept) if kept else None
        if kept and kept != list(chain) and shorter in manifest["runtime"]["bundles"] and all(usable_variants(manifest, shorter, ep) for ep in kept):
            chains[platform] = kept
        else:
            chains[platform] = list(chain)
    return chains


def package_verdict(manifest: Manifest) -> tuple[bool, list[str]]:
    """The package rule (build's exit code, `pack publish`): neither a refused variant nor a refused
    EP fails a package. Passes when every platform chain keeps a usable variant on at least one of
    its EPs (the loader falls back past a refused EP), and no variant or EP in
    `verification.require` is refused; and it holds read in each engine of
    `verification.requireEngines` (recipe `[verify] engines`; `required_engine_problems`), where
    a browser check ran at all. Returns (passed, the problems that fail it); an `in_engine` view
    judges with that engine's runs."""
    problems = _rule_problems(manifest)
    if manifest["verification"].get("browser"):  # under --no-browser no engine ran: the package says it was never browser-verified
        for engine in manifest["verification"].get("requireEngines", []):
            problems += required_engine_problems(manifest, engine)
    return not problems, problems


def _rule_problems(manifest: Manifest) -> list[str]:
    """The package rule's problems on `manifest`'s runs (an `in_engine` view: that engine's)."""
    runs = _runs(manifest)
    unverifiable = [run for run in runs if run["status"] == "not-verifiable"]
    if not any(run["status"] == "passed" for run in runs):
        failed = failed_runs(manifest)
        # the headline names the check that decided it, failed before not verifiable
        first = f": {describe_run((failed or unverifiable)[0])}" if failed or unverifiable else ""
        return [f"no check passed (every one failed, was skipped or was not verifiable){first}"]
    problems = []
    for platform, chain in manifest["executionProviders"].items():
        bundle = chain_bundle(chain)
        if not any(usable_variants(manifest, bundle, ep) for ep in chain):
            why = "; ".join(filter(None, (_why_refused(manifest, bundle, ep) for ep in chain)))
            problems.append(f"platform {platform}: no verified variant left on {' or '.join(chain)}" + (f" ({why})" if why else ""))
    refused_by_ep = {entry["ep"]: entry for entry in refused_eps(manifest)}
    for required in manifest["verification"].get("require", []):
        if required in refused_by_ep:
            entry = refused_by_ep[required]
            problems.append(f"EP {required} is required ([verify] require) but refused on {', '.join(entry['platforms'])}: {entry['evidence']}")
            continue
        for run in failed_runs(manifest):
            if _matches(run["variant"], required):
                problems.append(f"variant {required} is required ([verify] require) but refused: {describe_run(run)}")
                break
    return problems


def required_engine_problems(manifest: Manifest, engine: str) -> list[str]:
    """Why the package fails a recipe that requires `engine` (`[verify] engines`): the package rule
    read in that engine (`in_engine`: its own runs where it gave a verdict), headed by the engine;
    where it gave none (not installed, nothing it could run), not verifiable with its runs' reason
    (the install line). [] when it holds."""
    label = f"engine {engine} is required ([verify] engines)"
    own = [run for run in manifest["verification"]["runs"] if run.get("engine") == engine]
    if engine != BUILD_ENGINE and not any(run["status"] in ("passed", "failed") for run in own):
        why = next((run["detail"] for run in own if run.get("detail")), "no browser check ran in it")
        return [f"{label} but not verifiable: {why}"]
    return [f"{label}: {problem}" for problem in _rule_problems(in_engine(manifest, engine))]


def failed_runs(manifest: Manifest) -> list[Run]:
    return [run for run in _runs(manifest) if run["status"] == "failed"]


def describe_run(run: Run) -> str:
    """`host fp16 (any bundle, any EP): y: rel_l2 0.05 > 0.01`; `browser in firefox fp16 (…)` for another engine's run."""
    bundle = "any bundle" if run["bundle"] == WILDCARD else f"{run['bundle']} bundle"
    ep = "any EP" if run["ep"] == WILDCARD else run["ep"]
    stage = run["stage"] + (f" in {run['engine']}" if run.get("engine") else "")
    text = f"{stage} {run['variant']} ({bundle}, {ep}): {run['status']}"
    return text + (f": {run['detail']}" if run.get("detail") else "")


def runs_from_checks(checks: list[dict], stage: str, bundle_of: dict[tuple[str, str], str] | None = None) -> list[Run]:
    """One run per (bundle, EP, variant) of `stage`'s checks (report.json entries).

    Host checks judge the variant itself, so they are recorded for every bundle and EP (`*`):
    a variant that fails on the host is refused everywhere. A browser check of another engine than
    the build's (its `engine`: firefox, webkit) makes a run of its own, recorded with its engine. A run fails when any of its checks
    failed, is not-verifiable or skipped when one is (and none failed), and its detail is the
    first such check's output, figure and bound."""
    devices = {check.get("device") for check in checks if check["stage"] == stage and check.get("device")}
    if len(devices) > 1:
        return _merged_device_runs([runs_from_checks([c for c in checks if c.get("device") == d], stage, bundle_of) for d in sorted(devices)])
    grouped: dict[tuple[str, str, str, str], list[dict]] = {}
    for check in checks:
        if check["stage"] != stage or check["status"] == "error":  # an endpoint's error is no verdict
            continue
        engine = check.get("engine", BUILD_ENGINE) if stage == "browser" else BUILD_ENGINE
        if stage == "host":
            key = (engine, WILDCARD, WILDCARD, check["variant"])
        else:
            bundle = check.get("bundle") or (bundle_of or {}).get((check["ep"], check["variant"]), WILDCARD)
            key = (engine, bundle, check["ep"], check["variant"])
        grouped.setdefault(key, []).append(check)
    runs: list[Run] = []
    for (engine, bundle, ep, variant), group in grouped.items():
        status: Status = "passed"
        for candidate in ("failed", "not-verifiable", "skipped"):
            if any(c["status"] == candidate for c in group):
                status = candidate  # type: ignore[assignment]
                break
        run: Run = {"stage": stage, "bundle": bundle, "ep": ep, "variant": variant, "status": status}  # type: ignore[typeddict-item]
        if engine != BUILD_ENGINE:
            run["engine"] = engine
        if status != "passed":
            first = next(c for c in group if c["status"] == status)
            detail = first.get("detail") or status
            if first.get("output"):
                detail = f"{first['output']}" + (f" ({first['decision']} decision)" if first.get("decision") else "") + f": {detail}"
            run["detail"] = _short(detail, 500)
        runs.append(run)
    return sorted(runs, key=run_sort_key)


def _merged_device_runs(per_device: list[list[Run]]) -> list[Run]:
    """The runs of several devices as one: passed where any device passed it (the device that
    failed it refuses it on its adapter class only: `adapter_runs`), failed where every device
    that gave a verdict failed it, else the first device's status."""
    merged: dict[tuple[str, str, str, str], list[Run]] = {}
    for runs in per_device:
        for run in runs:
            merged.setdefault(run_sort_key(run), []).append(run)
    result: list[Run] = []
    for group in merged.values():
        passed = next((r for r in group if r["status"] == "passed"), None)
        verdicts = [r for r in group if r["status"] in ("passed", "failed")]
        if passed is not None:
            result.append(passed)
        elif verdicts:
            result.append(verdicts[0])
        else:
            result.append(group[0])
    return sorted(result, key=run_sort_key)


def adapter_runs(checks: list[dict]) -> list[AdapterRuns]:
    """`verification.adapters`: per adapter class of the browsers that verified the package (checks
    tagged by pipeline/verify/engines/browser/grid.py), the browser runs on it: what passed and what
    failed there. A run failed on any browser of the class is failed for the class."""
    classes: dict[str, tuple[dict, set, list[dict]]] = {}
    for check in checks:
        adapter = check.get("adapter")
        if check["stage"] != "browser" or not adapter or not check.get("device"):
            continue
        key = json.dumps([str(adapter.get(k) or "").lower() for k in ("vendor", "architecture", "description")] + [bool(adapter.get("fallback"))])
        entry = classes.setdefault(key, (dict(adapter), set(), []))
        entry[1].add(check["device"])
        entry[2].append({k: v for k, v in check.items() if k != "device"})
    result: list[AdapterRuns] = []
    for adapter, device_keys, group in classes.values():
        runs = runs_from_checks(group, "browser")
        if runs:
            browsers = sorted({_browser_of(key) for key in device_keys})
            result.append({"adapter": adapter, "browsers": browsers, "runs": runs})
    return sorted(result, key=lambda e: json.dumps(e["adapter"], sort_keys=True))


def _browser_of(device_key: str) -> str:
    """"Chromium 150.0.7871.100 on Linux" from a device key (browser|version|os|adapter...)."""
    parts = device_key.split("|")
    if len(parts) < 3:
        return device_key
    return " ".join(part for part in (parts[0], parts[1], f"on {parts[2]}" if parts[2] else "") if part)


def measurements_from(browser_report: dict | None) -> list[Measurement]:
    """Per-run times of the build's browser checks, for the loader to use as priors (each
    browser's, when the build verified on several: report.browser.endpoints)."""
    if not browser_report:
        return []
    if "endpoints" in browser_report:
        merged = [m for e in browser_report["endpoints"] for m in measurements_from(e.get("browser"))]
        return sorted(merged, key=lambda m: (m["bundle"], m["ep"], m["variant"], json.dumps(m["adapter"], sort_keys=True), m["steadyMs"] or 0))
    adapter = browser_report.get("adapter") or {}
    adapter_class = (
        {key: str(adapter.get(key) or "") for key in ("vendor", "architecture", "description")}
        if adapter.get("available") else None
    )
    chromium = browser_report.get("chromium")
    measurements: list[Measurement] = []
    for run in browser_report.get("runs") or []:
        timings = run.get("timings_ms") or {}
        if run.get("status") != "passed" or timings.get("first_run_ms") is None:
            continue
        measurements.append({
            "source": "build",
            "browser": f"Chromium/{chromium}" if chromium else "Chromium",
            "adapter": adapter_class if run["ep"] == "webgpu" else None,
            "bundle": run["bundle"],
            "ep": run["ep"],
            "variant": run["variant"],
            "createMs": timings.get("session_create_ms"),
            "firstMs": timings.get("first_run_ms"),
            "steadyMs": timings.get("steady_run_ms"),
        })
    return sorted(measurements, key=lambda m: (m["bundle"], m["ep"], m["variant"]))
