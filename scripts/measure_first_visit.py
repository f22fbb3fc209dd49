"""Time to first result, bytes fetched and background trial time of a package's demo page on this
machine's Chromium (SwiftShader's WebGPU here), first visit in a fresh profile and a second visit.

    python scripts/measure_first_visit.py dist/gtcrn [--no-priors]

--no-priors drops manifest.measurements (a copy of the package), as on an adapter class the build
never measured: the first result then comes from the chain's first choice and the trials follow it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from pipeline.verify.browser.chromium import launch_browser
from pipeline.verify.browser.server import running_server


def visit(page, url: str) -> dict:
    page.goto(url)
    page.wait_for_function("window.packDemo && (window.packDemo.trials || window.packDemo.error)", timeout=600_000)
    return page.evaluate("window.packDemo")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--no-priors", action="store_true")
    args = parser.parse_args()
    package = args.package
    with tempfile.TemporaryDirectory() as tmp:
        if args.no_priors:
            package = Path(shutil.copytree(package, Path(tmp) / package.name))
            manifest = json.loads((package / "manifest.json").read_text())
            manifest["measurements"] = []
            (package / "manifest.json").write_text(json.dumps(manifest))
        with running_server(package) as server, launch_browser() as browser:
            page = browser.new_context().new_page()
            for name in ("first visit", "second visit"):
                demo = visit(page, server.url + "index.html?select=measured")
                if not demo["ok"]:
                    raise SystemExit(f"{name}: {demo['error']}")
                fetched, trials, selection = demo["fetched"], demo["trials"], demo["selection"]
                print(f"{name}: first result {demo['firstResultMs']:.0f} ms after the page opened on {demo['ep']}/{demo['variant']} "
                      f"({selection.get('startedFrom') or ('cached decision' if selection.get('fromCache') else selection.get('mode'))}); "
                      f"fetched {fetched['wireBytes'] / 1e6:.1f} MB on the wire ({fetched['bytes'] / 1e6:.1f} MB decoded, {fetched['files']} files, "
                      f"{fetched['cachedBytes'] / 1e6:.1f} MB from Cache Storage)")
                if trials["ran"]:
                    print(f"  trials after it: {trials['ms']} ms, {trials['fetched']['wireBytes'] / 1e6:.1f} MB more; choice {trials['choice']['ep']}/{trials['choice']['variant']}, "
                          f"bundle {trials['bundle']} from then on; " + ", ".join(f"{c['ep']}/{c['variant']} {c['result']} {c.get('steadyMs')} ms" for c in selection["candidates"]))
                else:
                    print(f"  no trials ({selection.get('note') or 'decision reused'})")


if __name__ == "__main__":
    main()
