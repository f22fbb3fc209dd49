"""Time to first result, bytes fetched and background trial time of a package's demo page on this
machine's Chromium (SwiftShader's WebGPU here): a first visit in a fresh profile side by side with
a second visit (Cache Storage and the stored decision), and with --no-priors a run without the
build's measurements beside one with them.

    python scripts/bench/measure_first_visit.py dist/gtcrn [--no-priors] [--json]
    python scripts/bench/measure_first_visit.py dist/small --smoke --json   # the first visit only

--no-priors drops manifest.measurements (a copy of the package), as on an adapter class the build
never measured: the first result then comes from the chain's first choice and the trials follow it.
Needs Chromium and a package built by `pack build` (its index.html is the demo page measured).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.verify.engines.browser.chromium import launch_browser  # noqa: E402
from pipeline.package_server import running_server  # noqa: E402


def visit(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_function("window.packDemo && (window.packDemo.trials || window.packDemo.error)", timeout=600_000)
    return page.evaluate("window.packDemo")


def figures(name: str, demo: dict) -> dict:
    """One visit's figures, from the demo page's window.packDemo."""
    fetched, trials, selection = demo["fetched"], demo["trials"], demo["selection"]
    return {"visit": name, "first_result_ms": demo["firstResultMs"], "ep": demo["ep"], "variant": demo["variant"],
            "started_from": selection.get("startedFrom") or ("cached decision" if selection.get("fromCache") else selection.get("mode")),
            "wire_bytes": fetched["wireBytes"], "decoded_bytes": fetched["bytes"], "files": fetched["files"], "cached_bytes": fetched["cachedBytes"],
            "trials": {"ran": trials["ran"], "ms": trials.get("ms"), "wire_bytes": (trials.get("fetched") or {}).get("wireBytes"),
                       "choice": trials.get("choice"), "bundle": trials.get("bundle"), "note": selection.get("note"),
                       "candidates": [{k: c.get(k) for k in ("ep", "variant", "result", "steadyMs")} for c in selection.get("candidates") or []]}}


def print_visit(row: dict) -> None:
    print(f"{row['visit']}: first result {row['first_result_ms']:.0f} ms after the page opened on {row['ep']}/{row['variant']} ({row['started_from']}); "
          f"fetched {row['wire_bytes'] / 1e6:.1f} MB on the wire ({row['decoded_bytes'] / 1e6:.1f} MB decoded, {row['files']} files, "
          f"{row['cached_bytes'] / 1e6:.1f} MB from Cache Storage)")
    trials = row["trials"]
    if trials["ran"]:
        print(f"  trials after it: {trials['ms']} ms, {trials['wire_bytes'] / 1e6:.1f} MB more; choice {trials['choice']['ep']}/{trials['choice']['variant']}, "
              f"bundle {trials['bundle']} from then on; " + ", ".join(f"{c['ep']}/{c['variant']} {c['result']} {c['steadyMs']} ms" for c in trials["candidates"]))
    else:
        print(f"  no trials ({trials['note'] or 'decision reused'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--no-priors", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="the first visit only: checks the benchmark runs")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    package = args.package
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.no_priors:
            package = Path(shutil.copytree(package, Path(tmp) / package.name))
            manifest = json.loads((package / "manifest.json").read_text())
            manifest["measurements"] = []
            (package / "manifest.json").write_text(json.dumps(manifest))
        with running_server(package) as server, launch_browser() as browser:
            page = browser.new_context().new_page()
            for name in ("first visit",) if args.smoke else ("first visit", "second visit"):
                demo = visit(page, server.url + "index.html?select=measured")
                if not demo["ok"]:
                    raise SystemExit(f"{name}: {demo['error']}")
                rows.append(figures(name, demo))
                if not args.json:
                    print_visit(rows[-1])
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
