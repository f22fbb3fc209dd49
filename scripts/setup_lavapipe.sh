#!/usr/bin/env bash
# The `webgpu-kernels` check stage's set-up (called by scripts/setup.sh): Mesa's lavapipe Vulkan
# driver from Debian bookworm-backports, extracted into .cache/mesa25/ beside the project (the
# system's Mesa stays as it is; Debian 12's Mesa 22 is rejected by Dawn), an ICD json pointing the
# Vulkan loader at it, and onnxruntime's WebGPU EP plugin (pyproject extra `webgpu`) in .venv.
# Idempotent: once .cache/mesa25/ready exists, a run only checks. Never fails the caller: when a
# part cannot be installed, the reason goes to .cache/mesa25/unavailable and the stage reports
# "not available: <reason>".
set -uo pipefail
cd "$(dirname "$0")/.."

MESA=$PWD/.cache/mesa25
mkdir -p "$MESA"
rm -f "$MESA/unavailable"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
give_up() { echo "$*" > "$MESA/unavailable"; echo "setup: webgpu-kernels not available: $*"; exit 0; }

# 1. onnxruntime's WebGPU EP plugin, from the `webgpu` extra of pyproject.toml.
if ! .venv/bin/python -c "import onnxruntime_ep_webgpu" 2>/dev/null; then
  echo "setup: installing onnxruntime's WebGPU EP plugin into .venv"
  requirements=$(.venv/bin/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['webgpu']))")
  # shellcheck disable=SC2086
  log=$(.venv/bin/python -m pip install -q --disable-pip-version-check $requirements 2>&1) \
    || give_up "pip could not install $(echo $requirements): $(echo "$log" | grep -m1 -i error || echo "$log" | tail -1)"
fi

# 2. lavapipe from bookworm-backports, resolved through a private apt state under .cache/mesa25/apt
#    (the system's apt sources are not touched; only `apt-get download` and `dpkg -x` are used).
if [ -f "$MESA/ready" ] && [ -f "$MESA/lvp_icd.json" ]; then
  exit 0
fi
command -v apt-get >/dev/null || give_up "no apt-get: lavapipe is installed from Debian bookworm-backports"
APT="$MESA/apt"
mkdir -p "$APT/etc" "$APT/lists/partial" "$APT/cache/archives/partial"
printf 'Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' > "$APT/etc/backports.sources"
OPTS=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$APT/etc" -o "Dir::State::Lists=$APT/lists" -o "Dir::Cache=$APT/cache" -o "Debug::NoLocking=1")
echo "setup: fetching Mesa's lavapipe from bookworm-backports into .cache/mesa25"
apt-get "${OPTS[@]}" -qq update >/dev/null 2>&1 || give_up "apt-get update of bookworm-backports failed (no access to deb.debian.org?)"

backports_version() {  # the backports candidate of $1, empty when backports does not have it
  apt-cache "${OPTS[@]}" policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2}' | grep bpo || true
}
depends() {  # package names $1 (at version $2) depends on; first of each alternative
  apt-cache "${OPTS[@]}" show "$1=$2" 2>/dev/null | awk -F': ' '/^Depends:/ {print $2; exit}' \
    | tr ',' '\n' | sed -e 's/|.*//' -e 's/(.*)//' -e 's/:any//' -e 's/ //g' | grep -v '^$'
}
# Walk the dependencies: what backports has is downloaded and extracted (Mesa and the newer libdrm
# it needs); the rest (LLVM, X/wayland client libraries, the Vulkan loader) come from the system.
declare -A extract=() system=()
queue=(mesa-vulkan-drivers mesa-libgallium)
while [ ${#queue[@]} -gt 0 ]; do
  package=${queue[0]}; queue=("${queue[@]:1}")
  [ -n "${extract[$package]:-}" ] || [ -n "${system[$package]:-}" ] && continue
  version=$(backports_version "$package")
  if [ -z "$version" ]; then system[$package]=1; continue; fi
  extract[$package]=$version
  mapfile -t more < <(depends "$package" "$version")
  queue+=("${more[@]}")
done
[ -n "${extract[mesa-vulkan-drivers]:-}" ] || give_up "bookworm-backports has no mesa-vulkan-drivers"

missing=()
for package in "${!system[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing lavapipe's system libraries: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  { as_root apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 || { as_root apt-get update -qq >/dev/null 2>&1 && as_root apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1; }; } \
    || give_up "apt-get install ${missing[*]} failed"
fi

rm -rf "$MESA/debs" "$MESA/root"
mkdir -p "$MESA/debs" "$MESA/root"
specs=(); for package in "${!extract[@]}"; do specs+=("$package=${extract[$package]}"); done
(cd "$MESA/debs" && apt-get "${OPTS[@]}" -qq download "${specs[@]}" >/dev/null 2>&1) || give_up "apt-get download ${specs[*]} failed"
for deb in "$MESA"/debs/*.deb; do dpkg-deb -x "$deb" "$MESA/root" || give_up "dpkg-deb -x $(basename "$deb") failed"; done
rm -rf "$MESA/debs"

library=$(find "$MESA/root" -name libvulkan_lvp.so | head -1)
[ -n "$library" ] || give_up "mesa-vulkan-drivers ${extract[mesa-vulkan-drivers]} has no libvulkan_lvp.so"
shipped=$(find "$MESA/root/usr/share/vulkan/icd.d" -name 'lvp_icd*.json' | head -1)
[ -n "$shipped" ] || give_up "mesa-vulkan-drivers ${extract[mesa-vulkan-drivers]} has no lvp_icd json"
# Mesa's own ICD json, pointed at the extracted library instead of the system path.
.venv/bin/python - "$shipped" "$library" "$MESA/lvp_icd.json" <<'EOF' || give_up "could not write the ICD json"
import json, sys
shipped, library, out = sys.argv[1:]
icd = json.load(open(shipped))
icd["ICD"]["library_path"] = library
open(out, "w").write(json.dumps(icd, indent=2) + "\n")
EOF
echo "${extract[mesa-vulkan-drivers]}" > "$MESA/ready"
echo "setup: lavapipe from Mesa ${extract[mesa-vulkan-drivers]} ready in .cache/mesa25"
