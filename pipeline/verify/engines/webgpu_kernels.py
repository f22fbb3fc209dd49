"""onnxruntime's WebGPU kernels outside the browser, on Mesa's lavapipe Vulkan driver.

The `onnxruntime-ep-webgpu` plugin is onnxruntime's native WebGPU EP: the same C++ kernels the
`onnxruntime-web/webgpu` bundle compiles to wasm, on Dawn. On lavapipe (Mesa 25, which exposes
shader-f16) its outputs are bit-identical to the browser bundle's on the same adapter, and they show
what CPU-EP checks cannot: WebGPU kernels accumulate fp16 in fp16. scripts/setup.sh extracts Mesa
into `.cache/mesa25/` beside the project (`$PACK_LAVAPIPE_DIR` overrides) and installs the plugin
(pyproject extra `webgpu`); the system's Mesa is not used.

Runs happen in a child process (pipeline.verify.engines.webgpu_worker) with the Vulkan loader pointed at
lavapipe, Mesa's shader cache kept under `$PACK_CACHE_DIR` (the first run of a model spends seconds
compiling shaders), and results cached like host runs.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.cache import atomic_output, cache_dir, cached_entry, temporary_folder
from pipeline.errors import raise_child_environment_error
from pipeline.verify.engines.host import HostRun, _signal_name
from pipeline.verify.engines.host import run_key

WORKER_MODULE = "pipeline.verify.engines.webgpu_worker"  # run as `python -m`; tests swap in a crashing one
# lavapipe's maxStorageBufferBindingSize: a tensor larger than this cannot be bound in a shader.
MAX_BUFFER_BYTES = 128 << 20
# lavapipe runs Conv/MatMul at ~1.5 GMAC/s on one idle core (docs/kernels.md: 10×Conv 64ch at 32²,
# 0.38 GMAC, in 254 ms): above this much work per run a model is too heavy to check there.
DEFAULT_MAX_GMAC = 20.0
DEFAULT_TIMEOUT_S = 300
TIMED_OUT = "onnxruntime's WebGPU EP did not finish within"  # a whole run too slow: the stage audits nodes instead


def max_gmac() -> float:
    return float(os.environ.get("PACK_WEBGPU_KERNELS_MAX_GMAC") or DEFAULT_MAX_GMAC)


def run_timeout_s() -> float:
    return float(os.environ.get("PACK_WEBGPU_KERNELS_TIMEOUT_S") or DEFAULT_TIMEOUT_S)
STAGE = "webgpu-kernels"
DESCRIPTION = "onnxruntime WebGPU kernels outside the browser, on lavapipe"


@dataclass
class WebGpuRun(HostRun):
    """A HostRun with what the WebGPU EP did: which nodes it ran, which fell back to the CPU EP.
    `not_verifiable` says why the model cannot be checked there (outputs and error are then None
    and that reason): a tensor over lavapipe's buffer limit, or no node on the WebGPU EP."""

    webgpu_nodes: int = 0
    cpu_fallback_nodes: list[str] = field(default_factory=list)
    not_verifiable: str | None = None
    timings_ms: dict[str, float] = field(default_factory=dict)


def lavapipe_dir() -> Path:
    configured = os.environ.get("PACK_LAVAPIPE_DIR")
    return Path(configured) if configured else Path(__file__).resolve().parents[3] / ".cache" / "mesa25"


def mesa_version() -> str | None:
    ready = lavapipe_dir() / "ready"
    return ready.read_text().strip() if ready.is_file() else None


def adapter_name() -> str:
    return f"Mesa {mesa_version() or '?'}"


