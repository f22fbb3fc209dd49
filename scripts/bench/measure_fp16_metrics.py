"""Measure the metric figures behind the default thresholds (docs/precision.md): a good fp16
variant side by side with the breakages the thresholds must keep failing.

For each target (a recipe name/file, or a model with --kind), on onnxruntime CPU and the recipe's
sample inputs: the fp16 variant's figures against fp32, and the same figures for the breakages the
thresholds must keep failing (all zeros, as JSEP's broken kernels return; an output one element
short along the last axis, as the negative-step Slice off-by-one gives; for images, one wrong 8x8
patch, off by a tenth of the range, in the middle).

    python scripts/bench/measure_fp16_metrics.py gtcrn tests/data/ffc_block.onnx --kind image [--webgpu] [--json]
    python scripts/bench/measure_fp16_metrics.py --smoke --json   # tests/data/ffc_block.onnx as an image model

--webgpu also runs the fp16 variant on the webgpu-kernels stage (lavapipe; scripts/setup_lavapipe.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.assets.samples import make_feeds  # noqa: E402
from pipeline.build import BuildOptions, load_build_recipe  # noqa: E402
from pipeline.stages.repair import repair as _repair  # noqa: E402
from pipeline.graph.model_io import load_model, model_bytes  # noqa: E402
from pipeline.precision.fp16 import convert_with_keeps  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.source import resolve_source  # noqa: E402
from pipeline.verify.engines.host import run_model  # noqa: E402
from pipeline.verify.judgement.metrics import compare  # noqa: E402

SHOWN = ("max_abs_of_range", "p999_abs_of_range", "block_mae_of_range", "one_level_share", "rel_l2", "psnr_db", "snr_db", "seg_snr_db")


def _line(label: str, metrics: dict) -> str:
    if not metrics.get("shape_ok", True):
        return f"    {label:<12} shape {metrics['shape']} vs {metrics['expected_shape']}"
    return f"    {label:<12} " + "  ".join(f"{key} {metrics[key]:.4g}" for key in SHOWN if key in metrics)


def measure(target: str, kind: str | None, webgpu: bool = False) -> dict:
    """{"target", "source", "outputs": {name: {"kind", "shape", "rows": {label: metrics}}}, "webgpu_error"}."""
    recipe = load_build_recipe(BuildOptions(target=target))
    source = resolve_source(recipe.source, recipe.source_sha256, recipe.base_dir, Progress.quiet())
    model, _ = _repair(load_model(source), recipe)
    feeds = make_feeds(model, recipe, None).feeds
    fp16 = convert_with_keeps(model, recipe.fp16_block_ops).model
    webgpu_error = None
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, variant in (("fp32", model), ("fp16", fp16)):
            files[name] = Path(tmp) / f"{name}.onnx"
            files[name].write_bytes(model_bytes(variant))
        reference, actual = run_model(files["fp32"], feeds).outputs, run_model(files["fp16"], feeds).outputs
        on_webgpu = None
        if webgpu:  # the fp16 variant on onnxruntime's WebGPU kernels (lavapipe): fp16 accumulation
            from pipeline.verify.engines.webgpu_kernels import run_on_webgpu

            run = run_on_webgpu(files["fp16"], feeds)
            on_webgpu, webgpu_error = run.outputs, run.error
    outputs = {}
    for name, expected in reference.items():
        spec = recipe.outputs.get(name)
        output_kind = kind or (spec.numeric_kind if spec else "tensor")
        rows = {"fp16": compare(expected, actual[name], output_kind)}
        if on_webgpu is not None:
            rows["fp16 webgpu"] = compare(expected, on_webgpu[name], output_kind)
        rows["zeros"] = compare(expected, np.zeros_like(expected), output_kind)
        rows["one short"] = compare(expected, expected[..., :-1], output_kind)
        if output_kind == "image" and expected.ndim >= 2:
            rows["patch"] = compare(expected, wrong_patch(expected), output_kind)
        outputs[name] = {"kind": output_kind, "shape": list(expected.shape), "rows": rows}
    return {"target": target, "source": source.name, "outputs": outputs, "webgpu_error": webgpu_error}


def print_measured(measured: dict) -> None:
    print(f"{measured['target']} ({measured['source']})")
    if measured["webgpu_error"]:
        print(f"  fp16 on webgpu-kernels: {measured['webgpu_error']}")
    for name, output in measured["outputs"].items():
        print(f"  {name} [{output['kind']}] {output['shape']}")
        for label, metrics in output["rows"].items():
            print(_line(label, metrics))


def wrong_patch(image: np.ndarray) -> np.ndarray:
    """`image` with an 8x8 patch in the middle of the last two axes off by a tenth of its range."""
    patch = image.astype(np.float64).copy()
    h, w = image.shape[-2] // 2, image.shape[-1] // 2
    step = 0.1 * (float(image.max()) - float(image.min())) or 0.1
    region = patch[..., h:h + 8, w:w + 8]
    middle = (float(image.max()) + float(image.min())) / 2
    patch[..., h:h + 8, w:w + 8] = np.where(region > middle, region - step, region + step)  # away from saturation
    if image.dtype.kind in "iu":
        info = np.iinfo(image.dtype)
        return np.clip(np.round(patch), info.min, info.max).astype(image.dtype)
    return patch.astype(image.dtype)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*")
    parser.add_argument("--kind", choices=("tensor", "image", "audio"), help="output kind for bare models")
    parser.add_argument("--webgpu", action="store_true", help="also run the fp16 variant on the webgpu-kernels stage's WebGPU EP (lavapipe)")
    parser.add_argument("--smoke", action="store_true", help="tests/data/ffc_block.onnx as an image model: checks the script runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.smoke:
        args.targets, args.kind = args.targets or [str(ROOT / "tests" / "data" / "ffc_block.onnx")], args.kind or "image"
    if not args.targets:
        parser.error("give at least one target (a recipe name or file, or an .onnx with --kind), or --smoke")
    measured = [measure(target, args.kind if target.endswith(".onnx") else None, args.webgpu) for target in args.targets]
    if args.json:
        print(json.dumps(measured, indent=2, default=float))
        return
    for row in measured:
        print_measured(row)


if __name__ == "__main__":
    main()
