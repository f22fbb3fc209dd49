#!/usr/bin/env bash
# The test command: set up if needed, then the whole suite (browser tests included), on three
# workers (pytest-xdist; a test module stays on one worker, so its module-scoped builds are made
# once). Three, on two cores: measured faster than two from a clean clone (pytest 14 min 07 s
# against 15 min 07 s); modules with `slow` tests go first (conftest.py).
# Extra arguments go to pytest (e.g. `-n 0` for one process, `-m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${PACK_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@"
