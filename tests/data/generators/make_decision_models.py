"""Export three tiny models an app decides from, with both torch.onnx exporters
(tests/data/decision_exports/<name>.<exporter>.onnx): what pipeline/graph/output_kinds.py must read
from real exporter graphs, and what the decision checks judge.

- crnn: a CRNN text recognizer (conv, BiGRU, linear) whose `log_probs` are LogSoftmax over the
  classes, permuted to torch's CTC layout [T, N, C]; blank 0;
- yolo: a YOLOv8-style head, `output0` [1, 4 + C, N]: boxes (cx, cy, w, h) in pixels of a 64²
  input beside sigmoid class scores, concatenated on axis 1;
- seg: a segmentation net whose `probs` are a Softmax over the classes of [1, C, H, W].

TorchScript exporter: `dynamo=False`, opset 17; dynamo exporter: opset 18. Random weights with fixed
seeds; each export is checked against PyTorch on onnxruntime CPU before it is written. Needs
PyTorch (CPU) and onnxscript; the files are committed so CI needs neither.
Usage: python tests/data/generators/make_decision_models.py [--out DIR]
"""

from __future__ import annotations

import argparse
import io
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OUT = Path(__file__).resolve().parents[1] / "decision_exports"


class Crnn(nn.Module):
    def __init__(self, classes: int = 12):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 2)), nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d((4, 1)))
        self.rnn = nn.GRU(16 * 2, 16, bidirectional=True, batch_first=True)
        self.fc = nn.Linear(32, classes)

    def forward(self, image: torch.Tensor) -> torch.Tensor:  # [N, 1, 16, W] -> [W / 2, N, C]
        features = self.conv(image)  # [N, 16, 2, W / 2]
        n, c, h, w = features.shape
        sequence = features.permute(0, 3, 1, 2).reshape(n, w, c * h)
        hidden, _ = self.rnn(sequence)
        return self.fc(hidden).log_softmax(2).permute(1, 0, 2)


class Yolo(nn.Module):
    def __init__(self, classes: int = 3):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.SiLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.SiLU())
        self.box = nn.Conv2d(16, 4, 1)
        self.cls = nn.Conv2d(16, classes, 1)
        self.stride = 4.0

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # [1, 3, 64, 64] -> [1, 4 + C, 256]
        features = self.backbone(images)
        n, _, h, w = features.shape
        ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
        grid = torch.stack([xs, ys]).reshape(1, 2, h * w) + 0.5
        raw = self.box(features).reshape(n, 4, h * w)
        centres = (grid + raw[:, :2].tanh()) * self.stride
        sizes = raw[:, 2:].exp() * self.stride * 2
        scores = self.cls(features).reshape(n, -1, h * w).sigmoid()
        return torch.cat([centres, sizes, scores], 1)


class Seg(nn.Module):
    def __init__(self, classes: int = 4):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, classes, 3, padding=1))

    def forward(self, image: torch.Tensor) -> torch.Tensor:  # [1, 3, 32, 32] -> [1, C, 32, 32]
        return self.net(image).softmax(1)


MODELS = {
    "crnn": (Crnn, (1, 1, 16, 32), "image", "log_probs"),
    "yolo": (Yolo, (1, 3, 64, 64), "images", "output0"),
    "seg": (Seg, (1, 3, 32, 32), "image", "probs"),
}


def export(name: str, dynamo: bool) -> bytes:
    make, shape, input_name, output_name = MODELS[name]
    torch.manual_seed(0)
    module = make().eval()
    example = torch.rand(shape)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            program = torch.onnx.export(module, (example,), dynamo=True, opset_version=18, input_names=[input_name], output_names=[output_name])
            program.save(buffer)
        else:
            torch.onnx.export(module, (example,), buffer, dynamo=False, opset_version=17, input_names=[input_name], output_names=[output_name])
    model = onnx.load_from_string(buffer.getvalue())
    for node in model.graph.node:
        del node.metadata_props[:]
    data = model.SerializeToString()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    got = session.run(None, {input_name: example.numpy()})[0]
    with torch.no_grad():
        want = module(example).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        for exporter, dynamo in (("torchscript", False), ("dynamo", True)):
            path = args.out / f"{name}.{exporter}.onnx"
            path.write_bytes(export(name, dynamo))
            print(f"{path}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
