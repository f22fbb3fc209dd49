"""Read what a page printed during one run: node placement, kernel profile, failure signals.

onnxruntime-web 1.30 prints every log line through console.error with ANSI colours (removed by
chromium.py), tagged `[V:onnxruntime` / `[I:` / `[W:` / `[E:`. With logSeverityLevel 0 a session
logs "Node placements", then per EP "Node(s) placed on [XExecutionProvider]. Number of nodes: N"
followed by one "  OpType (node name)" line per node; the native WebGPU EP also logs "webgpu kernel
not found in registries for Op type: X node name: Y". `endProfiling()` prints a Chrome trace, one
event per console.log line.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from pipeline.verify.engines.browser.chromium import ConsoleLine

_PLACED_ON = re.compile(r"Node\(s\) placed on \[(\w+)\]\. Number of nodes: (\d+)")
_ALL_PLACED_ON = re.compile(r"All nodes placed on \[(\w+)\]\. Number of nodes: (\d+)")
_PLACED_NODE = re.compile(r"VerifyEachNodeIsAssignedToAnEp\]\s{2,}(\S+) \((.*)\)\s*$")
_NO_KERNEL = re.compile(r"kernel not found in registries for Op type: (\S+) node name: (.*?)\s*$")
_ORT_ERROR = re.compile(r"\[E:onnxruntime")
_VERBOSE = re.compile(r"\[[VI]:onnxruntime")
_OUTPUT_SIZE = re.compile(r"VerifyOutputSizes\]\s*(.*)")
# Chromium's own console report of a WebGPU error (also seen by the uncapturederror hook)
_WEBGPU_CONSOLE = re.compile(r"uncaught WebGPU validation error|WebGPU (?:device|error)|GPUValidationError", re.I)
_MISSING_FEATURE = re.compile(r"requires f16|does not support|shader-f16|not supported by (?:the )?(?:device|adapter)", re.I)
_MEMCPY_OPS = {"MemcpyFromHost", "MemcpyToHost"}


@dataclass
class Placement:
    cpu_nodes: list[dict] = field(default_factory=list)  # [{"op", "node", "reason"}] placed on the CPU EP
    unsupported: list[dict] = field(default_factory=list)  # [{"op", "node"}] with no kernel on the EP
    eps: dict[str, int] = field(default_factory=dict)  # EP -> node count
    all_on_cpu: bool = False  # "All nodes placed on [CPUExecutionProvider]" (no per-node lines follow)


def parse_placement(lines: list[ConsoleLine]) -> Placement:
    """Which nodes onnxruntime placed where, from the session's verbose log."""
    placement = Placement()
    unsupported: dict[str, str] = {}
    current_ep: str | None = None
    for line in lines:
        text = line.text
        if match := _NO_KERNEL.search(text):
            unsupported.setdefault(match.group(2), match.group(1))
            continue
        if match := _ALL_PLACED_ON.search(text):
            current_ep = None
            placement.eps[match.group(1)] = placement.eps.get(match.group(1), 0) + int(match.group(2))
            placement.all_on_cpu = match.group(1) == "CPUExecutionProvider"
            continue
        if match := _PLACED_ON.search(text):
            current_ep = match.group(1)
            placement.eps[current_ep] = placement.eps.get(current_ep, 0) + int(match.group(2))
            continue
        if current_ep and (match := _PLACED_NODE.search(text)):
            op, node = match.group(1), match.group(2)
            if current_ep == "CPUExecutionProvider" and op not in _MEMCPY_OPS:
                reason = "no kernel on the EP" if node in unsupported else "assigned to CPU by onnxruntime (e.g. shape computation)"
                placement.cpu_nodes.append({"op": op, "node": node, "reason": reason})
            continue
        if "VerifyEachNodeIsAssignedToAnEp" not in text:
            current_ep = None
    placement.unsupported = [{"op": op, "node": node} for node, op in unsupported.items()]
    return placement


