"""Child process of the node audit: `python -m pipeline.verify.engines.node_audit_worker JOBS.json DONE.txt`.

JOBS.json lists sessions to run in order ({id, model, feeds, out, ep: cpu|webgpu}) and the WebGPU EP
options. After each session it appends `ID STATUS` to DONE.txt (STATUS: a JSON object naming the
nodes that ran on the CPU EP, or `error MESSAGE`), so that when a session crashes this process the
parent knows which one did and restarts after it.
"""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

from pipeline.verify.engines.webgpu_worker import placement, webgpu_device


def run_one(spec: dict, device, ep_options: dict, tmp: str) -> dict:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    if spec["ep"] == "webgpu":
        options.enable_profiling = True
        options.profile_file_prefix = str(Path(tmp) / f"profile{spec['id']}")
        options.add_provider_for_devices([device], {key: str(value) for key, value in ep_options.items()})
        session = ort.InferenceSession(spec["model"], sess_options=options)
    else:
        session = ort.InferenceSession(spec["model"], options, providers=["CPUExecutionProvider"])
    with np.load(spec["feeds"]) as feeds_file:
        feeds = {name: feeds_file[name] for name in feeds_file.files}
    names = [output.name for output in session.get_outputs()]
    outputs = session.run(names, feeds)
    np.savez(spec["out"], **{name: np.asarray(value) for name, value in zip(names, outputs)})
    if spec["ep"] != "webgpu":
        return {}
    facts = placement(session.end_profiling())
    return {"cpu_nodes": [label.rsplit(" (", 1)[0] for label in facts["cpu_fallback_nodes"]]}


def main(jobs_path: str, done_path: str) -> None:
    plan = json.loads(Path(jobs_path).read_text())
    device = webgpu_device() if any(spec["ep"] == "webgpu" for spec in plan["jobs"]) else None
    # in the caller's folder, which it removes: a worker that crashes (the caller retries the
    # group node by node) leaves nothing behind in the system's temporary folder
    with tempfile.TemporaryDirectory(prefix="profile-", dir=Path(done_path).parent) as tmp, open(done_path, "a") as done:
        for spec in plan["jobs"]:
            try:
                status = json.dumps(run_one(spec, device, plan["ep_options"], tmp))
            except Exception as error:  # one session's error is that session's verdict
                status = "error " + f"{type(error).__name__}: {error}".splitlines()[0][:1000]
            done.write(f"{spec['id']} {status}\n")
            done.flush()


if __name__ == "__main__":
    main(*sys.argv[1:3])
