"""Test packages and page helpers for the loader tests.

Packages are laid out by the browser helper's `write_package` (ARCHITECTURE.md layout, the real
onnxruntime-web bundles from the npm cache) and get their loader from `render_loader`, exactly as
`pack build` renders it. `make_package` adds what schema 2 of manifest.json gives the loader: the
fp32 reference outputs after the inputs in the sample file (`sample.outputs`), the bounds per
(ep, variant) (`thresholds`), `measurements` and `loader.select`. Two tiny models: an image model
(y = 1 - 3x3 box blur of x, 3x64x64) and an audio model (y = tanh(3x), 16000 samples), each in
fp32 and fp16.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

from browser_helpers import IR_VERSION, Variant, write_package
from pipeline.manifest import write_manifest as validated_write
from pipeline.web.render import render_loader
from pipeline.verify.judgement.thresholds import threshold_for

ALL_PLATFORMS = {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"], "android": ["webgpu", "wasm"]}
IMAGE_SHAPE = [1, 3, 64, 64]
AUDIO_SHAPE = [1, 16000]
# A blank same-origin page to import loader.js from (mounted beside the package).
TEST_PREFIX = "/__loader_test__/"
BLANK_HTML = "<!doctype html><html><head><meta charset='utf-8'><title>loader test</title></head><body></body></html>\n"


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    onnx.checker.check_model(model, full_check=True)
    return model


def fp16_of(model: onnx.ModelProto) -> onnx.ModelProto:
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    converted.ir_version = IR_VERSION
    return converted


def image_model(weight: float = 1 / 9) -> onnx.ModelProto:
    """y = 1 - box_blur3x3(x) per channel; input and output [1, 3, 64, 64] in [0, 1]. Another
    `weight` makes a wrong model (a corrupted variant)."""
    kernel = np.full((3, 1, 3, 3), weight, dtype=np.float32)
    return _model(
        [
            helper.make_node("Conv", ["x", "kernel"], ["blurred"], group=3, pads=[1, 1, 1, 1], name="blur"),
            helper.make_node("Sub", ["one", "blurred"], ["y"], name="invert"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, IMAGE_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, IMAGE_SHAPE)],
        [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(np.array(1, np.float32), "one")],
    )


def conv_stack_model() -> onnx.ModelProto:
    """Conv 3->32 3x3, Relu, Conv 32->3 3x3 on [1, 3, 64, 64]: ~14 MFLOP, enough for SwiftShader's
    WebGPU (~0.2 GFLOP/s) to be clearly slower than wasm, small enough for a test."""
    rng = np.random.default_rng(1)
    w1 = (rng.standard_normal((32, 3, 3, 3)) / 5).astype(np.float32)
    w2 = (rng.standard_normal((3, 32, 3, 3)) / 17).astype(np.float32)
    return _model(
        [
            helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1], name="widen"),
            helper.make_node("Relu", ["h"], ["r"], name="relu"),
            helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1], name="narrow"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, IMAGE_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, IMAGE_SHAPE)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )


def model_for(kind: str) -> onnx.ModelProto:
    return {"image": image_model, "audio": audio_model, "conv": conv_stack_model}[kind]()


def audio_model() -> onnx.ModelProto:
    """y = tanh(3 x): a soft clipper on [1, 16000] samples."""
    return _model(
        [helper.make_node("Mul", ["x", "gain"], ["g"], name="gain"), helper.make_node("Tanh", ["g"], ["y"], name="clip")],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, AUDIO_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, AUDIO_SHAPE)],
        [numpy_helper.from_array(np.array(3, np.float32), "gain")],
    )


def image_sample() -> np.ndarray:
    """A colour gradient with a bright disc: easy to recognise inverted and blurred."""
    ys, xs = np.mgrid[0:64, 0:64].astype(np.float32) / 63
    disc = ((xs - 0.6) ** 2 + (ys - 0.4) ** 2 < 0.06).astype(np.float32)
    image = np.stack([xs, ys, np.clip(1 - xs + disc, 0, 1)])
    image[:, disc > 0] = np.maximum(image[:, disc > 0], 0.95)
    return image[None].astype(np.float32)


def audio_sample() -> np.ndarray:
    """One second of a 220 -> 880 Hz chirp with a fade in, 16 kHz."""
    t = np.arange(16000, dtype=np.float64) / 16000
    chirp = np.sin(2 * np.pi * (220 * t + 330 * t**2)) * np.minimum(1, t * 4) * 0.8
    return chirp[None].astype(np.float32)


def make_package(
    root: Path,
    kind: str = "image",
    *,
    chains: dict | None = None,
    prewarm: bool = True,
    select: str = "chain",
    variant_for: dict | None = None,
    fp16_model: onnx.ModelProto | None = None,
    reference_outputs: bool = True,
    fp16w: bool = False,
) -> Path:
    """A rendered package (manifest, models, sample with reference outputs, runtime, loader files)
    for `kind` image|audio|conv (the conv stack on the image sample, a plain tensor output).
    `fp16_model` replaces the fp16 variant (e.g. a corrupted one)."""
    model, sample = model_for(kind), audio_sample() if kind == "audio" else image_sample()
    variants = {"fp16": Variant(fp16_model or fp16_of(model), "fp16", ["shader-f16"]), "fp32": Variant(model, "fp32")}
    if fp16w:  # the fp32 graph, weights stored as fp16 (pipeline/precision/fp16w.py)
        from pipeline.precision.fp16w import WIDEN, narrow_initializers

        variants = {"fp16": variants["fp16"], "fp16w": Variant(narrow_initializers(model).model, "fp16w", widen=WIDEN), "fp32": variants["fp32"]}
    chains = chains or ALL_PLATFORMS
    write_package(
        root,
        variants,
        {"x": sample},
        name=f"loader-test-{kind}",
        chains=chains,
        variant_for=variant_for or {"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        kinds={"y": "tensor" if kind == "conv" else kind},
    )
    manifest = read_manifest(root)
    manifest["loader"] = {"watchdogMs": 60000, "prewarm": prewarm, "select": select}
    if reference_outputs:
        _append_reference_outputs(root, manifest, {"y": reference(kind, sample)})
    manifest["thresholds"] = {
        ep: {name: {o["name"]: threshold_for(o["kind"], spec["precision"], ep) for o in manifest["outputs"]} for name, spec in manifest["variants"].items()}
        for ep in ("cpu", "wasm", "webgpu")
    }
    manifest["measurements"] = []
    manifest["verification"] = {"browser": False, "passed": True, "runs": []}
    render_loader(root, manifest)  # the same files (they depend on names only), kept listed in "files"
    validated_write(root, manifest)
    return root


def _append_reference_outputs(root: Path, manifest: dict, outputs: dict[str, np.ndarray]) -> None:
    """The sample file gets the reference outputs after its inputs (a new content-hashed name)."""
    old = manifest["sample"]["file"]
    data = (root / old).read_bytes()
    described = {}
    for name, array in outputs.items():
        raw = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        described[name] = {"dtype": array.dtype.name, "dims": list(array.shape), "offset": len(data), "length": len(raw)}
        data += raw
    digest = hashlib.sha256(data).hexdigest()
    new = f"sample.{digest[:16]}.bin"
    (root / new).write_bytes(data)
    for stale in (root / old, root / f"{old}.br"):
        stale.unlink(missing_ok=True)
    entry = manifest["files"].pop(old)
    manifest["files"][new] = {**entry, "sha256": digest, "size": len(data), "encodings": {},
                              "integrity": "sha256-" + base64.b64encode(bytes.fromhex(digest)).decode()}
    manifest["sample"] = {**manifest["sample"], "file": new, "outputs": described}


def read_manifest(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def write_manifest(package: Path, manifest: dict) -> None:
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium per test module (import this fixture into the module)."""
    from pipeline.verify.engines.browser.chromium import launch_browser

    with launch_browser() as launched:
        yield launched


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Path:
    """The blank page folder, mounted at TEST_PREFIX (import this fixture into the module)."""
    return blank_pages_dir(tmp_path_factory.mktemp("pages"))


