"""Child process that runs one session on onnxruntime's WebGPU EP (the `onnxruntime-ep-webgpu`
plugin) on whatever Vulkan adapter the environment points at: `python -m
pipeline.verify.engines.webgpu_worker MODEL FEEDS.npz OUT.npz PLACEMENT.json [EP_OPTIONS_JSON]`. A crash in the plugin, Dawn
or the Vulkan driver kills this process, not the build.

The session is profiled once so that every node's execution provider is known: onnxruntime falls
back to its CPU EP for nodes the WebGPU EP has no kernel for, silently, and a model that ran
entirely on the CPU would prove nothing about the WebGPU kernels.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

WEBGPU_EP = "WebGpuExecutionProvider"
# Nodes onnxruntime inserts itself: copies between devices, and casts around CPU kernels that lack fp16.
INSERTED = ("Memcpy", "InsertedPrecisionFreeCast")


def webgpu_device() -> "ort.OrtEpDevice":
    import onnxruntime_ep_webgpu

    ort.register_execution_provider_library("webgpu", onnxruntime_ep_webgpu.get_library_path())
    for device in ort.get_ep_devices():
        if device.ep_name == WEBGPU_EP:
            return device
    raise RuntimeError("onnxruntime offers no WebGPU device (is ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 set?)")


def placement(profile_path: str) -> dict:
    """Names of the nodes that ran on each EP, from the profile of one run."""
    events = json.loads(Path(profile_path).read_text())
    webgpu, cpu = [], []
    for event in events:
        name = event.get("name", "")
        if event.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        node = name.removesuffix("_kernel_time")
        args = event.get("args", {})
        if node.startswith(INSERTED) or args.get("op_name", "").startswith("Memcpy"):
            continue
        label = f"{node} ({args.get('op_name', '?')})"
        (webgpu if args.get("provider") == WEBGPU_EP else cpu).append(label)
    return {"webgpu_nodes": sorted(set(webgpu)), "cpu_fallback_nodes": sorted(set(cpu))}


def main(model_path: str, feeds_path: str, out_path: str, placement_path: str, ep_options: str = "{}") -> None:
    device = webgpu_device()
    with tempfile.TemporaryDirectory(prefix="pack-webgpu-profile-") as tmp:
        options = ort.SessionOptions()
        options.log_severity_level = 3
        options.intra_op_num_threads = 1  # for the CPU fallback nodes: the machine may be shared
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / "profile")
        options.add_provider_for_devices([device], {key: str(value) for key, value in json.loads(ep_options).items()})
        start = time.perf_counter()
        session = ort.InferenceSession(model_path, sess_options=options)
        created = time.perf_counter()
        with np.load(feeds_path) as feeds_file:
            feeds = {name: feeds_file[name] for name in feeds_file.files}
        names = [output.name for output in session.get_outputs()]
        outputs = session.run(names, feeds)
        ran = time.perf_counter()
        facts = placement(session.end_profiling())
    facts.update(session_create_ms=round((created - start) * 1000, 1), first_run_ms=round((ran - created) * 1000, 1))
    np.savez(out_path, **{name: np.asarray(value) for name, value in zip(names, outputs)})
    Path(placement_path).write_text(json.dumps(facts))


if __name__ == "__main__":
    try:
        main(*sys.argv[1:6])
    except Exception as error:  # reported to the parent as one line
        print(f"{type(error).__name__}: {error}".splitlines()[0][:2000], file=sys.stderr)
        sys.exit(3)
