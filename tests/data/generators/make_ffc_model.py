"""Export a small LaMa-style FFC spectral block to ONNX (tests/data/ffc_block.onnx by default).

LaMa's Fast Fourier Convolution runs a 1x1 conv in the frequency domain between
`torch.fft.rfftn` and `torch.fft.irfftn`. Two inverse forms are exported:
- `irfftn` (default): torch 2.13 with onnxscript 0.7 exports it as a one-sided inverse DFT;
- `hermitian`: the form ONNX ports of LaMa use, completing the spectrum's mirrored half with
  `torch.flip` before a full inverse FFT. The flip exports as a Slice with steps=-1 and
  ends=INT64_MIN, the pattern the root onnxruntime-web build computes one element short.
Weights are random (seeded): the graph pattern is what the tests need, not a trained model.
Node metadata (stack traces with local paths) is stripped.

Needs PyTorch (CPU build) and onnxscript; the generated files are committed so CI needs neither.
Usage: python tests/data/generators/make_ffc_model.py [--inverse irfftn|hermitian] [OUTPUT.onnx]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import onnx
import torch
from torch import nn

CHANNELS = 4
HEIGHT, WIDTH = 8, 8
OPSET = 18


class FourierUnit(nn.Module):
    """The spectral half of LaMa's FFC: rfft → 1x1 conv on (real, imag) channels → irfft."""

    def __init__(self, channels: int, inverse: str):
        super().__init__()
        self.inverse = inverse
        self.conv = nn.Conv2d(channels * 2, channels * 2, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(channels * 2)
        self.relu = nn.ReLU(inplace=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, channels, height, width = x.shape
        spectrum = torch.fft.rfftn(x, dim=(-2, -1), norm="ortho")
        stacked = torch.stack((spectrum.real, spectrum.imag), dim=-1)
        stacked = stacked.permute(0, 1, 4, 2, 3).contiguous().view(batch, -1, height, width // 2 + 1)
        stacked = self.relu(self.bn(self.conv(stacked)))
        stacked = stacked.view(batch, -1, 2, height, width // 2 + 1).permute(0, 1, 3, 4, 2).contiguous()
        spectrum = torch.complex(stacked[..., 0], stacked[..., 1])
        if self.inverse == "irfftn":
            return torch.fft.irfftn(spectrum, s=(height, width), dim=(-2, -1), norm="ortho")
        # Bins W//2+1 .. W-1 of a real signal's spectrum mirror bins 1 .. W - W//2 - 1, conjugated.
        mirrored = torch.conj(torch.flip(spectrum[..., 1 : width - width // 2], dims=[-1]))
        full = torch.cat((spectrum, mirrored), dim=-1)
        return torch.fft.ifftn(full, dim=(-2, -1), norm="ortho").real


class SpectralBlock(nn.Module):
    """LaMa's SpectralTransform: 1x1 conv in, Fourier unit, residual add, 1x1 conv out."""

    def __init__(self, channels: int, inverse: str):
        super().__init__()
        self.conv_in = nn.Sequential(nn.Conv2d(channels, channels // 2, 1, bias=False), nn.ReLU())
        self.fourier = FourierUnit(channels // 2, inverse)
        self.conv_out = nn.Conv2d(channels // 2, channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.conv_in(x)
        return self.conv_out(hidden + self.fourier(hidden))


def export(output: Path, inverse: str) -> None:
    torch.manual_seed(0)
    block = SpectralBlock(CHANNELS, inverse).eval()
    with torch.no_grad():  # non-trivial BatchNorm statistics, so the block is not near-identity
        block.fourier.bn.running_mean.uniform_(-0.5, 0.5)
        block.fourier.bn.running_var.uniform_(0.5, 1.5)
    example = torch.randn(1, CHANNELS, HEIGHT, WIDTH)
    program = torch.onnx.export(block, (example,), dynamo=True, opset_version=OPSET,
                                input_names=["x"], output_names=["y"], optimize=True)
    model = program.model_proto
    for node in model.graph.node:
        del node.metadata_props[:]
    model.graph.doc_string = ""
    onnx.save(model, str(output))
    check_against_torch(block, output, example)


def check_against_torch(block: nn.Module, path: Path, example: torch.Tensor) -> None:
    """The export must compute what PyTorch computes (onnxruntime CPU), or the tests prove nothing."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    exported = session.run(None, {"x": example.numpy()})[0]
    with torch.no_grad():
        expected = block(example).numpy()
    error = float(np.max(np.abs(exported - expected)))
    if error > 1e-4:
        raise SystemExit(f"{path}: onnxruntime differs from PyTorch by {error}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inverse", choices=("irfftn", "hermitian"), default="irfftn")
    parser.add_argument("output", nargs="?", type=Path)
    args = parser.parse_args()
    data = Path(__file__).resolve().parent.parent
    default_name = "ffc_block.onnx" if args.inverse == "irfftn" else "ffc_block_flip.onnx"
    target = args.output or data / default_name
    export(target, args.inverse)
    print(f"wrote {target} ({target.stat().st_size} bytes)")
