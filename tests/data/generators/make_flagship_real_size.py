"""Export the flagship architectures at the published models' REAL input sizes (tests/data/flagship_real/).

The widths are reduced (random weights, fixed seeds) so each file stays under 2 MB and a host run
takes seconds, but every tensor has the length the published model sees, which is what decides
fp16: accumulation depth, reductions over the whole input, attention over the real sequence:
- lama: image [1,3,512,512] + mask [1,1,512,512] (Carve/LaMa-ONNX is 512x512); FFC block at 256²;
- migan: uint8 image [1,3,512,512] + mask [1,1,512,512] (migan_pipeline_v2);
- htdemucs: waveform [1,2,343980] (7.8 s stereo at 44.1 kHz) + spectrogram [1,4,2048,336]
  (make_htdemucs_full.py's architecture: the standardisation over 687960 values, the transformer
  at the real 1344 + 2688 tokens);
- mdx: [1,4,3072,256] (UVR-MDX-NET-Inst_HQ_3: n_fft 6144, the first 3072 bins, 256 frames); the
  TDF bottleneck is 1/128 of the bins instead of 1/4 so the file stays small;
- vocos: mel [1,80,256] (256 frames at hop 256 = 3.0 s at 22.05 kHz), n_fft 1024 (513 bins out).

Needs PyTorch (CPU) and onnxscript; the generated files are committed so CI needs neither.
Usage: python tests/data/generators/make_flagship_real_size.py [NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flagship_models import MDX, MIGAN, LaMa, Vocos, export_module  # noqa: E402
from make_htdemucs_full import BINS, FRAMES, LENGTH, HTDemucsFull  # noqa: E402


def _lama_inputs() -> tuple:
    image = torch.rand(1, 3, 512, 512)
    mask = torch.zeros(1, 1, 512, 512)
    mask[..., 128:320, 160:384] = 1
    return image, mask


def _migan_inputs() -> tuple:
    image = torch.randint(0, 256, (1, 3, 512, 512), dtype=torch.uint8)
    mask = torch.full((1, 1, 512, 512), 255, dtype=torch.uint8)
    mask[..., 96:288, 192:416] = 0
    return image, mask


def _htdemucs_inputs() -> tuple:
    return torch.randn(1, 2, LENGTH) * 0.3, torch.randn(1, 4, BINS, FRAMES)


MODELS = {
    # name: (module factory, example inputs, input names, output names, tolerance)
    "lama": (lambda: LaMa(width=8, blocks=1), _lama_inputs, ["image", "mask"], ["output"], 1e-2),
    "migan": (lambda: MIGAN(width=8), _migan_inputs, ["image", "mask"], ["result"], 1.0),
    "htdemucs": (lambda: HTDemucsFull(width=8, dim=32, heads=4, layers=1), _htdemucs_inputs, ["waveform", "spectrogram"], ["time", "freq"], 1e-3),
    "mdx": (lambda: MDX(bins=3072, width=4, bottleneck=128), lambda: (torch.randn(1, 4, 3072, 256),), ["input"], ["output"], 1e-3),
    "vocos": (lambda: Vocos(mels=80, n_fft=1024, dim=32, blocks=2), lambda: (torch.randn(1, 80, 256) - 4.0,), ["mel"], ["mag", "x", "y"], 1e-3),
}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", choices=[*MODELS, []], help="models to export (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "flagship_real")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for model_name in args.names or list(MODELS):
        target = args.out / f"{model_name}.onnx"
        export_module(model_name, *MODELS[model_name], target)
        print(f"wrote {target} ({target.stat().st_size} bytes)")
