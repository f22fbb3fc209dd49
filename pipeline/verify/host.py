"""Host verification: run models on onnxruntime CPU in a child process.

The fp32 original on the CPU is the reference. `run_model` returns outputs or a failure that names
the error or the signal; when a session crashes the child, lower optimisation levels are tried
(onnxruntime 1.32 segfaults on a real fp16 GRU model at the default level and runs it at EXTENDED).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipeline.errors import PackError

OPT_LEVELS = ("all", "extended", "basic", "disabled")
RUN_TIMEOUT_S = 600


@dataclass
class HostRun:
    outputs: dict[str, np.ndarray] | None
    error: str | None = None
    level: str | None = None  # the optimisation level that ran
    crashes: list[str] = field(default_factory=list)  # "level: SIGSEGV" for each crashed attempt


def _signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def run_model(model_path: Path, feeds: dict[str, np.ndarray]) -> HostRun:
    crashes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pack-host-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        out_path = Path(tmp) / "out.npz"
        np.savez(feeds_path, **feeds)
        for level in OPT_LEVELS:
            command = [sys.executable, "-m", "pipeline.verify.session_worker", str(model_path), str(feeds_path), str(out_path), level]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                return HostRun(None, f"onnxruntime did not finish within {RUN_TIMEOUT_S} s", level, crashes)
            if done.returncode == 0:
                with np.load(out_path) as result:
                    return HostRun({name: result[name] for name in result.files}, None, level, crashes)
            if done.returncode < 0:
                crashes.append(f"{level}: {_signal_name(done.returncode)}")
                continue
            message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
            return HostRun(None, message, level, crashes)
    return HostRun(None, "onnxruntime crashed at every optimisation level (" + "; ".join(crashes) + ")", None, crashes)


def reference_outputs(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """fp32 reference outputs; a reference that cannot be computed is bad input (exit 2)."""
    run = run_model(model_path, feeds)
    if run.outputs is None:
        raise PackError(f"{model_path.name}: onnxruntime cannot run the fp32 reference: {run.error}; check the model and the sample inputs")
    return run.outputs