def _icd_library() -> Path | None:
    try:
        return Path(json.loads((lavapipe_dir() / "lvp_icd.json").read_text())["ICD"]["library_path"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def worker_env() -> dict[str, str]:
    """The child's environment: the Vulkan loader sees lavapipe only, the plugin accepts a
    software adapter, and Mesa's shader cache persists between runs: in the pack cache, unless
    `MESA_SHADER_CACHE_DIR` names one (compiled shaders change no result; a cache shared by clean
    clones or private pack caches saves each one compiling them again: docs/kernels.md)."""
    icd = str(lavapipe_dir() / "lvp_icd.json")
    library = _icd_library()
    env = dict(os.environ)
    libs = [str(library.parent)] if library else []
    if env.get("LD_LIBRARY_PATH"):
        libs.append(env["LD_LIBRARY_PATH"])
    env.update(
        ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER="1",
        VK_ICD_FILENAMES=icd,
        VK_DRIVER_FILES=icd,
        LD_LIBRARY_PATH=os.pathsep.join(libs),
        MESA_SHADER_CACHE_DIR=env.get("MESA_SHADER_CACHE_DIR") or str(cache_dir("mesa-shader-cache")),
    )
    env.pop("MESA_SHADER_CACHE_DISABLE", None)
    return env


def _setup_reason() -> str | None:
    if importlib.util.find_spec("onnxruntime_ep_webgpu") is None:
        return "the onnxruntime-ep-webgpu plugin is not installed (pip install 'pack[webgpu]', or run scripts/setup.sh)"
    folder = lavapipe_dir()
    recorded = folder / "unavailable"
    if recorded.is_file():
        return f"set-up could not install it: {recorded.read_text().strip()} (re-run scripts/setup.sh)"
    library = _icd_library()
    if library is None or mesa_version() is None:
        return f"Mesa's lavapipe is not set up in {folder} (run scripts/setup.sh)"
    if not library.is_file():
        return f"{library} is missing (re-run scripts/setup.sh)"
    return None


@functools.cache
def _probe() -> str | None:
    """Run a one-node model on the WebGPU EP; the reason it cannot, or None."""
    import onnx  # lazily: commands that never verify do not load it

    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Add", ["x", "x"], ["y"], name="probe_add")], "probe",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)])
    model.ir_version = 8
    with temporary_folder("pack-webgpu-probe-") as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(model, path)
        x = np.arange(4, dtype=np.float32)
        run = _run_uncached(path, {"x": x})
    if run.outputs is None:
        return f"onnxruntime's WebGPU EP does not run on lavapipe: {run.error}"
    if run.webgpu_nodes == 0:
        return "onnxruntime placed a one-node probe model on the CPU, not on the WebGPU EP"
    if not np.array_equal(run.outputs["y"], x + x):
        return "a one-node probe model gives wrong results on the WebGPU EP"
    return None


def unavailable_reason() -> str | None:
    """Why the webgpu-kernels stage cannot run here, or None when it can (probed once per process).
    `PACK_WEBGPU_KERNELS=off` turns the stage off."""
    switch = os.environ.get("PACK_WEBGPU_KERNELS", "").strip().lower()
    if switch in ("0", "off", "false", "no"):
        return f"turned off by PACK_WEBGPU_KERNELS={switch}"
    return _setup_reason() or _probe()


def oversized_tensor(model_path: Path, feeds: dict[str, np.ndarray]) -> tuple[str, int] | None:
    """(name, bytes) of the largest tensor over lavapipe's buffer limit: an initializer, an input,
    or an intermediate value whose shape inference gives with the feeds' shapes; None if none."""
    sizes, _ = _sizes_and_work(model_path, feeds)
    name, size = max(sizes.items(), key=lambda item: item[1], default=("", 0))
    return (name, size) if size > MAX_BUFFER_BYTES else None


def estimated_macs(model_path: Path, feeds: dict[str, np.ndarray]) -> int:
    """Multiply-accumulates of the model's Conv, ConvTranspose, MatMul and Gemm nodes at the feeds'
    shapes (those whose shapes inference knows): what a software rasterizer spends its time on."""
    return _sizes_and_work(model_path, feeds)[1]


@functools.lru_cache(maxsize=8)
def _cached_sizes_and_work(model_path: str, mtime: float, shapes: tuple) -> tuple[dict[str, int], int]:
    return _compute_sizes_and_work(Path(model_path), dict(shapes))


def _sizes_and_work(model_path: Path, feeds: dict[str, np.ndarray]) -> tuple[dict[str, int], int]:
    shapes = tuple(sorted((name, (str(array.dtype), tuple(array.shape))) for name, array in feeds.items()))
    return _cached_sizes_and_work(str(model_path), Path(model_path).stat().st_mtime, shapes)


def _compute_sizes_and_work(model_path: Path, feed_shapes: dict[str, tuple[str, tuple]]) -> tuple[dict[str, int], int]:
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    sizes: dict[str, int] = {name: np.dtype(dtype).itemsize * math.prod(shape) for name, (dtype, shape) in feed_shapes.items()}
    feeds = {name: np.empty(0, dtype) for name, (dtype, _) in feed_shapes.items()}
    sizes: dict[str, int] = {name: array.nbytes for name, array in feeds.items()}

    def nbytes(elem_type: int, dims: list[int]) -> int | None:
        try:
            item = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
        except (KeyError, TypeError, ValueError):
            return None
        return item * math.prod(dims)

    for tensor in model.graph.initializer:
        size = nbytes(tensor.data_type, list(tensor.dims))
        if size is not None:
            sizes[tensor.name] = size
    for value in model.graph.input:
        if value.name in feeds:  # concrete shapes, so inference can size what follows
            shape = value.type.tensor_type.shape
            shape.ClearField("dim")
            for n in feed_shapes[value.name][1]:
                shape.dim.add().dim_value = n
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort; the initializers are still checked
        inferred = model
    known: dict[str, list[int]] = {name: list(shape) for name, (_, shape) in feed_shapes.items()}
    known.update({t.name: list(t.dims) for t in model.graph.initializer})
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        tensor_type = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        if tensor_type.HasField("shape") and None not in dims:
            known[value.name] = dims
            size = nbytes(tensor_type.elem_type, dims)
            if size is not None:
                sizes[value.name] = max(size, sizes.get(value.name, 0))
    macs = 0
    for node in inferred.graph.node:
        if len(node.input) < 2 or not node.output:
            continue
        macs += node_macs(node.op_type, *(known.get(name) for name in (node.input[0], node.input[1], node.output[0])))
    return sizes, macs


def node_macs(op: str, a: list[int] | None, b: list[int] | None, out: list[int] | None) -> int:
    """Multiply-accumulates of one Conv, ConvTranspose, MatMul or Gemm node with first input shape
    `a`, second `b` and output `out` (0 for other ops or unknown shapes)."""
    if a is None or b is None or out is None:
        return 0
    if op == "Conv" and len(b) >= 2:
        return math.prod(out) * math.prod(b[1:])
    if op == "ConvTranspose" and len(b) >= 2:
        return math.prod(a) * math.prod(b[1:])
    if op in ("MatMul", "Gemm") and a:
        return math.prod(out) * a[-1]
    return 0


def whole_run_limit(model_path: Path, feeds: dict[str, np.ndarray]) -> str | None:
    """Why `model_path` cannot run whole on lavapipe at the feeds' shapes (a tensor over its
    storage-buffer limit, or more work than it does in reasonable time), or None. The stage audits
    such a model node by node instead (pipeline.verify.engines.node_audit)."""
    too_big = oversized_tensor(model_path, feeds)
    if too_big:
        name, size = too_big
        return f"tensor '{name}' is {size / (1 << 20):.1f} MiB, over lavapipe's {MAX_BUFFER_BYTES >> 20} MiB storage-buffer limit: not verifiable there"
    work = estimated_macs(model_path, feeds) / 1e9
    if work > max_gmac():
        return f"about {work:.1f} GMAC per run, over the {max_gmac():g} GMAC lavapipe (a CPU rasterizer) checks in reasonable time: not verifiable there (PACK_WEBGPU_KERNELS_MAX_GMAC raises it; `pack verify --gpu` checks it on a GPU)"
    return None


def _run_key(model_path: Path, feeds: dict[str, np.ndarray], ep_options: dict) -> str:
    return run_key("webgpu-run", model_path, feeds, {"ep_options": ep_options, "mesa": mesa_version()},
                   ("pipeline.verify.engines.webgpu_kernels", "pipeline.verify.engines.webgpu_worker"), ("onnxruntime", "onnxruntime-ep-webgpu", "numpy"))


def run_on_webgpu(model_path: Path, feeds: dict[str, np.ndarray], ep_options: dict | None = None) -> WebGpuRun:
    """Outputs of `model_path` on `feeds` from onnxruntime's WebGPU EP on lavapipe, in a child
    process; `ep_options` are the EP's session options as in the manifest's `epOptions.webgpu`
    (e.g. `{"preferredLayout": "NCHW"}`). A crash is a failed run naming the signal; a model with a tensor over lavapipe's
    128 MiB buffer limit is not run (`not_verifiable` names the tensor); a session that placed no
    node on the WebGPU EP is not a WebGPU result (`not_verifiable` says so). Successful runs are
    cached by model bytes, inputs, and the onnxruntime, plugin and Mesa versions."""
    model_path = Path(model_path)
    reason = unavailable_reason()
    if reason:
        return WebGpuRun(None, f"webgpu-kernels not available: {reason}", not_verifiable=f"not available: {reason}")
    why = whole_run_limit(model_path, feeds)
    if why:
        return WebGpuRun(None, why, not_verifiable=why)
    ep_options = dict(ep_options or {})
    cached = cache_dir("webgpu-runs") / f"{_run_key(model_path, feeds, ep_options)}.npz"
    if cached_entry(cached):
        with np.load(cached, allow_pickle=False) as result:
            facts = json.loads(str(result["__facts__"]))
            outputs = {n: result[n] for n in result.files if not n.startswith("__")}
        return _with_facts(WebGpuRun(outputs, None, "all"), facts)
    run = _run_uncached(model_path, feeds, ep_options)
    if run.outputs is not None and run.webgpu_nodes == 0:
        why = f"no node ran on the WebGPU EP (all {len(run.cpu_fallback_nodes)} fell back to onnxruntime's CPU EP): not a WebGPU result"
        return WebGpuRun(None, why, run.level, webgpu_nodes=0, cpu_fallback_nodes=run.cpu_fallback_nodes, not_verifiable=why)
    if run.outputs is not None:
        facts = {"webgpu_nodes": run.webgpu_nodes, "cpu_fallback_nodes": run.cpu_fallback_nodes, "timings_ms": run.timings_ms}
        with atomic_output(cached, entry=True) as handle:
            np.savez(handle, __facts__=np.array(json.dumps(facts)), **run.outputs)
    return run


def _with_facts(run: WebGpuRun, facts: dict) -> WebGpuRun:
    run.webgpu_nodes = facts["webgpu_nodes"]
    run.cpu_fallback_nodes = list(facts["cpu_fallback_nodes"])
    run.timings_ms = dict(facts.get("timings_ms", {}))
    return run


def _run_uncached(model_path: Path, feeds: dict[str, np.ndarray], ep_options: dict | None = None) -> WebGpuRun:
    with temporary_folder("pack-webgpu-") as tmp:
        feeds_path, out_path, facts_path = (Path(tmp) / name for name in ("feeds.npz", "out.npz", "placement.json"))
        np.savez(feeds_path, **feeds)
        command = [sys.executable, "-m", WORKER_MODULE, str(model_path), str(feeds_path), str(out_path), str(facts_path), json.dumps(ep_options or {})]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=run_timeout_s(), env=worker_env())
        except subprocess.TimeoutExpired:
            why = f"{TIMED_OUT} {run_timeout_s():g} s on lavapipe: not verifiable there (PACK_WEBGPU_KERNELS_TIMEOUT_S raises the limit)"
            return WebGpuRun(None, why, "all", not_verifiable=why)
        if done.returncode < 0:
            signal = _signal_name(done.returncode)
            return WebGpuRun(None, f"onnxruntime's WebGPU EP crashed the worker ({signal})", "all", [f"all: {signal}"])
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise_child_environment_error(lines[-1] if lines else "", Path(tmp))
            return WebGpuRun(None, lines[-1] if lines else f"exit code {done.returncode}", "all")
        facts = json.loads(facts_path.read_text())
        with np.load(out_path) as result:
            outputs = {name: result[name] for name in result.files}
    run = WebGpuRun(outputs, None, "all", webgpu_nodes=len(facts["webgpu_nodes"]), cpu_fallback_nodes=facts["cpu_fallback_nodes"])
    run.timings_ms = {key: facts[key] for key in ("session_create_ms", "first_run_ms")}
    return run
