"""Chunked external data and byte-plane coding, build side (pipeline/assets/chunks.py): the
planner, the coding, the manifest's externalData, the recipe key, and `pack build` packages whose
shipped chunks reassemble to the model's weights, byte-identical on rebuild."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import brotli
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from typer.testing import CliRunner

from pipeline.assets.chunks import ALIGN, Chunk, best_coding, chunk_bytes, deinterleave, interleave, plan_chunks, runnable_model, split_external
from pipeline.assets.files import WEIGHTS_QUALITY
from pipeline.cli import app
from pipeline.errors import PackError
from pipeline.manifest import validate, variant_files
from pipeline.precision.fp16w import FLOAT16, WIDEN, widen_external_data, widen_model_bytes
from pipeline.recipe import load_recipe_file as load_recipe
from chunk_helpers import CHUNK_MIB, chunk_test_model, write_recipe


def test_byte_planes_of_fp16_and_fp32_and_back():
    halves = np.array([1.0, -2.0, 0.5], dtype=np.float16)
    planar = deinterleave(halves.tobytes(), 2)
    # low bytes first, then the high bytes (sign, exponent, top mantissa): 0x3c, 0xc0, 0x38
    assert planar == bytes([0, 0, 0, 0x3C, 0xC0, 0x38])
    assert interleave(planar, 2) == halves.tobytes()
    data = np.random.default_rng(0).standard_normal(1000).astype(np.float32).tobytes()
    for planes in (1, 2, 4, 8):
        assert interleave(deinterleave(data, planes), planes) == data


def test_planner_cuts_each_width_group_into_near_equal_aligned_chunks():
    limit = chunk_bytes(0.001)  # 1048 bytes
    assert limit == 1048 and limit % ALIGN == 0
    chunks = plan_chunks([(0, 3000, 4), (3000, 1000, 2), (4000, 6, 1)], limit)
    assert chunks == [Chunk(0, 1000, 4), Chunk(1000, 1000, 4), Chunk(2000, 1000, 4), Chunk(3000, 1000, 2), Chunk(4000, 6, 1)]
    # one chunk never spans two groups, never exceeds the limit, and the chunks cover every group
    big = plan_chunks([(0, 10_000_000, 4)], chunk_bytes(1))
    assert len(big) == 10 and max(c.size for c in big) <= chunk_bytes(1)
    assert sum(c.size for c in big) == 10_000_000 and all(c.offset % ALIGN == 0 for c in big)
    with pytest.raises(ValueError):
        plan_chunks([(0, 8, 4)], 12)


def test_split_external_groups_by_width_and_runs_like_the_model(tmp_path):
    model = chunk_test_model()
    ids = onnx.numpy_helper.from_array(np.arange(300, dtype=np.int64), "ids")
    model.graph.initializer.append(ids)  # an unused int64 initializer: its own 8-byte group first
    graph, blob, location, groups, widen_from = split_external(model, "model.fp32")
    assert widen_from is None
    assert [g[2] for g in groups] == [8, 4]
    assert groups[0] == (0, 2400, 8)
    assert location == f"model.fp32.{hashlib.sha256(blob).hexdigest()[:16]}.weights"
    # b1 (256 bytes) is under EXTERNAL_MIN_BYTES and stays in the graph
    assert {t.name for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL} == {"w0", "b0", "w1", "ids"}
    assert len(model.graph.initializer[0].raw_data) > 0  # the input model is left as it was
    (tmp_path / "model.onnx").write_bytes(graph.SerializeToString())
    (tmp_path / location).write_bytes(blob)
    x = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
    ours = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, {"x": x})[0]
    theirs = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    assert np.array_equal(ours, theirs)


def test_eight_byte_elements_get_the_plane_count_that_compresses_best():
    indices = np.tile(np.arange(33, dtype=np.int64).repeat(4), 64).tobytes()
    chosen = best_coding(memoryview(indices), Chunk(0, len(indices), 8))
    sizes = {p: len(brotli.compress(deinterleave(indices, p), quality=WEIGHTS_QUALITY)) for p in (1, 2, 8)}
    assert chosen.planes == min(sizes, key=lambda p: (sizes[p], p)) and (chosen.offset, chosen.size) == (0, len(indices))
    weights = Chunk(0, 4096, 4)
    assert best_coding(memoryview(bytes(4096)), weights) is weights  # fp32/fp16 widths are not tried


def test_recipe_key_chunk_mib_is_checked(tmp_path):
    assert load_recipe(write_recipe(tmp_path, "a", 0.25)).chunk_mib == 0.25
    assert load_recipe(write_recipe(tmp_path, "b", None)).chunk_mib == 16.0
    for bad in ("0", "-1", "1000", '"big"', "true"):
        recipe = tmp_path / "bad.toml"
        recipe.write_text(f'name = "bad"\n[source]\nuri = "chunky.onnx"\n[assets]\nchunk_mib = {bad}\n')
        with pytest.raises(PackError, match=r"bad.toml: key 'assets.chunk_mib': expected"):
            load_recipe(recipe)
    recipe.write_text('name = "bad"\n[source]\nuri = "chunky.onnx"\n[assets]\nchunk = 1\n')
    with pytest.raises(PackError, match="unknown key 'assets.chunk'"):
        load_recipe(recipe)


def _build(recipe: Path, out: Path) -> Path:
    # as tests/conftest.py chunked_packages builds (lavapipe's kernels add nothing to these checks),
    # but from scratch: a reused build would not show that chunking is deterministic
    result = CliRunner().invoke(app, ["build", str(recipe), "--no-browser", "--json", "--out", str(out)], env={"PACK_WEBGPU_KERNELS": "off", "PACK_BUILD_REUSE": "off"})
    assert result.exit_code == 0, result.output[-3000:]
    return out / recipe.stem


@pytest.fixture(scope="module")
def chunked_build(chunked_packages) -> Path:
    return chunked_packages["chunked"]


def test_big_variants_ship_as_graph_plus_coded_chunks_that_round_trip(chunked_build):
    package = chunked_build
    manifest = json.loads((package / "manifest.json").read_text())
    limit = chunk_bytes(CHUNK_MIB)
    expected = {"fp32": (3, 4), "fp16": (2, 2), "fp16w": (2, 2)}  # chunks, byte planes
    for name, (count, planes) in expected.items():
        variant = manifest["variants"][name]
        external = variant["externalData"]
        assert len(external["chunks"]) == count and {c["coding"]["planes"] for c in external["chunks"]} == {planes}, external
        # the graph ships without its weights
        graph = onnx.load(str(package / variant["model"]), load_external_data=False)
        assert all(t.data_location == onnx.TensorProto.EXTERNAL for t in graph.graph.initializer if len(t.dims) > 1)
        assert (package / variant["model"]).stat().st_size < 4096
        # the exact bytes shipped: each chunk file (and its .br copy) decodes and reassembles to the weights
        data = bytearray(external["size"])
        for chunk in external["chunks"]:
            entry = manifest["files"][chunk["file"]]
            coded = (package / chunk["file"]).read_bytes()
            assert len(coded) == entry["size"] == chunk["size"] <= limit
            assert hashlib.sha256(coded).hexdigest() == entry["sha256"]
            assert brotli.decompress((package / entry["encodings"]["br"]["path"]).read_bytes()) == coded
            data[chunk["offset"] : chunk["offset"] + chunk["size"]] = interleave(coded, planes)
        assert hashlib.sha256(data).hexdigest() == external["sha256"]
        # and the graph with them computes what the source model computes
        model_path = runnable_model(package, variant, name)
        # (fp16w: widened, as the loader widens it)
        shipped = widen_external_data(bytes(data), external["widened"]["offset"]) if name == "fp16w" else bytes(data)
        assert (model_path.parent / external["path"]).read_bytes() == shipped
        if name == "fp32":
            x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
            got = ort.InferenceSession(str(model_path)).run(None, {"x": x})[0]
            assert np.array_equal(got, ort.InferenceSession(chunk_test_model().SerializeToString()).run(None, {"x": x})[0])
    runs = {(r["stage"], r["variant"]): r["status"] for r in manifest["verification"]["runs"]}
    assert runs[("host", "fp32")] == runs[("host", "fp16")] == runs[("host", "fp16w")] == "passed"


def test_small_models_stay_one_file(chunked_packages):
    manifest = json.loads((chunked_packages["single"] / "manifest.json").read_text())
    assert all("externalData" not in v for v in manifest["variants"].values())
    assert not [name for name in manifest["files"] if ".part" in name and not name.startswith("ort/")]  # the runtime's .wasm over the host cap ships in parts (split)


def test_rebuild_writes_byte_identical_models_and_chunks(chunked_build, tmp_path):
    again = _build(chunked_build.parent.parent / "chunky.toml", tmp_path / "dist")
    shipped = lambda root: {p.name: p.read_bytes() for p in root.iterdir() if p.name.startswith("model.")}  # noqa: E731
    first, second = shipped(chunked_build), shipped(again)
    assert first.keys() == second.keys() and all(first[k] == second[k] for k in first)
    manifests = [json.loads((root / "manifest.json").read_text()) for root in (chunked_build, again)]
    assert manifests[0]["variants"] == manifests[1]["variants"]


def test_manifest_rejects_chunks_that_overlap_or_are_not_listed(chunked_build):
    manifest = json.loads((chunked_build / "manifest.json").read_text())
    overlapping = copy.deepcopy(manifest)
    overlapping["variants"]["fp32"]["externalData"]["chunks"][1]["offset"] -= 8
    with pytest.raises(PackError, match=r'key "variants.fp32.externalData.chunks\[1\].offset": .* overlaps'):
        validate(overlapping, "manifest.json")
    unlisted = copy.deepcopy(manifest)
    chunk = unlisted["variants"]["fp16"]["externalData"]["chunks"][0]["file"]
    del unlisted["files"][chunk]
    with pytest.raises(PackError, match=r"chunks\[0\].file.*is not listed in 'files'"):
        validate(unlisted, "manifest.json")
    odd = copy.deepcopy(manifest)
    odd["variants"]["fp32"]["externalData"]["chunks"][0]["coding"]["planes"] = 3
    with pytest.raises(PackError, match=r"coding.planes"):
        validate(odd, "manifest.json")


def test_a_missing_chunk_is_named_when_the_package_is_checked_again(chunked_build, tmp_path):
    import shutil

    package = shutil.copytree(chunked_build, tmp_path / "copy")
    manifest = json.loads((package / "manifest.json").read_text())
    chunk = manifest["variants"]["fp32"]["externalData"]["chunks"][2]["file"]
    (package / chunk).unlink()
    with pytest.raises(PackError, match=f"{chunk}: weight chunk of variant 'fp32' missing"):
        runnable_model(package, manifest["variants"]["fp32"], "fp32")
    (package / chunk).write_bytes(b"\0" * manifest["files"][chunk]["size"])
    with pytest.raises(PackError, match=f"{chunk}.br: does not decode to {chunk}"):
        runnable_model(package, manifest["variants"]["fp32"], "fp32")


def _wire_bytes(manifest: dict, variant: str) -> int:
    files = [manifest["files"][path] for path in variant_files(manifest["variants"][variant])]
    return sum((f["encodings"].get("br") or {"size": f["size"]})["size"] for f in files)


def test_fp16w_ships_its_fp16_bytes_in_chunks_and_widens_to_the_one_file_models_weights(chunked_packages):
    """The chunked fp16w package: graph + 2-plane fp16 chunks at the end of its external data, about
    half of fp32's bytes on the wire; widened (as the loader does it) it holds, initializer by
    initializer, the float32 bytes widen_model_bytes gives the one-file fp16w package's model, and
    computes the same outputs."""
    package, single = chunked_packages["chunked"], chunked_packages["single"]
    manifest = json.loads((package / "manifest.json").read_text())
    variant = manifest["variants"]["fp16w"]
    external = variant["externalData"]
    assert variant["widen"] == WIDEN and variant["precision"] == "fp16w"
    assert len(external["chunks"]) == 2 and {c["coding"]["planes"] for c in external["chunks"]} == {2}
    # the narrowed weights fill the tail of the external data, from widened.offset; widened they double
    widened = external["widened"]
    assert widened["offset"] % ALIGN == 0 and widened["size"] == widened["offset"] + 2 * (external["size"] - widened["offset"])
    assert external["size"] == manifest["variants"]["fp32"]["externalData"]["size"] // 2  # every weight narrowed, no other group
    graph = onnx.load(str(package / variant["model"]), load_external_data=False)
    external_tensors = [t for t in graph.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]
    assert {t.name for t in external_tensors} == {"w0", "b0", "w1"} and {t.data_type for t in external_tensors} == {FLOAT16}
    # bytes on the wire: about half of fp32's
    ratio = _wire_bytes(manifest, "fp16w") / _wire_bytes(manifest, "fp32")
    assert 0.45 < ratio < 0.55, ratio
    # what the host checks ran (and `pack verify` runs): the widened graph beside the widened data
    runnable = runnable_model(package, variant, "fp16w")
    data = (runnable.parent / external["path"]).read_bytes()
    assert len(data) == widened["size"] and hashlib.sha256(data).hexdigest() == widened["sha256"]
    ours = onnx.load(str(runnable))
    single_manifest = json.loads((single / "manifest.json").read_text())
    assert "externalData" not in single_manifest["variants"]["fp16w"]
    one_file = widen_model_bytes((single / single_manifest["variants"]["fp16w"]["model"]).read_bytes())[0]
    theirs = onnx.load_from_string(one_file)
    assert [(t.name, t.data_type, t.dims, t.raw_data) for t in ours.graph.initializer] == [(t.name, t.data_type, t.dims, t.raw_data) for t in theirs.graph.initializer]
    assert {t.data_type for t in ours.graph.initializer} == {onnx.TensorProto.FLOAT}
    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    assert np.array_equal(ort.InferenceSession(str(runnable)).run(None, {"x": x})[0], ort.InferenceSession(one_file).run(None, {"x": x})[0])
    runs = {(r["stage"], r["variant"]): r["status"] for r in manifest["verification"]["runs"]}
    assert runs[("host", "fp16w")] == "passed"


def test_a_corrupted_fp16w_chunk_is_caught_before_widening(chunked_build, tmp_path):
    import shutil

    package = shutil.copytree(chunked_build, tmp_path / "copy")
    manifest = json.loads((package / "manifest.json").read_text())
    variant = manifest["variants"]["fp16w"]
    chunk = variant["externalData"]["chunks"][1]["file"]
    original = (package / chunk).read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0x01
    (package / chunk).write_bytes(bytes(data))
    (package / f"{chunk}.br").unlink()
    with pytest.raises(PackError, match=f"{chunk}: decodes to other bytes than offset"):
        runnable_model(package, variant, "fp16w")
    # a widened layout that does not match what the weights widen to is named too
    (package / chunk).write_bytes(original)
    variant["externalData"]["widened"]["sha256"] = "0" * 64
    with pytest.raises(PackError, match="widens to other bytes than externalData.widened says"):
        runnable_model(package, variant, "fp16w")


def test_manifest_checks_the_widened_layout(chunked_build):
    manifest = json.loads((chunked_build / "manifest.json").read_text())
    validate(copy.deepcopy(manifest), "manifest.json")
    unmarked = copy.deepcopy(manifest)
    del unmarked["variants"]["fp16w"]["widen"]
    with pytest.raises(PackError, match=r'key "variants.fp16w.externalData.widened": present without \'widen\''):
        validate(unmarked, "manifest.json")
    missing = copy.deepcopy(manifest)
    del missing["variants"]["fp16w"]["externalData"]["widened"]
    with pytest.raises(PackError, match=r"widened\": missing"):
        validate(missing, "manifest.json")
    wrong = copy.deepcopy(manifest)
    wrong["variants"]["fp16w"]["externalData"]["widened"]["size"] += 2
    with pytest.raises(PackError, match=r"widened to offset \+ 2 × the rest"):
        validate(wrong, "manifest.json")
    spanning = copy.deepcopy(manifest)
    spanning["variants"]["fp16w"]["externalData"]["widened"]["offset"] = 8
    spanning["variants"]["fp16w"]["externalData"]["widened"]["size"] = 8 + 2 * (spanning["variants"]["fp16w"]["externalData"]["size"] - 8)
    with pytest.raises(PackError, match=r"chunks\[0\]\": spans externalData.widened.offset 8"):
        validate(spanning, "manifest.json")
