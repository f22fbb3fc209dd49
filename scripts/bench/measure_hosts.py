#!/usr/bin/env python3
"""A package's first visit on each kind of static host, side by side in one run: the bytes every
server sent (a relay in front of it counts them, the page's, its workers' and a service worker's
requests alike, headers included), whether the page was cross-origin isolated and how many wasm
threads the loader took, the time from navigation to the first result (the sample run; reloads
included), and whether the outputs met the build's bounds against its fp32 reference.

Each host serves `pack export PACKAGE` as its documentation says, with the app page
(tests/data/host_page.html) at the site root:
- nginx with the `--host nginx` snippet, Apache with the `--host apache` .htaccess (plus the page
  folder's two `Header always set Cross-Origin-…` lines, as docs/hosts.md says), and `serve` from
  npm with the `--host serve` serve.json: `.br` bodies with Content-Encoding: br;
- a plain static server (python's http.server; GitHub Pages serves files the same way) with the
  default export, with `--coi-shim`, and with an app's fallback page for unknown paths (a
  single-page app on Cloudflare Pages or Netlify): the loader decodes the `.br` bodies itself;
- the plain static server with a `--bodies raw` export: what such a host moved before.

    .venv/bin/python scripts/bench/measure_hosts.py dist/gtcrn [--json]
    .venv/bin/python scripts/bench/measure_hosts.py dist/small --smoke --json   # nginx and the plain server only

Needs a package built by `pack build`, Chromium, nginx and apache2 (scripts/setup.sh), and npm for
`serve`. WebGPU is off (the wasm EP, whose threads the hosts decide). Not a test: it prints figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import host_servers  # noqa: E402
from pipeline.verify.engines.browser.chromium import launch_browser  # noqa: E402
from static_helpers import plain_static_server  # noqa: E402

PAGE_HEADERS = '# the app page: cross-origin isolated (docs/hosts.md)\nHeader always set Cross-Origin-Opener-Policy "same-origin"\nHeader always set Cross-Origin-Embedder-Policy "require-corp"\n'


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def export(package: Path, site: Path, *options: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pipeline.cli", "export", str(package), str(site / package.name), *options], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        fail(f"pack export {' '.join(options)}: {(done.stderr or done.stdout).strip().splitlines()[-1]}")


def hosts() -> list[dict]:
    """Each host: its name, the export options, the server (site, run folder → base URL), what the
    page needs beside the export."""
    return [
        {"host": "nginx (--host nginx)", "options": ["--host", "nginx"], "server": lambda site, run, name: host_servers.nginx(site, [site / "pack-site.nginx.conf", site / f"{name}.nginx.conf"], run)},
        {"host": "Apache (--host apache)", "options": ["--host", "apache"], "server": lambda site, run, name: host_servers.apache(site, run), "htaccess": True},
        {"host": "serve from npm (--host serve)", "options": ["--host", "serve"], "server": lambda site, run, name: host_servers.serve(site, site / f"{name}.serve.json"), "at_root": True},
        {"host": "plain static server (--host github-pages)", "options": ["--host", "github-pages"], "server": lambda site, run, name: plain_static_server(site)},
        {"host": "the same, --coi-shim", "options": ["--host", "github-pages", "--coi-shim"], "server": lambda site, run, name: plain_static_server(site), "shim": True},
        {"host": "plain, an app's fallback page for unknown paths", "options": [], "server": lambda site, run, name: plain_static_server(site, "index.html")},
        {"host": "plain static server, --bodies raw (before)", "options": ["--bodies", "raw"], "server": lambda site, run, name: plain_static_server(site)},
    ]


def measure(package: Path, browser, smoke: bool) -> list[dict]:
    rows = []
    for host in hosts():
        if smoke and host["options"] not in (["--host", "nginx"], ["--host", "github-pages"]):
            continue
        site, run = Path(tempfile.mkdtemp(prefix="pack-hosts-site-")), Path(tempfile.mkdtemp(prefix="pack-hosts-run-"))
        try:
            site.chmod(0o755)  # Apache's children run as nobody when this runs as root
            export(package, site, *host["options"])
            host_servers.app_page(site, shim=host.get("shim", False))
            if host.get("shim"):
                shutil.copy(site / package.name / "coi-serviceworker.js", site / "coi-serviceworker.js")
            if host.get("htaccess"):
                (site / ".htaccess").write_text(PAGE_HEADERS)
            exported = sum(p.stat().st_size for p in (site / package.name).rglob("*") if p.is_file())
            with host["server"](site, run, package.name) as base, host_servers.counting_relay(base) as (relay, count):
                # serve redirects /index.html to /, dropping the query
                page = f"{relay}{'' if host.get('at_root') else 'index.html'}?package={package.name}/"
                result = host_servers.page_result(browser, page, isolated=bool(host.get("shim")))
                time.sleep(0.3)  # the last bytes through the relay
                sent = count.sent
            rows.append({
                "host": host["host"], "export_bytes": exported, "wire_bytes": sent, "isolated": result["isolated"], "threads": result["threads"], "cores": result["cores"],
                "first_result_s": result["seconds"], "page_first_result_s": round(result["firstResultMs"] / 1000, 2),
                "ep": result["ep"], "variant": result["variant"], "outputs_right": result["passed"], "outputs": result["text"],
            })
        finally:
            shutil.rmtree(site, ignore_errors=True)
            shutil.rmtree(run, ignore_errors=True)
    reference = rows[0]["wire_bytes"]
    for r in rows:
        r["ratio"] = round(r["wire_bytes"] / reference, 3)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="a package folder made by pack build (dist/<name>)")
    parser.add_argument("--smoke", action="store_true", help="nginx and the plain static server only")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not (args.package / "manifest.json").is_file():
        fail(f"{args.package}: no manifest.json; give a package folder made by pack build (dist/<name>)")
    with launch_browser(webgpu=False) as browser:
        rows = measure(args.package.resolve(), browser, args.smoke)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{args.package.name}: first visit per host (Chromium, wasm; bytes the server sent, headers included; first result from navigation)")
    print(f"  {'host':<50} {'export MB':>9} {'wire MB':>8} {'ratio':>6} {'isolated':>8} {'threads':>7} {'first result':>12}  outputs")
    for r in rows:
        print(f"  {r['host']:<50} {r['export_bytes'] / 1e6:9.2f} {r['wire_bytes'] / 1e6:8.2f} {r['ratio']:6.2f} {str(r['isolated']):>8} {r['threads']:>7} "
              f"{r['first_result_s']:>10.1f} s  {'right' if r['outputs_right'] else 'WRONG'} ({r['ep']}/{r['variant']})")


if __name__ == "__main__":
    main()
