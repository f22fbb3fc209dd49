"""Host verification: run models on onnxruntime CPU in a child process.

The fp32 original on the CPU is the reference. `run_model` returns outputs or a failure that names
the error or the signal; when a session crashes the child, lower optimisation levels are tried
(onnxruntime 1.32 segfaults on a real fp16 GRU model at the default level and runs it at EXTENDED).
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.cache import atomic_output, cache_dir, cached_entry, file_sha256, remembered_digest, temporary_folder
from pipeline.errors import PackError, raise_child_environment_error
from pipeline.keys import arrays_sha256, stage_key

OPT_LEVELS = ("all", "extended", "basic", "disabled")
WORKER_MODULE = "pipeline.verify.engines.session_worker"  # run as `python -m`; tests swap in a crashing one
RUN_TIMEOUT_S = 600
_HOST_CODE = ("pipeline.verify.engines.host", WORKER_MODULE)  # the code a cached run's outputs come from
_HOST_LIBRARIES = ("onnxruntime", "numpy")


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


def run_key(stage: str, model_path: Path, feeds: dict[str, np.ndarray], settings: Any = None, code: tuple[str, ...] = _HOST_CODE, libraries: tuple[str, ...] = _HOST_LIBRARIES) -> str:
    """Cache key of one run of `model_path` on `feeds` (pipeline/keys.py): the model's bytes, the
    feeds, what else decides the result (`settings`), the code that runs it and the runtime's version."""
    inputs = {"model": remembered_digest(model_path, "sha256", file_sha256), "feeds": arrays_sha256(feeds)}
    return stage_key(stage, settings, inputs, code, libraries)


def run_model(model_path: Path, feeds: dict[str, np.ndarray]) -> HostRun:
    """Outputs of `model_path` on `feeds`; successful runs are cached by model bytes, inputs and
    onnxruntime version, so a rebuild of unchanged inputs runs nothing."""
    cached = cache_dir("host-runs") / f"{run_key('host-run', model_path, feeds)}.npz"
    if cached_entry(cached):
        with np.load(cached, allow_pickle=False) as result:
            level = str(result["__level__"])
            crashes = [str(c) for c in result["__crashes__"]]
            return HostRun({n: result[n] for n in result.files if not n.startswith("__")}, None, level, crashes)
    run = _run_uncached(model_path, feeds)
    if run.outputs is not None:
        with atomic_output(cached, entry=True) as handle:
            np.savez(handle, __level__=np.array(run.level), __crashes__=np.array(run.crashes, dtype=str), **run.outputs)
    return run


def _run_uncached(model_path: Path, feeds: dict[str, np.ndarray]) -> HostRun:
    crashes: list[str] = []
    with temporary_folder("pack-host-") as tmp:
        feeds_path = Path(tmp) / "feeds.npz"
        out_path = Path(tmp) / "out.npz"
        np.savez(feeds_path, **feeds)
        for level in OPT_LEVELS:
            command = [sys.executable, "-m", WORKER_MODULE, str(model_path), str(feeds_path), str(out_path), level]
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
            raise_child_environment_error(message, Path(tmp))
            return HostRun(None, message, level, crashes)
    return HostRun(None, "onnxruntime crashed at every optimisation level (" + "; ".join(crashes) + ")", None, crashes)


def reference_outputs(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """fp32 reference outputs; a reference that cannot be computed is bad input (exit 2)."""
    run = run_model(model_path, feeds)
    if run.outputs is None:
        raise PackError(f"{model_path.name}: onnxruntime cannot run the fp32 reference: {run.error}; check the model and the sample inputs")
    return run.outputs
