"""A session worker that dies of SIGSEGV at the optimisation levels named in PACK_TEST_CRASH_LEVELS,
as onnxruntime 1.32 does on a real fp16 GRU model at the default level, and runs normally at the
others."""

import os
import signal
import sys

from pipeline.verify.engines.session_worker import main

if __name__ == "__main__":
    if sys.argv[4] in os.environ.get("PACK_TEST_CRASH_LEVELS", "").split(","):
        os.kill(os.getpid(), signal.SIGSEGV)
    main(*sys.argv[1:5])
