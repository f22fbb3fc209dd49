"""A first visit's bytes on the wire on a plain static host beside a brotli host: the package's app
copy (`pack export`, `.br` bodies by default) served by python's http.server, which sends `.br`
files as they are (the loader decodes them itself), and by pack serve's server, which sends them
with Content-Encoding: br; and the `--bodies raw` copy on the plain host (what such a host moved
before the loader decoded brotli). Bytes from Chromium's DevTools protocol (Network.loadingFinished
encodedDataLength, headers included), a fresh profile each, the sample run and its outputs compared.

    python scripts/bench/measure_host_bytes.py dist/gtcrn [--ep wasm] [--json]
    python scripts/bench/measure_host_bytes.py dist/small --smoke --json   # the two .br visits only

Needs Chromium and a package built by `pack build`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from loader_helpers import TEST_PREFIX, blank_pages_dir  # noqa: E402
from pipeline.publish.export import export_package  # noqa: E402
from pipeline.verify.engines.browser.chromium import launch_browser  # noqa: E402
from pipeline.package_server import running_server  # noqa: E402
from static_helpers import first_visit, plain_static_server  # noqa: E402


def row(host: str, bodies: str, visit: dict) -> dict:
    if not visit.get("ok"):
        raise SystemExit(f"{host} ({bodies}): the load failed: {visit.get('name')}: {visit.get('message')}")
    found = next((e for e in visit["events"] if e["type"] == "host"), {})
    return {
        "host": host, "bodies": bodies, "wire_bytes": sum(visit["wire"].values()), "requests": len(visit["wire"]),
        "unfinished": visit["unfinished"], "decodes_brotli": found.get("decodesBrotli"), "decoder": found.get("decoder"),
        "ep": visit["info"]["ep"], "variant": visit["info"]["variant"], "outputs": visit["outputs"],
    }


def measure(package: Path, options: dict, smoke: bool) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="pack-host-bytes-") as tmp:
        site = Path(tmp)
        blank_pages_dir(site / TEST_PREFIX.strip("/"))
        export_package(package, site / "br", None, bodies="br")
        if not smoke:
            export_package(package, site / "raw", None, bodies="raw")
        rows = []
        with launch_browser() as browser:
            with running_server(site / "br", {TEST_PREFIX: site / TEST_PREFIX.strip("/")}) as brotli_host:
                brotli_host.cache_control = None  # Chromium drops loadingFinished for some no-store responses
                rows.append(row("brotli host (pack serve)", "br", first_visit(browser, brotli_host.url + TEST_PREFIX[1:] + "blank.html", brotli_host.url, options)))
            with plain_static_server(site) as plain:
                page = plain + TEST_PREFIX[1:] + "blank.html"
                rows.append(row("plain static host (python -m http.server)", "br", first_visit(browser, page, plain + "br/", options)))
                if not smoke:
                    rows.append(row("plain static host (python -m http.server)", "raw", first_visit(browser, page, plain + "raw/", options)))
        reference_bytes, reference_outputs = rows[0]["wire_bytes"], rows[0]["outputs"]
        for r in rows:
            r["ratio"] = round(r["wire_bytes"] / reference_bytes, 3)
            r["outputs_equal"] = r.pop("outputs") == reference_outputs
        return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("--ep", help="load on this execution provider only (default: the package's chain for this desktop)")
    parser.add_argument("--smoke", action="store_true", help="the two .br visits only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    options = {"prewarm": False, **({"executionProviders": [args.ep]} if args.ep else {})}
    rows = measure(args.package, options, args.smoke)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.package.name}: first visit on the wire (sample run), Chromium, CDP encodedDataLength")
    for r in rows:
        print(f"  {r['host']:<44} {r['bodies']:<4} {r['wire_bytes'] / 1e6:7.2f} MB  {r['ratio']:5.2f}x  {r['requests']:3d} requests  "
              f"{r['ep']}/{r['variant']}  outputs {'equal' if r['outputs_equal'] else 'DIFFER'}  decoder {r['decoder']}")


if __name__ == "__main__":
    main()
