#!/usr/bin/env bash
# The test command: set up if needed, then the whole suite (browser tests included), on two workers
# (pytest-xdist; a test module stays on one worker, so its module-scoped builds are made once).
# Extra arguments go to pytest (e.g. `-n 0` for one process, `-m "not slow_browser"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${PACK_TEST_WORKERS:-2}" --dist loadfile "$@"
