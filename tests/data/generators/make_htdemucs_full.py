"""Export the HTDemucs architecture at the real model's input size (random weights, reduced width).

waveform [1,2,343980] + spectrogram [1,4,2048,336] -> time [1,4,2,343980] + freq [1,4,4,2048,336],
the shapes of timcsy/demucs-web-onnx's htdemucs_embedded.onnx (recipes/htdemucs.toml). The graph
patterns are those of make_flagship_models.py's HTDemucs (normalised waveform, Conv encoders, a cross
transformer between the branches, ConvTranspose decoders, the freq branch masking the spectrogram),
with four stride-4 encoder layers per branch, as the published model has, so the transformer sees
the real model's sequence lengths (time 343980 padded to 344064 / 256 = 1344 steps, freq 2048 / 256
= 8 bins x 336 frames = 2688 tokens); the waveform is padded to a multiple of 256 (Pad) and the time
output cropped back (Slice), as the published model does. Fixed seed; checked against PyTorch on
onnxruntime CPU before it is written.

Needs PyTorch (CPU) and onnxscript. Usage: python tests/data/generators/make_htdemucs_full.py OUT.onnx
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flagship_models import OPSET, CrossTransformerLayer, cross_transform  # noqa: E402

LENGTH, BINS, FRAMES, SOURCES = 343980, 2048, 336, 4
STRIDE = 4 ** 4  # four stride-4 layers per branch


def _encoder(conv, cin: int, width: int, dim: int, kernel, stride, padding) -> nn.Sequential:
    channels = [cin, width, width, width, dim]
    layers: list[nn.Module] = []
    for a, b in zip(channels, channels[1:]):
        layers += [conv(a, b, kernel, stride=stride, padding=padding), nn.GELU()]
    return nn.Sequential(*layers)


def _decoder(conv, dim: int, width: int, cout: int, kernel, stride, padding) -> nn.Sequential:
    channels = [dim, width, width, width, cout]
    layers: list[nn.Module] = []
    for a, b in zip(channels, channels[1:]):
        layers += [conv(a, b, kernel, stride=stride, padding=padding), nn.GELU()]
    return nn.Sequential(*layers[:-1])


class HTDemucsFull(nn.Module):
    def __init__(self, sources: int = SOURCES, width: int = 8, dim: int = 32, heads: int = 4, layers: int = 2):
        super().__init__()
        self.sources = sources
        self.time_encoder = _encoder(nn.Conv1d, 2, width, dim, 8, 4, 2)
        self.freq_encoder = _encoder(nn.Conv2d, 4, width, dim, (8, 1), (4, 1), (2, 0))
        self.transformer = nn.ModuleList([CrossTransformerLayer(dim, heads) for _ in range(layers)])
        self.time_decoder = _decoder(nn.ConvTranspose1d, dim, width, 2 * sources, 8, 4, 2)
        self.freq_decoder = _decoder(nn.ConvTranspose2d, dim, width, 4 * sources, (8, 1), (4, 1), (2, 0))

    def forward(self, waveform, spectrogram):
        length = waveform.shape[-1]
        mean, std = waveform.mean(dim=(1, 2), keepdim=True), waveform.std(dim=(1, 2), keepdim=True)
        x = F.pad((waveform - mean) / (1e-5 + std), (0, (-length) % STRIDE))
        t = self.time_encoder(x)  # [1, dim, 1344]
        f = self.freq_encoder(spectrogram)  # [1, dim, 8, 336]
        t, f = cross_transform(self.transformer, t, f)
        batch, frames = f.shape[0], f.shape[3]
        time_out = self.time_decoder(t)[..., :length].reshape(batch, self.sources, 2, length) * std + mean
        freq_out = self.freq_decoder(f).reshape(batch, self.sources, 4, spectrogram.shape[2], frames) * spectrogram.unsqueeze(1)
        return time_out, freq_out


def main(output: Path) -> None:
    torch.manual_seed(0)
    module = HTDemucsFull().eval()
    waveform = torch.randn(1, 2, LENGTH) * 0.3
    spectrogram = torch.randn(1, 4, BINS, FRAMES)
    program = torch.onnx.export(module, (waveform, spectrogram), dynamo=True, opset_version=OPSET,
                                input_names=["waveform", "spectrogram"], output_names=["time", "freq"], optimize=True, verbose=False)
    model = program.model_proto
    for node in model.graph.node:
        del node.metadata_props[:]
    model.graph.doc_string = ""
    model.producer_version = ""

    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {"waveform": waveform.numpy(), "spectrogram": spectrogram.numpy()})
    with torch.no_grad():
        want = module(waveform, spectrogram)
    for name, g, w in zip(["time", "freq"], got, want):
        assert g.shape == tuple(w.shape), (name, g.shape, w.shape)
        error = float(np.max(np.abs(g.astype(np.float64) - w.numpy().astype(np.float64))))
        scale = float(np.max(np.abs(w.numpy())))
        print(f"{name} {list(g.shape)}: max |onnxruntime - torch| {error:.3g} (output range {scale:.3g})")
        if error > 1e-3 * max(scale, 1.0):
            raise SystemExit(f"htdemucs: onnxruntime differs from PyTorch on {name} by {error}")
    onnx.save(model, str(output))
    print(f"wrote {output} ({output.stat().st_size} bytes)")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_htdemucs_full.py OUT.onnx")
    main(Path(sys.argv[1]))
