"""Export the LaMa and MI-GAN architectures of make_flagship_models.py at the real 512x512 size,
wider than the committed test exports, for calibrating the image thresholds (docs/precision.md).

Random weights with fixed seeds, as make_flagship_models.py. Needs PyTorch (CPU) and onnxscript.
Usage: python tests/data/generators/make_image_calibration_models.py OUT_DIR [--only lama512] [--lama-width W --lama-blocks B]
(the defaults, width 32 and 3 FFC blocks, make the calibration export; `--lama-width 128
--lama-blocks 18`, LaMa's depth at a quarter of its block width, 34 MB of fp32 weights, is the
export scripts/bench/bench_coding.py measures)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import onnx
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # beside make_flagship_models.py
from make_flagship_models import LaMa, MIGAN, OPSET, _randomise_norm_statistics  # noqa: E402

SIZE = 512


def examples(lama_width: int = 32, lama_blocks: int = 3) -> dict:
    torch.manual_seed(1)
    image = torch.rand(1, 3, SIZE, SIZE)
    mask = torch.zeros(1, 1, SIZE, SIZE)
    mask[..., 128:320, 160:384] = 1
    pixels = (image * 255).round().to(torch.uint8)
    known = torch.full((1, 1, SIZE, SIZE), 255, dtype=torch.uint8)
    known[..., 96:288, 192:416] = 0
    return {
        "lama512": (lambda: LaMa(width=lama_width, blocks=lama_blocks), (image, mask), ["output"]),
        "migan512": (lambda: MIGAN(width=32), (pixels, known), ["result"]),
    }


def main(out: Path, only: list[str] | None = None, lama_width: int = 32, lama_blocks: int = 3) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name, (factory, example, outputs) in examples(lama_width, lama_blocks).items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        module = factory().eval()
        with torch.no_grad():
            _randomise_norm_statistics(module)
        program = torch.onnx.export(module, example, dynamo=True, opset_version=OPSET, input_names=["image", "mask"], output_names=outputs, optimize=True, verbose=False)
        model = program.model_proto
        for node in model.graph.node:
            del node.metadata_props[:]
        model.producer_version = ""
        onnx.save(model, str(out / f"{name}.onnx"))
        print(out / f"{name}.onnx")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", action="append", choices=["lama512", "migan512"])
    parser.add_argument("--lama-width", type=int, default=32)
    parser.add_argument("--lama-blocks", type=int, default=3)
    args = parser.parse_args()
    main(args.out, args.only, args.lama_width, args.lama_blocks)
