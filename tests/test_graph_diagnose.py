"""The host side of `pack diagnose`: prefixes that expose intermediates, host values, bisection."""

from __future__ import annotations

import numpy as np

from graph_helpers import decoder_head_model, random_inputs, run_host
from pipeline.verify.diagnose import _bisect, _typed_values, agrees, exposed_prefix, host_values, human_lines, random_feeds


def test_host_values_hold_every_intermediate_and_the_outputs():
    model = decoder_head_model(stale=True)
    feeds = random_inputs(model)
    values = host_values(model, feeds)
    produced = [o for node in model.graph.node for o in node.output]
    assert list(values) == produced
    assert values["audio_1d"].shape == (36,)
    np.testing.assert_array_equal(values["audio"], run_host(model, feeds)[0])


def test_exposed_prefix_keeps_the_recorded_shape_under_diagnosis():
    model = decoder_head_model(stale=True)
    prefix, names = exposed_prefix(model, 1, _typed_values(model))
    assert [n.op_type for n in prefix.graph.node] == ["ConvTranspose", "Squeeze"]
    assert names == ["overlap_added", "audio_1d"]
    squeezed = next(o for o in prefix.graph.output if o.name == "audio_1d")
    assert [d.dim_value for d in squeezed.type.tensor_type.shape.dim] == [1, 1, 36]


def test_bisect_finds_the_first_failing_prefix():
    for first_bad in range(9):
        calls = []

        def failing(k, first_bad=first_bad):
            calls.append(k)
            return k >= first_bad

        assert _bisect(failing, 9) == first_bad
        assert len(calls) <= 4


def test_agreement_needs_equal_shapes_and_close_values():
    reference = np.linspace(-1, 1, 31, dtype=np.float32)
    assert agrees(reference, reference + 1e-6)[0]
    assert not agrees(reference, reference[1:])[0]
    assert not agrees(reference, reference[::-1])[0]
    assert agrees(np.arange(4), np.arange(4))[0] and not agrees(np.arange(4), np.arange(1, 5))[0]


def test_random_feeds_respect_dtypes_and_named_dims():
    from graph_helpers import parse

    model = parse("""
<ir_version: 8, opset_import: ["" : 17]>
g (float[N,3] x, int64[N] ids) => (float[N,3] y) { y = Identity(x) }""")
    feeds = random_feeds(model, {"N": 5})
    assert feeds["x"].shape == (5, 3) and feeds["x"].dtype == np.float32
    assert feeds["ids"].dtype == np.int64 and feeds["ids"].min() >= 0


def test_human_lines_put_host_and_browser_side_by_side():
    document = {"runtime": "1.30.0", "inputs": {"x": [1, 1, 1, 31]}, "runs": [
        {"bundle": "root", "ep": "webgpu", "status": "parts", "node": "Slice#0", "op": "Slice", "index": 0, "output": "y",
         "sessions": 2, "host": {"shape": [1, 1, 1, 31], "first": [1.0]}, "browser": {"shape": [1, 1, 1, 30], "first": [1.0]},
         "metrics": {"shape_ok": False}, "hazard": {"hazard": "neg-step-slice", "repair": "neg_step_slice", "detail": "d"}},
        {"bundle": "webgpu", "ep": "wasm", "status": "agrees"},
    ]}
    lines = human_lines(document)
    assert lines[1] == "root bundle, webgpu EP: parts at node 'Slice#0' (Slice, #0), output 'y' [2 sessions]"
    assert "[1, 1, 1, 31]" in lines[3] and lines[3].rstrip().endswith("[1, 1, 1, 30]")
    assert lines[-2].startswith("    known hazard neg-step-slice (repair: neg_step_slice)")
    assert lines[-1] == "webgpu bundle, wasm EP: agrees with onnxruntime on the host"
