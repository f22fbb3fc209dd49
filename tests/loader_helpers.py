"""Test packages and page helpers for the loader tests.

Packages are laid out by the browser helper's `write_package` (ARCHITECTURE.md layout, the real
onnxruntime-web bundles from the npm cache) and get their loader from `render_loader`, exactly as
`pack build` renders it. Two tiny models: an image model (y = 1 - 3x3 box blur of x, 3x64x64)
and an audio model (y = tanh(3x), 16000 samples), each in fp32 and fp16.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnxconverter_common import float16

from browser_helpers import IR_VERSION, Variant, write_package
from pipeline.loader.render import render_loader

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


def _fp16_of(model: onnx.ModelProto) -> onnx.ModelProto:
    converted = float16.convert_float_to_float16(model, keep_io_types=True)
    converted.ir_version = IR_VERSION
    return converted


def image_model() -> onnx.ModelProto:
    """y = 1 - box_blur3x3(x) per channel; input and output [1, 3, 64, 64] in [0, 1]."""
    kernel = np.full((3, 1, 3, 3), 1 / 9, dtype=np.float32)
    return _model(
        [
            helper.make_node("Conv", ["x", "kernel"], ["blurred"], group=3, pads=[1, 1, 1, 1], name="blur"),
            helper.make_node("Sub", ["one", "blurred"], ["y"], name="invert"),
        ],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, IMAGE_SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, IMAGE_SHAPE)],
        [numpy_helper.from_array(kernel, "kernel"), numpy_helper.from_array(np.array(1, np.float32), "one")],
    )


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


def make_package(root: Path, kind: str = "image", *, chains: dict | None = None, prewarm: bool = True) -> Path:
    """A rendered package (manifest, models, sample, runtime, loader files) for `kind` image|audio."""
    model, sample = (image_model(), image_sample()) if kind == "image" else (audio_model(), audio_sample())
    variants = {"fp16": Variant(_fp16_of(model), "fp16", ["shader-f16"]), "fp32": Variant(model, "fp32")}
    chains = chains or ALL_PLATFORMS
    write_package(
        root,
        variants,
        {"x": sample},
        name=f"loader-test-{kind}",
        chains=chains,
        variant_for={"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        kinds={"y": kind},
    )
    manifest = read_manifest(root)
    manifest["loader"].update(watchdogMs=60000, prewarm=prewarm)
    write_manifest(root, manifest)
    render_loader(root, manifest)
    return root


def read_manifest(package: Path) -> dict:
    return json.loads((package / "manifest.json").read_text())


def write_manifest(package: Path, manifest: dict) -> None:
    (package / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def blank_pages_dir(tmp: Path) -> Path:
    """A folder with blank.html, mounted at TEST_PREFIX."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "blank.html").write_text(BLANK_HTML)
    return tmp


def reference(kind: str, x: np.ndarray) -> np.ndarray:
    """The fp32 model on onnxruntime CPU."""
    import onnxruntime

    model = image_model() if kind == "image" else audio_model()
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
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
    const result = { ok: true, info: model.info, events, progress, warnings, crossOriginIsolated };
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
