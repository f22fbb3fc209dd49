"""Tiny models in ONNX text form for the graph tests, and host runs to compare them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime

from pipeline.graph import repairs

DATA = Path(__file__).resolve().parent / "data"
FFC_MODEL = DATA / "ffc_block.onnx"  # torch.fft.rfftn / irfftn as exported by torch 2.13
FFC_FLIP_MODEL = DATA / "ffc_block_flip.onnx"  # the same block with a torch.flip spectrum completion
INT64_MIN_PLUS_1 = -9223372036854775807


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def _floats(values: np.ndarray) -> str:
    return ", ".join(f"{v:.6g}" for v in values.reshape(-1))


def neg_slice_model(length: int | str = 31, end: int = INT64_MIN_PLUS_1, start: int = -1, step: int = -1, opset: int = 17) -> onnx.ModelProto:
    """One Slice reversing the last axis, the exporters' way (the JSEP off-by-one in docs/browser.md)."""
    out = length if (start, step) == (-1, -1) else "?"
    return parse(f"""
<ir_version: 8, opset_import: ["" : {opset}]>
reverse (float[1,1,1,{length}] x) => (float[1,1,1,{out}] y)
<int64[1] starts = {{{start}}}, int64[1] ends = {{{end}}}, int64[1] axes = {{3}}, int64[1] steps = {{{step}}}>
{{
    y = Slice(x, starts, ends, axes, steps)
}}""")


def positive_slice_model() -> onnx.ModelProto:
    return parse("""
<ir_version: 8, opset_import: ["" : 17]>
crop (float[2,9] x) => (float[2,7] y)
<int64[1] starts = {1}, int64[1] ends = {-1}, int64[1] axes = {1}, int64[1] steps = {1}>
{
    y = Slice(x, starts, ends, axes, steps)
}""")


def decoder_head_model(frames: int = 6, stale: bool = True) -> onnx.ModelProto:
    """A Vocos/WavTokenizer ISTFT head: ConvTranspose overlap-add -> Squeeze -> envelope Div/Where -> Mul.

    With `stale`, the Squeeze output carries a 3-D value_info over its 1-D result (seed bug 2).
    """
    bins, hop, window = 8, 4, 16
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((bins, 1, window)).astype(np.float32) * 0.3
    length = (frames - 1) * hop + window
    envelope = np.zeros(length, np.float32)
    hann = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(window) / window)).astype(np.float32) ** 2
    for frame in range(frames):
        envelope[frame * hop: frame * hop + window] += hann
    stale_info = f", float[1,1,{length}] audio_1d" if stale else ""
    return parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
istft_head (float[1,{bins},{frames}] frames_in) => (float[{length}] audio)
<float[{bins},1,{window}] synthesis = {{{_floats(weight)}}}, float[{length}] envelope = {{{_floats(envelope)}}},
 int64[2] squeeze_axes = {{0, 1}}, float eps = {{1e-11}}, float zero = {{0}}, float gain = {{0.5}}{stale_info}>
{{
    overlap_added = ConvTranspose <strides = [{hop}], group = 1> (frames_in, synthesis)
    audio_1d = Squeeze(overlap_added, squeeze_axes)
    normalised = Div(audio_1d, envelope)
    covered = Greater(envelope, eps)
    masked = Where(covered, normalised, zero)
    audio = Mul(masked, gain)
}}""")


def shape_if_model(batch: int | str = 1) -> onnx.ModelProto:
    """An exporter's `if x.shape[0] == 1:` branch: the condition follows from the static batch size."""
    return parse(f"""
<ir_version: 8, opset_import: ["" : 17]>
branchy (float[{batch},4] x) => (float[{batch},4] y)
<int64[1] zero = {{0}}, int64[1] one = {{1}}>
{{
    shape = Shape(x)
    batch = Gather(shape, zero)
    is_single = Equal(batch, one)
    condition = Squeeze(is_single)
    y = If(condition) <
        then_branch = single () => (float[{batch},4] then_out) <float[1] k = {{3.0}}> {{
            scaled = Mul(x, k)
            then_out = Add(scaled, x)
        }},
        else_branch = many () => (float[{batch},4] else_out) {{
            else_out = Neg(x)
        }}
    >
}}""")


def constant_if_model() -> onnx.ModelProto:
    """An If on a constant whose taken branch holds a nested If on a constant, and a pass-through output."""
    return parse("""
<ir_version: 8, opset_import: ["" : 17]>
nested (float[3] x) => (float[3] y, float[3] z)
<bool no = {0}, bool yes = {1}>
{
    y, z = If(no) <
        then_branch = t () => (float[3] a, float[3] b) { a = Neg(x)  b = Neg(x) },
        else_branch = e () => (float[3] c, float[3] d) {
            c = If(yes) <
                then_branch = tt () => (float[3] inner) <float[1] two = {2.0}> { inner = Mul(x, two) },
                else_branch = ee () => (float[3] inner2) { inner2 = Identity(x) }
            >
            d = Identity(x)
        }
    >
}""")


def clean_conv_model() -> onnx.ModelProto:
    """No hazard of any kind: every pass must leave it alone."""
    return parse("""
<ir_version: 8, opset_import: ["" : 17]>
clean (float[1,2,5,5] x) => (float[1,2,5,5] y)
<float[2,2,3,3] w = {1,0,0,0,1,0,0,0,1, 0,1,0,1,0,1,0,1,0, 1,1,1,1,1,1,1,1,1, 0,0,0,0,2,0,0,0,0}, float[1,2,5,5] h>
{
    h = Conv <pads = [1,1,1,1]> (x, w)
    y = Relu(h)
}""")


def random_inputs(model: onnx.ModelProto, dims: dict[str, int] | None = None, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 inputs; symbolic dims take values from `dims` (default 31)."""
    rng = np.random.default_rng(seed)
    feeds = {}
    initializers = {i.name for i in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = [d.dim_value if d.HasField("dim_value") else (dims or {}).get(d.dim_param, 31) for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def run_host(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # stale-shape models warn on purpose
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _bytes(model: onnx.ModelProto) -> bytes:
    return model.SerializeToString(deterministic=True)


def assert_repair(name: str, model: onnx.ModelProto, dims: dict[str, int] | None = None) -> onnx.ModelProto:
    """Run registered repair `name`: it must change the model, keep its numbers, leave its input
    alone and be idempotent. Returns the repaired model."""
    repair = repairs.get(name)
    before = _bytes(model)
    result = repair(model)
    assert _bytes(model) == before, "the pass mutated its input"
    assert result.changed and result.records
    onnx.checker.check_model(result.model)
    feeds = random_inputs(model, dims)
    for expected, actual in zip(run_host(model, feeds), run_host(result.model, feeds), strict=True):
        assert expected.shape == actual.shape
        np.testing.assert_array_equal(expected, actual)
    again = repair(result.model)
    assert not again.changed and again.records == []
    assert _bytes(again.model) == _bytes(result.model)
    return result.model


def assert_no_op(name: str, model: onnx.ModelProto) -> None:
    """Registered repair `name` leaves a model without its pattern as it is, and finds nothing to repair in it."""
    repair = repairs.get(name)
    result = repair(model)
    assert not result.changed and result.records == []
    assert _bytes(result.model) == _bytes(model)
    assert not [h for h in repair.find(model) if h["repair"] == name]
