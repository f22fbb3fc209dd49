"""A node-audit worker whose WebGPU sessions die of SIGSEGV when they hold the node `relu`, as a
crash in the WebGPU EP plugin, Dawn or the Vulkan driver on one kernel would kill it."""

import json
import os
import signal
import sys
from pathlib import Path

import onnx

from pipeline.verify.engines import node_audit_worker

if __name__ == "__main__":
    plan = json.loads(Path(sys.argv[1]).read_text())
    real_run = node_audit_worker.run_one

    def run_one(spec, device, ep_options, tmp):
        names = {node.name for node in onnx.load(spec["model"]).graph.node}
        if spec["ep"] == "webgpu" and any(name.endswith("_relu") for name in names):
            os.kill(os.getpid(), signal.SIGSEGV)
        return real_run(spec, device, ep_options, tmp)

    node_audit_worker.run_one = run_one
    node_audit_worker.main(*sys.argv[1:3])
