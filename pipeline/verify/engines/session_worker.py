"""Child process that runs one onnxruntime CPU session: `python -m pipeline.verify.engines.session_worker
MODEL FEEDS.npz OUT.npz LEVEL`. It exists so that an onnxruntime crash (a segfault at session
creation is real on some fp16 GRU models) kills this process, not the build."""

import sys

import numpy as np
import onnxruntime as ort

LEVELS = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def main(model_path: str, feeds_path: str, out_path: str, level: str) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.log_severity_level = 3
    options.intra_op_num_threads = 1  # deterministic, and the machine may be shared with a browser
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    with np.load(feeds_path) as feeds_file:
        feeds = {name: feeds_file[name] for name in feeds_file.files}
    names = [output.name for output in session.get_outputs()]
    outputs = session.run(names, feeds)
    np.savez(out_path, **{name: np.asarray(value) for name, value in zip(names, outputs)})


if __name__ == "__main__":
    try:
        main(*sys.argv[1:5])
    except Exception as error:  # reported to the parent as one line
        print(f"{type(error).__name__}: {error}".splitlines()[0][:2000], file=sys.stderr)
        sys.exit(3)
