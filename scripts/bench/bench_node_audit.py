"""Time the webgpu-kernels node audit on built packages and list what it finds: each variant's nodes
on onnxruntime's WebGPU kernels side by side with the fp32 variant on the CPU, and a cold run beside
warm ones.

    .venv/bin/python scripts/bench/bench_node_audit.py dist/isnet-fp16 [dist/other ...] [--runs 2] [--json out.json|-]
    .venv/bin/python scripts/bench/bench_node_audit.py dist/small --smoke --json -   # one run

Per package (built with `pack build ... --no-browser`): the package's fp16 and fp32 variants audited
node by node on onnxruntime's WebGPU EP on lavapipe, against its fp32 variant on the package's
sample inputs, as the `webgpu-kernels` stage does for models over the whole-run limit. The first
run may compile shaders (cold Mesa cache); later runs show the warm time. The host run is cached
by pack like every host run, so `--runs 2` shows the audit itself the second time. Needs the
webgpu-kernels stage (scripts/setup_lavapipe.sh): without it, it says why and exits 2. With
`--json -` the figures go to stdout as JSON and the lines to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pipeline.assets.chunks import runnable_model  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.sample_file import read_sample  # noqa: E402
from pipeline.verify.engines import node_audit
from pipeline.verify.engines import webgpu_kernels  # noqa: E402


def bench(package: Path, runs: int, out=sys.stdout) -> dict:
    manifest = json.loads((package / "manifest.json").read_text())
    feeds = read_sample(package, manifest)[0]
    # as the loader hands them to onnxruntime: chunked weights reassembled, fp16w widened
    variants = {name: (runnable_model(package, v, name), v["precision"]) for name, v in manifest["variants"].items() if v.get("precision") in ("fp16", "fp16w", "fp32")}
    reference = variants["fp32"][0]
    limit = webgpu_kernels.whole_run_limit(reference, feeds)
    print(f"{package.name}: {webgpu_kernels.estimated_macs(reference, feeds) / 1e9:.1f} GMAC per run; whole run: {limit or 'within the limit'}", file=out)
    timings = []
    result = None
    for attempt in range(runs):
        started = time.perf_counter()
        result = node_audit.audit_variants(reference, variants, feeds, (manifest.get("epOptions") or {}).get("webgpu") or {}, Progress.quiet())
        timings.append(round(time.perf_counter() - started, 1))
        print(f"  run {attempt + 1}: {timings[-1]} s ({result.timings_s})", file=out)
    facts = result.facts()
    for name, summary in facts["variants"].items():
        print(f"  {name}: {summary['audited']} nodes audited, {summary['passed']} passed, {len(summary['failed'])} failed, {len(summary['not_verifiable'])} not verifiable; worst {summary['worst']}", file=out)
        for verdict in summary["failed"]:
            print(f"    FAILED {verdict['node']} ({verdict['op']}) at {verdict['shape']}: {verdict['detail']}  [{verdict['cut']}]", file=out)
        for verdict in summary["not_verifiable"][:5]:
            print(f"    not verifiable {verdict['node']} ({verdict['op']}): {verdict['detail']}", file=out)
    print(f"  not auditable: {facts['not_audited']['count']} {facts['not_audited']['by_op']}", file=out)
    return {"package": package.name, "seconds": timings, "audit": facts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", type=Path)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="one run: checks the benchmark runs")
    parser.add_argument("--json", help="write the figures to this file (- for stdout)")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 1
    reason = webgpu_kernels.unavailable_reason()
    if reason:
        print(f"error: webgpu-kernels not available: {reason}", file=sys.stderr)
        sys.exit(2)
    for package in args.packages:
        manifest = package / "manifest.json"
        if not manifest.is_file():
            print(f"error: {manifest} not found; give a package folder built by `pack build ... --no-browser`", file=sys.stderr)
            sys.exit(2)
        precisions = {v.get("precision") for v in json.loads(manifest.read_text())["variants"].values()}
        if "fp32" not in precisions:
            print(f"error: {package} has no fp32 variant to audit against; build it with variants = ['fp16', 'fp32']", file=sys.stderr)
            sys.exit(2)
    results = [bench(package, args.runs, sys.stderr if args.json == "-" else sys.stdout) for package in args.packages]
    if args.json == "-":
        print(json.dumps(results, indent=1, default=str))
    elif args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
