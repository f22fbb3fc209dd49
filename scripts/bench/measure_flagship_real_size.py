"""The fp16 table of the flagship architectures at their real input sizes (docs/precision.md).

Builds each export of tests/data/flagship_real/ with its recipe at the sizes cases.json gives
(`pack build --no-browser --json`: host checks and the webgpu-kernels stage, node audit forced with
PACK_WEBGPU_KERNELS_MAX_GMAC=0 unless set), or reads packages built before (--from DIR), and prints
one markdown row per model: input size, GMAC, fp16 verdict, the host's fp16 figures (PSNR or SNR),
the audit's worst node, kept nodes, fp16 bytes beside fp32 (side by side), audit time, build time.

Usage: python scripts/bench/measure_flagship_real_size.py OUT_DIR [NAME ...] [--from] [--json]
Smoke: python scripts/bench/measure_flagship_real_size.py OUT_DIR --smoke --json (Vocos only, the smallest)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from anywhere: the checkout's own pipeline/
DATA = REPO / "tests" / "data" / "flagship_real"


def cases() -> dict[str, dict]:
    return {name: case for name, case in json.loads((DATA / "cases.json").read_text()).items() if not name.startswith("_")}


def build_args(name: str, out: Path) -> list[str]:
    case = cases()[name]
    source = DATA / f"{name}.onnx"
    import hashlib

    args = ["build", case["recipe"], "--source", str(source), "--sha256", hashlib.sha256(source.read_bytes()).hexdigest(), "--no-browser", "--json", "--out", str(out)]
    for shape in case["inputs"]:
        args += ["--input", shape]
    return args


def gmac(name: str) -> float:
    from pipeline.verify.engines.webgpu_kernels import estimated_macs

    model = onnx.load(str(DATA / f"{name}.onnx"), load_external_data=False)
    feeds = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        feeds[value.name] = np.zeros([d.dim_value for d in tensor.shape.dim], onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type))
    return estimated_macs(DATA / f"{name}.onnx", feeds) / 1e9


def _figure(check: dict) -> str:
    m = check.get("metrics", {})
    parts = []
    for key, label in (("psnr_db", "PSNR {:.1f} dB"), ("snr_db", "SNR {:.1f} dB"), ("seg_snr_db", "seg {:.1f} dB"), ("one_level_share", "{:.2%} one level off"), ("max_abs_of_range", "max {:.1e}")):
        if key in m and (key != "max_abs_of_range" or not parts):
            parts.append(label.format(m[key]))
    return f"{check['output']}: " + ", ".join(parts)


def row(name: str, package: Path, seconds: float | None = None) -> dict:
    report = json.loads((package / "report.json").read_text())
    manifest = json.loads((package / "manifest.json").read_text())
    checks = report["checks"]
    host = [c for c in checks if c["stage"] == "host" and c["variant"] == "fp16"]
    kernels = [c for c in checks if c["stage"] == "webgpu-kernels" and c["variant"] == "fp16"]
    refused = [r for r in (report.get("refused") or []) if "fp16" in json.dumps(r)]
    statuses = {c["status"] for c in host + kernels}
    verdict = "verified" if statuses == {"passed"} and not refused else ("refused" if refused or "failed" in statuses else "/".join(sorted(statuses)))
    kept = (manifest.get("fp16") or {}).get("keptFp32", [])
    sizes = {v: next(f["size"] for path, f in manifest["files"].items() if path.startswith(f"model.{v}.") and path.endswith(".onnx")) for v in ("fp16", "fp32")}
    audit = (report.get("webgpu_kernels") or {}).get("runs", {}).get("fp16", {}).get("audit", {})
    worst = kernels[0]["metrics"].get("max_abs_of_scale") if kernels and kernels[0].get("metrics") else None
    return {
        "model": name,
        "size": cases()[name]["size"],
        "gmac": round(gmac(name), 2),
        "verdict": verdict,
        "host": "; ".join(_figure(c) for c in host),
        "audit_worst": worst,
        "audit_nodes": audit.get("nodes"),
        "audit_s": audit.get("total_s"),
        "kept": len(kept),
        "kept_ops": dict(Counter(k["op"] for k in kept)),
        "kept_why": sorted({k["why"].split(":")[0] for k in kept}),
        "fp16_bytes": sizes["fp16"],
        "fp32_bytes": sizes["fp32"],
        "build_s": round(seconds, 1) if seconds is not None else None,
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| model | input (real size) | GMAC | fp16 | host fp16 figures | audit: worst node error of scale (nodes) | kept in fp32 | fp16 / fp32 bytes | audit time | build time |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = "0" if not r["kept"] else f"{r['kept']}: " + ", ".join(f"{n} {op}" for op, n in r["kept_ops"].items())
        worst = f"{r['audit_worst']:.2e} ({r['audit_nodes']} nodes)" if r["audit_worst"] is not None else "–"
        ratio = f"{r['fp16_bytes']:,} / {r['fp32_bytes']:,} ({r['fp16_bytes'] / r['fp32_bytes']:.0%})"
        lines.append(f"| {r['model']} | {r['size']} | {r['gmac']} | {r['verdict']} | {r['host']} | {worst} | {kept} | {ratio} | {r['audit_s']} s | {r['build_s']} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*")
    parser.add_argument("--from", dest="existing", action="store_true", help="read the packages already in OUT (no build)")
    parser.add_argument("--smoke", action="store_true", help="Vocos only (the smallest export), to check the script runs")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the markdown table")
    args = parser.parse_args()
    names = ["vocos"] if args.smoke else (args.names or list(cases()))
    unknown = sorted(set(names) - set(cases()))
    if unknown:
        parser.error(f"{', '.join(unknown)}: not in tests/data/flagship_real/cases.json; choose from {', '.join(cases())}")
    args.out.mkdir(parents=True, exist_ok=True)  # its parent holds the built-in recipes' lock (./pack.lock.json)
    env = {**os.environ, "PACK_WEBGPU_KERNELS_MAX_GMAC": os.environ.get("PACK_WEBGPU_KERNELS_MAX_GMAC", "0")}
    rows = []
    for name in names:
        package = args.out / cases()[name]["recipe"]
        seconds = None
        if not args.existing:
            started = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pipeline.cli", *build_args(name, args.out.resolve())], env={**env, "PYTHONPATH": str(REPO)}, cwd=args.out.resolve().parent, stdout=subprocess.DEVNULL, check=False)
            seconds = time.perf_counter() - started
        rows.append(row(name, package, seconds))
        if not args.json:
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps(rows) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
