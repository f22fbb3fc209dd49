"""fp16 of the flagship architectures at the published models' REAL input sizes (issue 22, "Proven by").

tests/data/flagship_real/ holds LaMa 512², MI-GAN 512², HTDemucs at its 7.8 s stereo chunk, MDX at
its [4, 3072, 256] STFT and Vocos at 256 mel frames (3 s), with reduced widths and random weights
(tests/data/generators/make_flagship_real_size.py). Each is built once (module scope) with its recipe
and `--no-browser`: the host checks, then the webgpu-kernels stage as a node audit (forced for every
model by PACK_WEBGPU_KERNELS_MAX_GMAC=0: each node at its real shapes on lavapipe's WebGPU kernels,
cut to a few outputs with full accumulation depth). Each package must ship a verified fp16 variant,
with the nodes kept in fp32 listed with their cost. The table in docs/precision.md comes from the
same builds (scripts/bench/measure_flagship_real_size.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import pytest

from pipeline.assets.package import max_file_bytes
from pipeline.recipe import RECIPES_DIR, load_recipe_file
from pipeline.verify.engines import webgpu_kernels

DATA = Path(__file__).resolve().parent / "data" / "flagship_real"
CASES = {name: case for name, case in json.loads((DATA / "cases.json").read_text()).items() if not name.startswith("_")}
REASON = webgpu_kernels.unavailable_reason()
needs_kernels = pytest.mark.skipif(REASON is not None, reason=f"webgpu-kernels not available: {REASON}")


def _sums() -> dict[str, str]:
    return {name: sha for sha, name in (line.split() for line in (DATA / "SHA256SUMS").read_text().splitlines() if line.strip())}


def test_the_committed_exports_are_small_and_listed():
    sums = _sums()
    assert sorted(sums) == sorted(f"{name}.onnx" for name in CASES) == sorted(p.name for p in DATA.glob("*.onnx"))
    for name, sha in sums.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == sha, f"{name} changed: re-run make_flagship_real_size.py and update SHA256SUMS"
        assert (DATA / name).stat().st_size < 2_000_000


@pytest.mark.parametrize("name", sorted(CASES))
def test_exports_take_the_real_input_sizes_with_the_recipe_io(name):
    model = onnx.load(str(DATA / f"{name}.onnx"))
    recipe = load_recipe_file(RECIPES_DIR / f"{CASES[name]['recipe']}.toml")
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input}
    assert shapes == {arg.split("=")[0]: [int(n) for n in arg.split("=")[1].split("x")] for arg in CASES[name]["inputs"]}
    assert set(shapes) == set(recipe.inputs) and {o.name for o in model.graph.output} == set(recipe.outputs)
    for input_name, spec in recipe.inputs.items():
        if spec.shape:  # a recipe that states the published size: the export has it
            assert list(spec.shape) == shapes[input_name]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """name -> (exit code, report, manifest, summary), each model built once, on demand."""
    from typer.testing import CliRunner

    from pipeline.cli import app

    sys_path = str(Path(__file__).resolve().parent.parent / "scripts" / "bench")
    import sys

    sys.path.insert(0, sys_path)
    try:
        from measure_flagship_real_size import build_args
    finally:
        sys.path.remove(sys_path)
    results: dict[str, tuple] = {}
    patch = pytest.MonkeyPatch()
    patch.setenv("PACK_WEBGPU_KERNELS_MAX_GMAC", "0")  # the node audit for every model, as for the real ones
    folder = tmp_path_factory.mktemp("flagship-real")
    patch.chdir(folder)  # a built-in recipe's lock is ./pack.lock.json

    def build(name: str) -> tuple:
        if name not in results:
            out = folder / "dist"
            result = CliRunner().invoke(app, build_args(name, out))
            report = json.loads(result.stdout) if result.stdout.startswith("{") else {}
            package = out / CASES[name]["recipe"]
            manifest = json.loads((package / "manifest.json").read_text()) if (package / "manifest.json").exists() else {}
            results[name] = (result.exit_code, report, manifest, result.output)
        return results[name]

    yield build
    patch.undo()


@needs_kernels
@pytest.mark.slow  # the build behind each: 10-45 s
@pytest.mark.parametrize("name", sorted(CASES))
def test_fp16_at_real_size_is_verified_on_the_host_and_by_the_node_audit(name, built):
    code, report, manifest, output = built(name)
    failed = [(c["stage"], c["variant"], c.get("output"), c.get("detail")) for c in report.get("checks", []) if c["status"] == "failed"]
    assert code == 0 and not failed, failed or output[-3000:]
    assert not report.get("refused"), report.get("refused")
    fp16 = [c for c in report["checks"] if c["variant"] == "fp16" and c["stage"] in ("host", "webgpu-kernels")]
    recipe = load_recipe_file(RECIPES_DIR / f"{CASES[name]['recipe']}.toml")
    assert {c["output"] for c in fp16 if c["stage"] == "host"} == set(recipe.outputs)
    assert {c["status"] for c in fp16} == {"passed"}, [(c["stage"], c.get("output"), c["status"], c.get("detail")) for c in fp16]
    # the webgpu-kernels verdict is the node audit's, at the real shapes
    audit = report["webgpu_kernels"]["runs"]["fp16"]["audit"]
    assert audit["nodes"] > 0 and audit["failed"] == 0
    assert "node audit of" in next(c for c in fp16 if c["stage"] == "webgpu-kernels")["detail"]
    verification = {(r["stage"], r["ep"], r["variant"]): r["status"] for r in manifest["verification"]["runs"]}
    assert verification[("host", "*", "fp16")] == "passed" and verification[("webgpu-kernels", "webgpu", "fp16")] == "passed", verification


@needs_kernels
@pytest.mark.parametrize("name", sorted(CASES))
def test_nodes_kept_in_fp32_are_listed_with_their_cost(name, built):
    code, report, manifest, output = built(name)
    kept = (manifest.get("fp16") or {}).get("keptFp32", [])
    step = next((s for s in report["steps"] if s["name"] == "fp16_keep_fp32"), None)
    if not kept:
        assert step is None or not step.get("changed"), step
        return
    assert all(k["node"] and k["op"] and k["why"] for k in kept)
    listed = json.dumps(step)  # each kept node, and the cost of their fp32 weights (sizes)
    assert all(k["node"] in listed for k in kept) and "all_fp16_ideal_bytes" in listed, listed[:2000]


@needs_kernels
def test_no_real_size_package_lists_a_file_over_the_host_cap(built):
    """[assets] max_file_mib (default 19: under jsDelivr's 20 MB) on the same builds: no listed file is
    larger, and HTDemucs' sample at its real size (its 7.8 s inputs and both outputs, ~68 MB) and
    the webgpu runtime's .wasm ship in parts, listed instead of the whole."""
    cap = max_file_bytes(load_recipe_file(RECIPES_DIR / "htdemucs.toml"))
    for name in sorted(CASES):
        code, report, manifest, output = built(name)
        assert code == 0, output[-3000:]
        over = {path: entry["size"] for path, entry in manifest["files"].items() if entry["size"] > cap}
        assert not over, (name, over)
    manifest = built("htdemucs")[2]
    split = manifest["split"]
    sample = split[manifest["sample"]["file"]]
    assert sample["size"] > 3 * cap and len(sample["parts"]) >= 4, sample
    assert any(path.startswith("ort/") and path.endswith(".wasm") for path in split), sorted(split)
    assert not set(split) & set(manifest["files"])


@needs_kernels
def test_htdemucs_keeps_its_chunk_standardisation_and_time_decoder_in_fp32_without_a_trial(built):
    """Two WebGPU kernel hazards kept in fp32 up front (precision/kernel_hazards.py), so the fp16
    that ships is right on WebGPU: the mean and std over the whole 7.8 s chunk (687960 values: fp16
    ReduceMean gives 0), and the time decoder's four stride-4 ConvTransposes up to 344064 samples
    (fp16 counts their positions wrongly past 2048; the node audit passed the two large ones, cut to
    their first positions, and an H200 failed that fp16 at 0.099 of the range)."""
    code, report, manifest, output = built("htdemucs")
    kept = manifest["fp16"]["keptFp32"]
    reductions = [k for k in kept if k["op"] == "ReduceMean"]
    assert len(reductions) >= 2 and all("687960" in k["why"] for k in reductions), kept
    upsamplings = {k["node"]: k["why"] for k in kept if k["op"] == "ConvTranspose"}
    assert set(upsamplings) == {"node_convolution", "node_convolution_1", "node_convolution_2", "node_convolution_3"}, kept
    assert all("known WebGPU kernel hazard" in why and "stride 4" in why for why in upsamplings.values())


@needs_kernels
def test_htdemucs_keeps_the_attention_matmuls_the_node_audit_fails_found_in_few_trials(built):
    """HTDemucs is over the whole-run limit, so the fp16 search is judged by the node audit: it
    fails the attention's P·V MatMuls (softmax weights over K = 1344-2688 tokens, a sum of positive
    terms whose fp16 running sum drifts) and the search keeps them in fp32 without bisecting: one
    trial judges the audit's nodes kept, re-running only the nodes whose precision changed."""
    code, report, manifest, output = built("htdemucs")
    step = next(s for s in report["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]
    search = step["search"]
    named = {n["node"]: n for n in search["node_failures"]}
    attention = [n for n in named.values() if n["op"] == "MatMul" and "scaled_dot_product_attention" in n["node"]]
    assert attention and all(n["evaluator"] == "webgpu-kernels" and "node audit" in n["why"] for n in attention), search["node_failures"]
    kept = {k["node"] for k in manifest["fp16"]["keptFp32"]}
    assert set(named) <= kept, (sorted(named), sorted(kept))
    assert search["minimal"] and not search.get("failed") and search["trials"] <= 3, search
    assert "webgpu-kernels" in search["evaluators"]
