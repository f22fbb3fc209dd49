"""Reading onnxruntime-web's console output (lines as onnxruntime-web 1.30 prints them)."""

from __future__ import annotations

from pipeline.verify.engines.browser.chromium import ConsoleLine
from pipeline.verify.engines.browser.logs import failure_signals, names_missing_feature, parse_placement, slowest_kernels

PLACEMENT = [
    "2026-11-30 04:06:36.981489 [I:onnxruntime:, webgpu_execution_provider.cc:665 GetCapability] webgpu kernel not found in registries for Op type: Det node name: det0",
    "2026-11-30 04:06:37.048614 [V:onnxruntime:, session_state.cc:1377 VerifyEachNodeIsAssignedToAnEp] Node placements",
    "2026-11-30 04:06:37.048985 [V:onnxruntime:, session_state.cc:1383 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2",
    "2026-11-30 04:06:37.049179 [V:onnxruntime:, session_state.cc:1385 VerifyEachNodeIsAssignedToAnEp]   Det (det0)",
    "2026-11-30 04:06:37.049180 [V:onnxruntime:, session_state.cc:1385 VerifyEachNodeIsAssignedToAnEp]   Shape (shape of x)",
    "2026-11-30 04:06:37.049384 [V:onnxruntime:, session_state.cc:1383 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [WebGpuExecutionProvider]. Number of nodes: 4",
    "2026-11-30 04:06:37.049580 [V:onnxruntime:, session_state.cc:1385 VerifyEachNodeIsAssignedToAnEp]   Relu (relu0)",
    "2026-11-30 04:06:37.049919 [V:onnxruntime:, session_state.cc:1385 VerifyEachNodeIsAssignedToAnEp]   MemcpyFromHost (Memcpy)",
    "2026-11-30 04:06:37.050214 [W:onnxruntime:, session_state.cc:1397 VerifyEachNodeIsAssignedToAnEp] Some nodes were not assigned to the preferred execution providers",
]


def _lines(texts: list[str], kind: str = "error") -> list[ConsoleLine]:
    return [ConsoleLine(kind, text) for text in texts]


def test_cpu_nodes_and_missing_kernels_from_the_placement_log() -> None:
    placement = parse_placement(_lines(PLACEMENT))
    assert placement.cpu_nodes == [
        {"op": "Det", "node": "det0", "reason": "no kernel on the EP"},
        {"op": "Shape", "node": "shape of x", "reason": "assigned to CPU by onnxruntime (e.g. shape computation)"},
    ]
    assert placement.unsupported == [{"op": "Det", "node": "det0"}]
    assert placement.eps == {"CPUExecutionProvider": 2, "WebGpuExecutionProvider": 4}
    assert not placement.all_on_cpu


def test_all_nodes_on_one_ep() -> None:
    line = "[V:onnxruntime:, session_state.cc:1380 VerifyEachNodeIsAssignedToAnEp]  All nodes placed on [CPUExecutionProvider]. Number of nodes: 3"
    placement = parse_placement(_lines([line]))
    assert placement.all_on_cpu and placement.eps == {"CPUExecutionProvider": 3} and placement.cpu_nodes == []


def test_slowest_kernels_prefer_gpu_time() -> None:
    trace = [
        '{"cat" : "Node","pid" :42,"tid" :1,"dur" :16284,"ts" :399369,"ph" : "X","name" :"slice0_kernel_time","args" : {"op_name" : "Slice"}},',
        '{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :70,"ts" :445669,"ph" : "X","name" :"slice0&Slice&Slice","args" : {}}',
        '{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :30,"ts" :445700,"ph" : "X","name" :"slice0&Slice&Slice","args" : {}}',
        '{"cat" : "Api","pid" :-1,"tid" :-1,"dur" :500,"ts" :445800,"ph" : "X","name" :"conv&Conv&Conv2DMatMul","args" : {}}',
    ]
    ranked = slowest_kernels(_lines(trace, "log"), runs=2)
    assert ranked == [
        {"node": "conv", "op": "Conv", "clock": "gpu", "calls": 1, "total_us": 500.0, "per_run_us": 250.0},
        {"node": "slice0", "op": "Slice", "clock": "gpu", "calls": 2, "total_us": 100.0, "per_run_us": 50.0},
    ]
    host_only = slowest_kernels(_lines(trace[:1], "log"))
    assert host_only == [{"node": "slice0", "op": "Slice", "clock": "host", "calls": 1, "total_us": 16284.0, "per_run_us": 16284.0}]


def test_failure_signals_beside_exceptions() -> None:
    lines = _lines([
        "2026 [E:onnxruntime:, sequential_executor.cc:671 ExecuteKernel] Non-zero status code returned while running Cast node.",
        "2026 [W:onnxruntime:, execution_frame.cc:905 VerifyOutputSizes] Expected shape from model of {1,1,1,31} does not match actual shape of {1,1,1,30} for output y",
        "2026 [I:onnxruntime:, inference_session.cc:3094 Initialize] Session successfully initialized.",
    ]) + [ConsoleLine("pageerror", "TypeError: x is undefined")]
    gpu = [{"kind": "GPUValidationError", "message": "Error while parsing WGSL: :8:71 error: 'f16' type used without 'f16' extension enabled\n@group(0)"}]
    assert failure_signals(lines, gpu) == [
        "WebGPU GPUValidationError: Error while parsing WGSL: :8:71 error: 'f16' type used without 'f16' extension enabled",
        "onnxruntime error: Non-zero status code returned while running Cast node.",
        "output-size mismatch: Expected shape from model of {1,1,1,31} does not match actual shape of {1,1,1,30} for output y",
        "uncaught page error: TypeError: x is undefined",
    ]
    clean = _lines(["2026 [I:onnxruntime:, inference_session.cc:3094 Initialize] Session successfully initialized."])
    assert failure_signals(clean, []) == []


def test_gpu_error_seen_only_on_the_console_still_counts() -> None:
    lines = _lines(["An uncaught WebGPU validation error was raised: [Invalid CommandBuffer] is invalid due to a previous error."])
    assert failure_signals(lines, []) == ["WebGPU error (console): An uncaught WebGPU validation error was raised: [Invalid CommandBuffer] is invalid due to a previous error."]


def test_missing_feature_errors_are_recognised() -> None:
    assert names_missing_feature("shader_helper.cc:416 GenerateSourceCode Program Cast requires f16 but the device does not support it.")
    assert not names_missing_feature("Can't create a session. ERROR_CODE: 1, ERROR_MESSAGE: Unsupported model IR version: 14")


def test_plan_runs_every_variant_on_every_ep_of_each_shipped_bundle() -> None:
    from pipeline.verify.engines.browser.run_plan import plan_runs

    manifest = {
        "variants": {"fp16": {}, "fp32": {}},
        "variantFor": {"webgpu": ["fp16", "fp32"], "wasm": ["fp32"]},
        "runtime": {"bundles": {"webgpu": {}, "wasm": {}}},
        "executionProviders": {"desktop": ["webgpu", "wasm"], "apple-mobile": ["wasm"]},
    }
    runs = [(r.bundle, r.ep, r.variant, r.default) for r in plan_runs(manifest)]
    assert runs == [
        ("webgpu", "webgpu", "fp16", True), ("webgpu", "webgpu", "fp32", True),
        ("webgpu", "wasm", "fp32", True), ("webgpu", "wasm", "fp16", False),
        ("wasm", "wasm", "fp32", True), ("wasm", "wasm", "fp16", False),
    ]

