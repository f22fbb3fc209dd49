"""Export every flagship architecture with both torch.onnx exporters at two input sizes
(tests/data/exporter_corpus/<name>.<exporter>.<size>.onnx): the fp16 conversion corpus; beside
them a VITS-architecture voice (`VITS` below) whose float durations decide its output length.

The two exporters write the same module as different graphs: the TorchScript exporter
(`dynamo=False`, opset 17) traces shapes into Shape/Gather/Cast chains, keeps `torch.arange` over a
traced size as `Range(Constant, Cast(to=FLOAT)(Gather(Shape(x))), Constant)` and exports
`torch.flip` as a negative-step Slice; the dynamo exporter (opset 18) folds most of that away.
LaMa is exported as the published LaMa ONNX was made: its Fourier unit with `torch.fft` replaced by
DFT matrices built in the forward pass from `torch.arange` over the feature map's size (the
TorchScript exporter cannot export `aten::fft_rfftn`), the spectrum's mirrored half by `torch.flip`.
Sizes: each architecture's example input ("small") and the same with its last axis doubled ("wide");
the TorchScript export of an image model at the small size makes height and width dynamic axes
(shape chains kept), at the wide size static (shape chains folded to constants). Exports the
exporter cannot make at a size (a module with a fixed frame count) are listed and skipped.

Weights are random with fixed seeds (make_flagship_models.py's modules); node metadata is stripped
and each export is checked against PyTorch on onnxruntime CPU before it is written.
Needs PyTorch (CPU) and onnxscript; the generated files are committed so CI needs neither.
Usage: python tests/data/generators/make_exporter_corpus.py [NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import io
import math
import sys
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_flagship_models as flagship  # noqa: E402

EXPORTERS = {"torchscript": 17, "dynamo": 18}


class MatmulFourierUnit(nn.Module):
    """LaMa's Fourier unit with matrix DFTs built from the input's own size (as published ports do)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels * 2, channels * 2, kernel_size=1, bias=False)
        self.bn = nn.BatchNorm2d(channels * 2)

    @staticmethod
    def _dft(size) -> tuple[torch.Tensor, torch.Tensor]:
        k = torch.arange(size, dtype=torch.float32)
        n = torch.ones_like(k).sum()  # the size as a float tensor, traced by either exporter
        angle = (-2 * math.pi) * k[:, None] * k[None, :] / n
        return torch.cos(angle) / torch.sqrt(n), torch.sin(angle) / torch.sqrt(n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2], x.shape[-1]
        cos_h, sin_h = self._dft(height)
        cos_w, sin_w = self._dft(width)
        half = width // 2 + 1
        # forward: along W (keep the non-redundant half), then along H
        real_w, imag_w = (x @ cos_w)[..., :half], (x @ sin_w)[..., :half]
        real = cos_h @ real_w - sin_h @ imag_w
        imag = cos_h @ imag_w + sin_h @ real_w
        spectrum = F.relu(self.bn(self.conv(torch.cat((real, imag), dim=1))))
        real, imag = torch.chunk(spectrum, 2, dim=1)
        # the mirrored half: bins W//2+1 .. W-1 are bins W - W//2 - 1 .. 1 conjugated
        real_full = torch.cat((real, torch.flip(real[..., 1 : width - half + 1], dims=[-1])), dim=-1)
        imag_full = torch.cat((imag, -torch.flip(imag[..., 1 : width - half + 1], dims=[-1])), dim=-1)
        # inverse: along H, then W, real part
        real_h = cos_h @ real_full + sin_h @ imag_full
        imag_h = cos_h @ imag_full - sin_h @ real_full
        return real_h @ cos_w + imag_h @ sin_w