def blank_pages_dir(tmp: Path) -> Path:
    """A folder with blank.html, mounted at TEST_PREFIX."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "blank.html").write_text(BLANK_HTML)
    return tmp


def reference(kind: str, x: np.ndarray) -> np.ndarray:
    """The fp32 model on onnxruntime CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(model_for(kind).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def decode_output(encoded: dict) -> np.ndarray:
    """An output returned by LOAD_AND_RUN as {type, dims, bytes (base64)} → numpy."""
    dtype = {"float32": np.float32, "float16": np.float16}[encoded["type"]]
    return np.frombuffer(base64.b64decode(encoded["bytes"]), dtype=dtype).reshape(encoded["dims"])


# Loads the package at `base` with `options`, runs the sample (unless run is false) and returns
# what the tests look at; errors come back as {ok: false, name, message, fallbacks}.
LOAD_AND_RUN = r"""
async ({ base, options, run }) => {
  const { load } = await import(base + 'loader.js');
  const events = [];
  const progress = [];
  const warnings = [];
  const warn = console.warn;
  console.warn = (...args) => { warnings.push(args.map(String).join(' ')); warn.apply(console, args); };
  const toBase64 = (view) => {
    const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    let binary = '';
    for (let i = 0; i < bytes.length; i += 0x8000) binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
    return btoa(binary);
  };
  try {
    const model = await load({ ...options, baseUrl: base,
      onEvent: (e) => events.push(JSON.parse(JSON.stringify(e))), onProgress: (p) => progress.push(p) });
    // The first result never waits on trials; they run after load() in the background. The tests
    // look at the load as it was (firstInfo) and after the trials (info).
    const firstInfo = model.info;
    await model.measured;
    const result = { ok: true, firstInfo, info: model.info, events, progress, warnings, crossOriginIsolated };
    if (run) {
      const outputs = await model.run(await model.sampleFeeds());
      result.outputs = Object.fromEntries(Object.entries(outputs).map(([name, t]) =>
        [name, { type: t.type, dims: Array.from(t.dims), bytes: toBase64(t.data) }]));
      result.infoAfterRun = model.info;
    }
    window.__packModel = model;
    return result;
  } catch (error) {
    return { ok: false, name: error && error.name, message: String(error && error.message || error),
             fallbacks: error && error.fallbacks, events, progress, warnings };
  } finally {
    console.warn = warn;
  }
}
"""
