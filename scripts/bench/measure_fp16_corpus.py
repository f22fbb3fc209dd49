"""The fp16 conversion corpus table (docs/precision.md): each export of tests/data/exporter_corpus/
(every flagship architecture, both torch.onnx exporters, two sizes) built with its flagship recipe,
`pack build RECIPE --source FILE --sha256 … --no-browser --json` (host checks and the webgpu-kernels
stage), one markdown row each: model, exporter, size, fp16 verdict (verified, or refused with the reason), the nodes kept in
fp32, fp16 bytes beside fp32, build time.

Usage: python scripts/bench/measure_fp16_corpus.py OUT_DIR [NAME ...] [--json]
Smoke: python scripts/bench/measure_fp16_corpus.py OUT_DIR --smoke --json (the TorchScript LaMa export only)
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

import onnx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from anywhere: the checkout's own pipeline/
CORPUS = REPO / "tests" / "data" / "exporter_corpus"
SYMBOLIC = {"height": 32, "width": 32}  # the TorchScript image exports' dynamic axes, at their example size
RECIPES = {"lama": "lama", "migan": "migan", "vocos": "vocos", "wavtokenizer": "wavtokenizer-decode", "htdemucs": "htdemucs", "mdx": "uvr-mdx", "scnet": "scnet", "mpsenet": "mp-senet"}


def build_args(path: Path, out: Path) -> list[str]:
    """The recipe build of one export: `--input NAME=AxB` for each input (its exported size)."""
    import hashlib

    model = onnx.load(str(path), load_external_data=False)
    recipe = RECIPES[path.name.split(".")[0]]
    args = ["build", recipe, "--source", str(path), "--sha256", hashlib.sha256(path.read_bytes()).hexdigest(), "--no-browser", "--json", "--out", str(out)]
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        args += ["--input", f"{value.name}=" + "x".join(str(d.dim_value if d.HasField("dim_value") else SYMBOLIC.get(d.dim_param, 1)) for d in dims)]
    return args


def row(path: Path, package: Path, seconds: float | None) -> dict:
    report = json.loads((package / "report.json").read_text())
    manifest = json.loads((package / "manifest.json").read_text())
    name, exporter, size = path.name.split(".")[:3]
    checks = [c for c in report["checks"] if c["variant"] == "fp16" and c["stage"] in ("host", "webgpu-kernels")]
    failed = [c for c in checks if c["status"] == "failed"]
    refusal = (report.get("variants_refused") or {}).get("fp16")
    if refusal:
        verdict = f"refused: {refusal}"
    elif failed:
        verdict = "refused: " + "; ".join(f"{c['stage']} {c['output']}: {c.get('detail', '')}" for c in failed[:2])
    else:
        verdict = "verified" if checks and all(c["status"] == "passed" for c in checks) else "/".join(sorted({c["status"] for c in checks})) or "no check"
    kept = (manifest.get("fp16") or {}).get("keptFp32", [])
    sizes = {v: sum(f["size"] for p, f in manifest["files"].items() if p.startswith(f"model.{v}.") and not p.endswith(".br")) for v in ("fp16", "fp32")}
    return {
        "model": name, "exporter": exporter, "size": size, "verdict": verdict,
        "kept": len(kept), "kept_ops": dict(Counter(k["op"] for k in kept)),
        "fp16_bytes": sizes["fp16"], "fp32_bytes": sizes["fp32"],
        "build_s": round(seconds, 1) if seconds is not None else None,
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| model | exporter | size | fp16 (host + webgpu-kernels) | kept in fp32 | fp16 / fp32 bytes | build time |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        kept = "0" if not r["kept"] else f"{r['kept']}: " + ", ".join(f"{n} {op}" for op, n in r["kept_ops"].items())
        ratio = f"{r['fp16_bytes']:,} / {r['fp32_bytes']:,} ({r['fp16_bytes'] / r['fp32_bytes']:.0%})" if r["fp16_bytes"] else f"– / {r['fp32_bytes']:,}"
        lines.append(f"| {r['model']} | {r['exporter']} | {r['size']} | {r['verdict']} | {kept} | {ratio} | {r['build_s']} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("names", nargs="*", help="corpus files without .onnx (default: all)")
    parser.add_argument("--smoke", action="store_true", help="the TorchScript LaMa export only, to check the script runs")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON instead of the markdown table")
    args = parser.parse_args()
    available = sorted(p.stem for p in CORPUS.glob("*.onnx"))
    names = ["lama.torchscript.small"] if args.smoke else (args.names or available)
    unknown = sorted(set(names) - set(available))
    if unknown:
        parser.error(f"{', '.join(unknown)}: not in tests/data/exporter_corpus; choose from {', '.join(available)}")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        path = CORPUS / f"{name}.onnx"
        out = (args.out / name).resolve()
        started = time.perf_counter()
        out.mkdir(parents=True, exist_ok=True)  # the build's working folder (a built-in recipe's lock goes there)
        subprocess.run([sys.executable, "-m", "pipeline.cli", *build_args(path, out)], env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=out, stdout=subprocess.DEVNULL, check=False)
        rows.append(row(path, out / RECIPES[path.name.split(".")[0]], time.perf_counter() - started))
        if not args.json:
            print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps(rows) if args.json else markdown(rows))


if __name__ == "__main__":
    main()