def _lama_matmul() -> nn.Module:
    module = flagship.LaMa()
    for block in module.blocks:
        block.fourier = MatmulFourierUnit(block.fourier.conv.in_channels // 2)
    return module


class VITS(nn.Module):
    """A VITS-architecture voice at tiny dims: a text encoder (token embeddings, convolutions), a
    duration predictor whose float durations go through `Ceil` and are summed into the output
    length (`torch.arange` over it: a Range whose limit a float decided), the alignment built as VITS
    builds it (positions compared with the cumulative durations, differenced into a 0/1 path that
    expands the encoder's frames by MatMul), and a transposed-convolution decoder to samples."""

    def __init__(self, vocabulary: int = 24, channels: int = 16, hop: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocabulary, channels)
        self.encoder = nn.Sequential(nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(), nn.Conv1d(channels, channels, 3, padding=1))
        self.duration = nn.Sequential(nn.Conv1d(channels, channels, 3, padding=1), nn.ReLU(), nn.Conv1d(channels, 1, 1))
        self.decoder = nn.Sequential(
            nn.ConvTranspose1d(channels, channels // 2, 2 * hop, stride=hop, padding=hop // 2), nn.LeakyReLU(0.1),
            nn.Conv1d(channels // 2, 1, 7, padding=3), nn.Tanh())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens).transpose(1, 2)  # [1, C, T]
        hidden = hidden + self.encoder(hidden)
        # log durations around 1: each token lasts 1 to ~6 frames
        durations = torch.ceil(torch.exp(self.duration(hidden).squeeze(1) + 0.7))  # [1, T] float
        length = torch.clamp_min(durations.sum(), 1).long()
        ends = torch.cumsum(durations, dim=-1)  # [1, T]
        frames = torch.arange(length, dtype=durations.dtype)  # [F]
        upto = (frames[None, None, :] < ends[:, :, None]).float()  # [1, T, F]
        path = upto - F.pad(upto, (0, 0, 1, 0))[:, :-1]  # frame f belongs to token t
        expanded = hidden @ path  # [1, C, F]
        return self.decoder(expanded).squeeze(1)  # [1, F * hop]


def vits_example() -> tuple:
    return (torch.randint(0, 24, (1, 12), generator=torch.Generator().manual_seed(0)),)


def _doubled(example: tuple) -> tuple:
    """The example with its last axis doubled (images: both spatial axes)."""
    grown = []
    for tensor in example:
        if tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2] and tensor.dtype in (torch.float32, torch.uint8):
            grown.append(F.interpolate(tensor.float(), scale_factor=2.0, mode="nearest").to(tensor.dtype))
        else:
            grown.append(torch.cat((tensor, tensor), dim=-1))
    return tuple(grown)


def _architectures() -> dict:
    models = dict(flagship.MODELS)
    factory, example, inputs, outputs, tolerance = models["lama"]
    models["lama"] = (_lama_matmul, example, inputs, outputs, tolerance)
    models["vits"] = (VITS, vits_example, ["tokens"], ["audio"], 1e-4)
    return models


def _dynamic_axes(example: tuple, names: list[str]) -> dict:
    """Image models: height and width dynamic (the Fourier unit's DFT sizes come from the input)."""
    return {name: {2: "height", 3: "width"} for name, tensor in zip(names, example) if tensor.dim() == 4 and tensor.shape[-1] == tensor.shape[-2]}


def export(name: str, exporter: str, size: str, output: Path) -> None:
    factory, example_fn, input_names, output_names, tolerance = _architectures()[name]
    torch.manual_seed(0)
    module = factory().eval()
    with torch.no_grad():
        flagship._randomise_norm_statistics(module)
    example = example_fn()
    if size == "wide":
        example = _doubled(example)
    opset = EXPORTERS[exporter]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            model = torch.onnx.export(module, example, dynamo=True, opset_version=opset, input_names=input_names, output_names=output_names, optimize=True, verbose=False).model_proto
        else:
            buffer = io.BytesIO()
            torch.onnx.export(module, example, buffer, dynamo=False, opset_version=opset, input_names=input_names, output_names=output_names, dynamic_axes=(_dynamic_axes(example, input_names) or None) if size == "small" else None)
            model = onnx.load_from_string(buffer.getvalue())
    for graph in [model.graph]:
        for node in graph.node:
            del node.metadata_props[:]
            node.doc_string = ""
    model.graph.doc_string = ""
    model.producer_version = ""
    flagship._check_against_torch(module, model, example, input_names, tolerance, f"{name}.{exporter}.{size}")
    onnx.save(model, str(output))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="architectures to export (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "exporter_corpus")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model_name in args.names or list(_architectures()):
        for exporter_name in EXPORTERS:
            for size_name in ("small", "wide"):
                target = args.out / f"{model_name}.{exporter_name}.{size_name}.onnx"
                try:
                    export(model_name, exporter_name, size_name, target)
                except Exception as error:  # noqa: BLE001 - an export the exporter cannot make is listed, not fatal
                    print(f"skipped {target.name}: {type(error).__name__}: {str(error).splitlines()[0][:200]}")
                    continue
                print(f"wrote {target.name} ({target.stat().st_size} bytes)")
