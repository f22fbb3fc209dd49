"""Measure the newest ONNX IR version each onnxruntime-web release loads (the rows of
pipeline.runtime.MAX_IR_VERSIONS).

    .venv/bin/python scripts/measure_ir_versions.py 1.22.0 1.23.2 1.30.0

Installs each release into pack's runtime cache (npm), then creates a wasm session under Node on a
one-node model stamped IR 8..14 and prints one line per release: the newest IR version that loads,
and what the table says.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from onnx import parser

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.runtime import max_ir_version, resolve_runtime  # noqa: E402

IR_VERSIONS = range(8, 15)


def main(versions: list[str]) -> int:
    node = shutil.which("node")
    if node is None:
        print("error: node not found on PATH; install Node.js", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="pack-ir-") as scratch:
        models = []
        for ir in IR_VERSIONS:
            model = parser.parse_model('<ir_version: 8, opset_import: ["" : 17]>\ng (float[2] x) => (float[2] y) { y = Relu(x) }')
            model.ir_version = ir
            path = Path(scratch) / f"ir{ir}.onnx"
            path.write_bytes(model.SerializeToString())
            models.append(str(path))
        for version in versions:
            runtime = resolve_runtime(version)
            probe = subprocess.run([node, str(ROOT / "scripts" / "ir_probe.mjs"), str(runtime.root), *models], capture_output=True, text=True, timeout=300)
            if probe.returncode != 0:
                print(f"{version}: probe failed: {probe.stderr.strip().splitlines()[-1:]}")
                continue
            loads = json.loads(probe.stdout)["loads"]
            newest = max((int(ir) for ir, ok in loads.items() if ok), default=None)
            table, note = max_ir_version(version)
            print(f"onnxruntime-web {version}: loads up to IR {newest}; table says {table}" + (f" ({note})" if note else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1.30.0"]))
