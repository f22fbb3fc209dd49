"""pack: turn ONNX models into verified, compressed, CDN-ready browser packages.

The sub-packages follow the pipeline: source → graph → precision → verify → assets → loader → publish.
"""

__version__ = "0.1.0"
