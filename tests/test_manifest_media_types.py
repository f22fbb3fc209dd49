"""One media-type table for the manifest, the local servers and publishing."""

from pipeline.media_types import content_type, media_type


def test_listed_types_come_from_the_extension():
    assert media_type("ort/ort-wasm-simd-threaded.0123456789abcdef.wasm") == "application/wasm"
    assert media_type("loader/load.js") == "text/javascript"
    assert media_type("model.fp16.0123456789abcdef.onnx") == "application/octet-stream"
    assert media_type("notes.unknown") == "application/octet-stream"


def test_browsers_strict_types_win_over_a_manifest_and_others_follow_it():
    assert content_type("ort/x.wasm", "application/octet-stream") == "application/wasm"
    assert content_type("loader.js", "text/plain") == "text/javascript"
    assert content_type("model.onnx", "application/x-onnx") == "application/x-onnx"
    assert content_type("loader.d.ts", None) == "text/plain; charset=utf-8"
    assert content_type("weights.part0.bin", "") == "application/octet-stream"
