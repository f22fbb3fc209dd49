"""What runs a model and reports what it produced: onnxruntime on the host (`host.py`), onnxruntime's
WebGPU EP on lavapipe (`webgpu_kernels.py`), the same kernels node by node (`node_audit.py`), and a
real browser through the package's loader (`browser/`). No verdicts here: judgement/ decides."""
