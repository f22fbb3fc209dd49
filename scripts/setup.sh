#!/usr/bin/env bash
# Set up pack on a fresh Debian machine: Chromium (for the browser checks), Node/npm (onnxruntime-web
# is installed through npm), and a virtual environment at .venv with pack and its test tools.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y -qq "$@" >/dev/null 2>&1 || { as_root apt-get update -qq >/dev/null && as_root apt-get install -y -qq "$@" >/dev/null; }
}

command -v chromium >/dev/null || { echo "setup: installing Debian's chromium"; apt_install chromium; }
command -v npm >/dev/null || { echo "setup: installing npm"; apt_install nodejs npm; }
# Real servers for the host configurations `pack export --host` writes (tests/test_publish_hosts.py);
# never started as services here: the tests run each on a free port with their own configuration.
{ [ -x /usr/sbin/nginx ] && [ -x /usr/sbin/apache2 ]; } || { echo "setup: installing nginx-light and apache2"; apt_install nginx-light apache2; }

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import pipeline, pytest, moto" 2>/dev/null || [ pyproject.toml -nt .venv/.pack-installed ]; then
  echo "setup: installing pack and its test tools into .venv"
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]"
  touch .venv/.pack-installed
fi
# The webgpu-kernels stage (Mesa lavapipe + onnxruntime's WebGPU EP); it never fails set-up.
bash scripts/setup_lavapipe.sh
# Firefox for `pack build --engines chromium,firefox` (the default load in a second engine, driven over
# WebDriver BiDi by npm puppeteer-core, which pack installs into its cache on first use); it never
# fails set-up: without it that check is not-verifiable and names this install line.
command -v firefox-esr >/dev/null || { echo "setup: installing Debian's firefox-esr"; apt_install firefox-esr || echo "setup: firefox-esr not installed (the Firefox default load will be not-verifiable)"; }
# WebKit for `pack build --engines ...,webkit` (WebKitGTK's MiniBrowser, driven by WebKitWebDriver
# through selenium, under Xvfb: it has no headless mode); it never fails set-up: without it that
# check is not-verifiable and names this install line.
{ command -v WebKitWebDriver >/dev/null && command -v Xvfb >/dev/null; } || { echo "setup: installing WebKitGTK's driver and Xvfb"; apt_install webkit2gtk-driver xvfb || echo "setup: webkit2gtk-driver/xvfb not installed (the WebKit default load will be not-verifiable)"; }
echo "setup: ready ($(.venv/bin/pack --help >/dev/null && echo 'pack OK'), $(chromium --version 2>/dev/null | head -1), npm $(npm --version))"