def slowest_kernels(lines: list[ConsoleLine], top: int = 5, runs: int = 1) -> list[dict]:
    """The nodes with the most kernel time over the `runs` profiled runs (`per_run_us` = total / runs;
    one node may dispatch several programs per run, so `calls` can exceed `runs`).

    The native WebGPU EP reports GPU time as `cat: "Api"` events named `node&OpType&Program`;
    the CPU EP reports `cat: "Node"` events named `<node>_kernel_time` (host time). GPU time is
    preferred when present.
    """
    gpu: dict[tuple[str, str], list[float]] = {}
    host: dict[tuple[str, str], list[float]] = {}
    for event in _trace_events(lines):
        name = str(event.get("name", ""))
        duration = event.get("dur")
        if not isinstance(duration, (int, float)):
            continue
        if event.get("cat") == "Api" and name.count("&") >= 2:
            node, op = name.split("&")[:2]
            gpu.setdefault((node, op), []).append(float(duration))
        elif event.get("cat") == "Node" and name.endswith("_kernel_time"):
            op = str((event.get("args") or {}).get("op_name", ""))
            host.setdefault((name[: -len("_kernel_time")], op), []).append(float(duration))
    source, clock = (gpu, "gpu") if gpu else (host, "host")
    ranked = sorted(source.items(), key=lambda item: -sum(item[1]))[:top]
    return [
        {"node": node, "op": op, "clock": clock, "calls": len(durations),
         "total_us": round(sum(durations), 1), "per_run_us": round(sum(durations) / max(runs, 1), 1)}
        for (node, op), durations in ranked
    ]


def failure_signals(lines: list[ConsoleLine], gpu_error_list: list[dict]) -> list[str]:
    """Reasons to fail a run that resolved: GPU errors, onnxruntime errors, wrong output sizes."""
    signals: list[str] = []
    # the first errors say why; the ones after are mostly "invalid due to a previous error"
    for error in gpu_error_list[:2]:
        signals.append(f"WebGPU {error.get('kind', 'error')}: {_first_line(error.get('message', ''))}")
    if len(gpu_error_list) > 2:
        signals.append(f"{len(gpu_error_list)} WebGPU errors in all")
    seen_gpu_in_console = False
    for line in lines:
        text = line.text
        if _ORT_ERROR.search(text):
            signals.append("onnxruntime error: " + _after_tag(text))
        elif match := _OUTPUT_SIZE.search(text):
            if "does not match" in match.group(1):
                signals.append("output-size mismatch: " + match.group(1).strip())
        elif line.type == "pageerror":
            signals.append("uncaught page error: " + _first_line(text))
        elif _WEBGPU_CONSOLE.search(text) and not gpu_error_list and not seen_gpu_in_console:
            # the hook missed it (e.g. a device made before the hook): keep the console's word
            seen_gpu_in_console = True
            signals.append("WebGPU error (console): " + _first_line(text))
    return _dedupe(signals)


def is_verbose(line: ConsoleLine) -> bool:
    """An onnxruntime verbose or info line: what only a non-production log level prints."""
    return bool(_VERBOSE.search(line.text))


def names_missing_feature(error: str) -> bool:
    """Whether an error says the device lacks a feature (e.g. "Program Cast requires f16 but ...")."""
    return bool(_MISSING_FEATURE.search(error))


def _trace_events(lines: list[ConsoleLine]):
    for line in lines:
        if line.type != "log":
            continue
        text = line.text.strip().rstrip(",")
        if not (text.startswith("{") and '"cat"' in text):
            continue
        try:
            event = json.loads(text)
        except ValueError:
            continue
        if isinstance(event, dict):
            yield event


def _after_tag(text: str) -> str:
    # "2026-... [E:onnxruntime:, sequential_executor.cc:671 ExecuteKernel] Non-zero status ..." -> the message
    closing = text.find("] ", text.find("[E:onnxruntime"))
    return _first_line(text[closing + 2:] if closing >= 0 else text)


def _first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def _dedupe(items: list[str]) -> list[str]:
    seen: set[str] = set()
    unique = []
    for item in items:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique
