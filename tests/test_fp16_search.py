"""Threshold failures become a search for nodes to keep in fp32, and a lock makes the next build
apply them without searching."""

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from pipeline.cli import app
from pipeline.graph.model_io import model_bytes
from pipeline.lockfile import LockFile, lock_for
from pipeline.precision.ranking import rank_nodes
from pipeline.precision.search import search_keep_set
from pipeline.recipe import Recipe
from pipeline.verify.engines.host import run_model
from build_helpers import save
from fp16_models import OVERFLOW_KEPT, overflow_model

runner = CliRunner()


@pytest.fixture
def host_only_search(monkeypatch):
    """The search with the host CPU check alone: where the webgpu-kernels stage is installed its
    evaluator keeps more (see the last test), so these tests turn it off."""
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")


def _oracle(needed: set[str]):
    calls = []

    def trial(keep):
        calls.append(list(keep))
        missing = needed - set(keep)
        return not missing, f"missing {sorted(missing)}"

    return trial, calls


def test_search_finds_exactly_the_needed_nodes_in_few_trials():
    ranked = [f"n{i}" for i in range(500)]
    needed = {"n1", "n4", "n37"}
    trial, calls = _oracle(needed)
    result = search_keep_set(ranked, trial, max_trials=60, max_seconds=60)
    assert result.passed and result.minimal and set(result.kept) == needed
    assert result.trials == len(calls) <= 3 * 2 * 9 + 2  # ~2·m·log2(k), against 500 node-by-node
    # Minimal: dropping any one kept node fails.
    for node in result.kept:
        assert not trial([n for n in result.kept if n != node])[0]


def test_search_stops_at_its_budgets_and_says_so():
    ranked = [f"n{i}" for i in range(100)]
    trial, _ = _oracle({"n3", "n60", "n90"})
    result = search_keep_set(ranked, trial, max_trials=4, max_seconds=60)
    assert result.trials == 4 and not result.minimal and "trial budget (4)" in result.stopped
    assert result.passed and {"n3", "n60", "n90"} <= set(result.kept)  # the best passing set so far
    never, _ = _oracle({"absent"})
    failed = search_keep_set(ranked, never, max_trials=10, max_seconds=60)
    assert not failed.passed and failed.trials == 1 and "still misses" in failed.stopped


def test_a_search_whose_proven_nodes_are_already_unacceptable_stops_there_and_an_acceptable_one_is_unchanged():
    """Every passing result contains the nodes proven needed so far: once they alone are too dear
    (`hopeless`), the search fails at once with that reason; a test that never fires changes nothing."""
    ranked = [f"n{i}" for i in range(500)]
    trial, _ = _oracle({"n1", "n4", "n37"})
    full = search_keep_set(ranked, trial, max_trials=60, max_seconds=60)
    checked = []

    def too_dear(nodes):
        checked.append(list(nodes))
        return "n37 keeps too many weights" if "n37" in nodes else None

    stopped = search_keep_set(ranked, trial, max_trials=60, max_seconds=60, hopeless=too_dear)
    assert not stopped.passed and stopped.kept == [] and stopped.stopped == "n37 keeps too many weights"
    assert stopped.trials < full.trials and checked == [["n37"]]  # n37 is the first node proven needed
    same = search_keep_set(ranked, trial, max_trials=60, max_seconds=60, hopeless=lambda nodes: None)
    assert (same.passed, same.kept, same.trials, same.minimal) == (full.passed, full.kept, full.trials, full.minimal)


def test_the_weight_floor_of_a_kept_set_never_exceeds_what_its_conversion_costs():
    """The early stop is sound only if the floor is a floor: each kept node's weights stay fp32."""
    from build_helpers import conv_model
    from pipeline.precision.fp16 import convert_with_keeps
    from pipeline.precision.kept_nodes import _sizes, kept_weight_floor

    model = conv_model(channels=16)
    for keep in (["conv1"], ["conv2"], ["conv1", "relu"], ["conv1", "conv2"]):
        converted = convert_with_keeps(model, keep={name: "test" for name in keep}).model
        floor = kept_weight_floor(model, keep)
        assert 0 < floor <= _sizes(model, converted)["kept_cost_bytes"], keep
    assert kept_weight_floor(model, ["conv1", "conv2"]) == (16 * 3 * 9 + 3 * 16 * 9) * 4 // 2
    assert kept_weight_floor(model, ["relu"]) == 0


def test_all_kept_but_one_proves_a_hopeless_search_and_never_an_acceptable_one():
    """A node whose absence from the whole pool fails is in every passing set: once such nodes
    alone cost more than half of fp16's saving, no search can succeed. Where an acceptable set
    exists (conv1 alone: exactly half the saving), the probes prove nothing."""
    from build_helpers import conv_model
    from pipeline.precision.kept_nodes import _all_kept_but_one, kept_weight_floor

    model = conv_model(channels=16)  # each Conv's weights: 1728 B, 864 B over fp16
    limit = 864

    def hopeless(nodes):
        floor = kept_weight_floor(model, nodes)
        return f"stopped early: {floor} B" if floor > limit else None

    pool = ["conv1", "relu", "conv2"]
    both, calls = _oracle({"conv1", "conv2"})
    assert _all_kept_but_one(model, pool, both, hopeless) == "stopped early (all kept but one, 2 trials): 1728 B"
    assert calls == [["relu", "conv2"], ["conv1", "relu"]]  # the heaviest first, each with every other node kept
    one, calls = _oracle({"conv1"})
    assert _all_kept_but_one(model, pool, one, hopeless) is None and len(calls) == 2
    assert search_keep_set(pool, one, max_trials=10, max_seconds=60, hopeless=hopeless).kept == ["conv1"]


def test_ranking_puts_the_overflow_then_the_cancellation_and_its_producers_first():
    ranked = rank_nodes(overflow_model(), {"x": np.linspace(-1, 1, 64, dtype=np.float32)[None]}, lambda path, feeds: run_model(path, feeds).outputs)
    assert ranked[0].node == "energy_sum" and "65504" in ranked[0].why
    assert {stat.node for stat in ranked[1:4]} == {"dc_remove", "pcm_scale", "dc_est"}
    assert "smaller than its inputs" in next(s.why for s in ranked if s.node == "dc_remove")


def test_lock_location_follows_the_contract(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert lock_for(Recipe(name="m", path=None), None).path is None
    assert lock_for(Recipe(name="m", path=tmp_path / "x.toml"), None).path == tmp_path / "x.lock.json"
    assert lock_for(Recipe(name="m", path=None), tmp_path / "l.json").path == tmp_path / "l.json"
    lock = LockFile(tmp_path / "l.json")
    lock.put("m", "fp16", {"b": 1, "a": [2]})
    lock.put("m", "source", {"uri": "u"})
    assert lock.get("m", "fp16") == {"a": [2], "b": 1} and lock.get("other", "fp16") is None
    text = (tmp_path / "l.json").read_text()
    assert json.loads(text)["schema"] == 1 and text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    LockFile(None).put("m", "fp16", {"a": 1})  # no path: nothing written


def _recipe(folder: Path, model_file: Path, search: bool = True) -> Path:
    recipe = folder / "energy.toml"
    recipe.write_text(
        f'name = "energy"\nsource = {{ uri = "{model_file.name}" }}\n'
        f'[inputs.x]\nrange = [-1.0, 1.0]\n[fp16]\nsearch = {"true" if search else "false"}\nsearch_trials = 20\nsearch_seconds = 300\n'
    )
    return recipe


def _fp16_bytes(package: Path) -> bytes:
    manifest = json.loads((package / "manifest.json").read_text())
    return (package / manifest["variants"]["fp16"]["model"]).read_bytes()


def _build(recipe: Path, out: Path, *extra: str):
    return runner.invoke(app, ["build", str(recipe), "--no-browser", "--json", "--out", str(out), *extra])


def test_overflow_model_fails_without_search_and_passes_with_it_and_the_lock_skips_the_search(tmp_path, monkeypatch, host_only_search):
    model_file = save(overflow_model(), tmp_path / "energy.onnx")
    plain = _build(_recipe(tmp_path, model_file, search=False), tmp_path / "plain")
    assert plain.exit_code == 0  # fp16 refused, fp32 ships
    failed = [c for c in json.loads(plain.stdout)["checks"] if c["status"] == "failed"]
    assert {c["output"] for c in failed} == {"pcm", "energy"} and all(c["variant"] == "fp16" for c in failed)
    assert [item["variant"] for item in json.loads(plain.stdout)["refused"]] == ["fp16"] * len(json.loads(plain.stdout)["refused"])
    assert not (tmp_path / "energy.lock.json").exists()

    recipe = _recipe(tmp_path, model_file)
    first = _build(recipe, tmp_path / "a")
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    step = next(s for s in report["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]
    assert sorted(k["node"] for k in step["kept"]) == OVERFLOW_KEPT
    assert step["search"]["trials"] <= 10 and step["search"]["minimal"]
    assert 0 < step["sizes"]["fp16_bytes"] < step["sizes"]["fp32_bytes"]
    manifest = json.loads((tmp_path / "a" / "energy" / "manifest.json").read_text())
    assert sorted(k["node"] for k in manifest["fp16"]["keptFp32"]) == OVERFLOW_KEPT
    lock = json.loads((tmp_path / "energy.lock.json").read_text())
    assert sorted(k["node"] for k in lock["energy"]["fp16"]["kept"]) == OVERFLOW_KEPT

    def no_search(*args, **kwargs):
        raise AssertionError("searched although the lock holds the answer")

    monkeypatch.setattr("pipeline.precision.kept_nodes.search_keep_set", no_search)
    monkeypatch.setattr("pipeline.precision.kept_nodes.rank_nodes", no_search)
    again = _build(recipe, tmp_path / "b", "--no-reuse")  # built, not the package stored under the lock's key
    assert again.exit_code == 0, again.output
    assert _fp16_bytes(tmp_path / "b" / "energy") == _fp16_bytes(tmp_path / "a" / "energy")
    lock_step = next(s for s in json.loads(again.stdout)["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]
    assert lock_step["lock"].startswith("applied energy.lock.json")

    # Another model under the same recipe: the lock no longer applies, and says so in one line.
    save(overflow_model(seed=1), model_file)
    monkeypatch.undo()
    changed = _build(recipe, tmp_path / "c")
    assert changed.exit_code == 0, changed.output
    note = next(s for s in json.loads(changed.stdout)["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]["lock"]
    assert "for another model" in note and "\n" not in note
    new_sha = hashlib.sha256(model_bytes(overflow_model(seed=1))).hexdigest()
    assert json.loads((tmp_path / "energy.lock.json").read_text())["energy"]["fp16"]["model_sha256"] != lock["energy"]["fp16"]["model_sha256"]
    assert new_sha  # the lock now records the new model's hash (computed on the named graph)


@pytest.mark.parametrize("key, value, message", [
    ("search_trials", "0", "fp16.search_trials"),
    ("search_seconds", '"x"', "fp16.search_seconds"),
    ("keep_nodes", "[1]", "fp16.keep_nodes"),
    ("search", "3", "fp16.search"),
])
def test_fp16_recipe_keys_are_validated_with_the_key_named(tmp_path, key, value, message):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "r"\nsource = {{ uri = "m.onnx" }}\n[fp16]\n{key} = {value}\n')
    result = runner.invoke(app, ["build", str(recipe), "--no-browser"])
    assert result.exit_code == 2 and message in result.output


def test_search_runs_against_every_evaluator_and_the_summary_lists_the_kept_nodes(tmp_path, host_only_search):
    """The evaluator list is the seam for the WebGPU-kernel check: here a stand-in for fp16
    kernels (which overflow where onnxruntime CPU computes in fp32) also requires `energy_sum` in
    fp32, and the search keeps both nodes."""
    import onnx

    from pipeline.commands.summary import fp16_kept_lines
    from pipeline.precision.kept_nodes import Evaluator, Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators
    model = overflow_model()
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 64)).astype(np.float32)}
    reference_file = save(model, tmp_path / "ref.onnx")
    recipe = Recipe(name="energy", path=tmp_path / "energy.toml")

    def fp16_kernels(path):
        graph = onnx.shape_inference.infer_shapes(onnx.load(str(path))).graph
        types = {v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.output]}
        energy = next(node for node in graph.node if node.name == "energy_sum")
        in_fp32 = types.get(energy.input[0]) == onnx.TensorProto.FLOAT
        return in_fp32, "passed" if in_fp32 else "energy: 1 Inf values that the reference does not have"

    evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
    assert [e.name for e in evaluators] == ["host cpu"]  # no webgpu-kernels stage on this machine
    evaluators.append(Evaluator("fp16-kernels stand-in", fp16_kernels))
    lock = LockFile(tmp_path / "energy.lock.json")
    context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, lock, Progress.quiet())
    made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
    report, variants = {"steps": made.steps}, made.variants
    fp16 = next(v for v in variants if v.name == "fp16")
    assert sorted(k["node"] for k in fp16.kept_fp32) == ["dc_est", "energy_sum"]
    lines = fp16_kept_lines(report)
    assert lines[0].startswith("  fp16: 2 nodes kept in fp32; weights")
    assert any("kept energy_sum (ReduceSumSquare): search: values up to" in line for line in lines)
    assert any("trials" in line and "host cpu, fp16-kernels stand-in" in line and "minimal" in line for line in lines)


def test_a_kept_set_that_loses_most_of_the_saving_is_not_an_fp16_variant(tmp_path, host_only_search):
    """max_abs = 0 passes only with every Conv in fp32: an "fp16" model of fp32 size. The search
    says so and fp16 keeps failing its host check."""
    from build_helpers import conv_model

    save(conv_model(), tmp_path / "conv.onnx")
    recipe = tmp_path / "strict.toml"
    recipe.write_text('source.uri = "conv.onnx"\n[outputs.y.fp16]\nmax_abs = 0.0\n')
    result = _build(recipe, tmp_path / "out")
    assert result.exit_code == 0  # fp16 refused; fp32 serves every chain
    report = json.loads(result.stdout)
    assert any(item["variant"] == "fp16" for item in report["refused"])
    search = next(s for s in report["steps"] if s["name"] == "fp16_keep_fp32")["records"][0]["search"]
    # both Convs are needed: once both are proven, their weights are all of fp16's saving
    assert search["failed"].startswith("stopped early (all kept but one, 2 trials): the 2 nodes proven needed keep at least 432 B") and "more than half of fp16's saving" in search["failed"]
    # the figure of what no cheap kept set fixes: the weights' own rounding
    assert search["diagnosis"] and all("weight rounding alone costs" in line and "on `y`" in line for line in search["diagnosis"])
    assert not (tmp_path / "strict.lock.json").exists()


def test_a_bare_models_lock_goes_to_the_cache_and_the_summary_names_it(tmp_path, monkeypatch, host_only_search):
    monkeypatch.chdir(tmp_path)
    model_file = save(overflow_model(), tmp_path / "energy.onnx")
    args = ["build", str(model_file), "--no-browser", "--input", "x=1x64"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    # nothing written outside --out and the cache (issue 28): the kept nodes go to the cache's locks/
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a", "energy.onnx"]
    cached = Path(os.environ["PACK_CACHE_DIR"]) / "locks" / "energy.lock.json"
    assert f"  lock {cached}" in result.output.splitlines()
    assert [k["node"] for k in json.loads(cached.read_text())["energy"]["fp16"]["kept"]] == OVERFLOW_KEPT
    lock = tmp_path / "locks" / "energy.json"
    result = runner.invoke(app, [*args, "--json", "--out", str(tmp_path / "b"), "--lock", str(lock), "--no-reuse"])  # a reused build writes no lock
    assert result.exit_code == 0, result.output
    assert [k["node"] for k in json.loads(lock.read_text())["energy"]["fp16"]["kept"]] == OVERFLOW_KEPT


def test_search_on_the_webgpu_kernel_check_keeps_what_fp16_kernels_need(tmp_path):
    """Issue 11 must-have 5 with the real `webgpu-kernels` stage (onnxruntime's WebGPU EP on
    lavapipe), where it is set up: fp16 kernels overflow in ReduceSumSquare, which the CPU EP
    computes in fp32, so the search keeps `energy_sum` as well as the clamped constant."""
    webgpu_kernels = pytest.importorskip("pipeline.verify.engines.webgpu_kernels")
    reason = webgpu_kernels.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators
    from fp16_models import OVERFLOW_KEPT_FP16_KERNELS

    model = overflow_model()
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 64)).astype(np.float32)}
    reference_file = save(model, tmp_path / "ref.onnx")
    recipe = Recipe(name="energy", path=None)
    evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
    assert [e.name for e in evaluators] == ["host cpu", "webgpu-kernels"]
    context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, LockFile(None), Progress.quiet())
    made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
    report, variants = {"steps": made.steps}, made.variants
    assert sorted(k["node"] for k in next(v for v in variants if v.name == "fp16").kept_fp32) == OVERFLOW_KEPT_FP16_KERNELS


def _long_accumulation_model():
    """A P·V-style MatMul of two activations over K = 4096 positive terms (no weights: keeping it
    in fp32 costs casts only; fp16 accumulation drifts past the audit's bound on lavapipe), beside
    a Conv that carries the weights fp16 halves."""
    from onnx import TensorProto, helper, numpy_helper

    cw = np.random.default_rng(2).standard_normal((32, 16, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["p", "v"], ["pv"], name="long_matmul"),
        helper.make_node("Relu", ["pv"], ["y"], name="relu"),
        helper.make_node("Conv", ["img", "cw"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(nodes, "long_accumulation", [
        helper.make_tensor_value_info("p", TensorProto.FLOAT, [4, 4096]),
        helper.make_tensor_value_info("v", TensorProto.FLOAT, [4096, 16]),
        helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 16, 16, 16]),
    ], [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 16]), helper.make_tensor_value_info("conv", TensorProto.FLOAT, [1, 32, 16, 16])],
        [numpy_helper.from_array(cw, "cw")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_over_the_whole_run_limit_the_node_audit_judges_the_search(tmp_path, monkeypatch):
    """A model over the whole-run limit (forced: PACK_WEBGPU_KERNELS_MAX_GMAC=0) passes fp16 on the
    host, and its whole run on WebGPU kernels is not verifiable: without the node audit as an
    evaluator no search starts and the stage's audit fails the long MatMul; with it, the audit
    names the MatMul, the search keeps it in fp32 (without bisecting) and the stage passes fp16."""
    webgpu_kernels = pytest.importorskip("pipeline.verify.engines.webgpu_kernels")
    if webgpu_kernels.unavailable_reason():
        pytest.skip(webgpu_kernels.unavailable_reason())
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators, webgpu_kernel_checks
    from pipeline.verify.judgement.thresholds import threshold_for

    monkeypatch.setenv("PACK_WEBGPU_KERNELS_MAX_GMAC", "0")
    monkeypatch.setenv("PACK_CACHE_DIR", str(tmp_path / "cache"))  # conversions: each arm from scratch
    model = _long_accumulation_model()
    rng = np.random.default_rng(3)
    feeds = {"p": rng.uniform(0, 1, (4, 4096)).astype(np.float32), "v": rng.uniform(0, 1, (4096, 16)).astype(np.float32),
             "img": rng.standard_normal((1, 16, 16, 16)).astype(np.float32)}
    reference_file = save(model, tmp_path / "fp32.onnx")
    reference = run_model(reference_file, feeds).outputs
    recipe = Recipe(name="accumulate", path=None)

    def fp16_on_the_stage(with_audit: bool) -> tuple[dict, list[dict]]:
        evaluators = fp16_evaluators(lambda: reference, feeds, recipe, model if with_audit else None)
        context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, LockFile(None), Progress.quiet())
        made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
        fp16 = next(v for v in made.variants if v.name == "fp16")
        path = save(fp16.model, tmp_path / f"fp16-{with_audit}.onnx")
        thresholds = {"fp16": {o: threshold_for("tensor", "fp16", "webgpu") for o in reference}}
        checks, _ = webgpu_kernel_checks({"fp16": path}, reference, feeds, thresholds, {}, Progress.quiet(), reference_model=reference_file)
        return checks[0], made.steps

    check, steps = fp16_on_the_stage(with_audit=False)
    assert check["status"] == "failed" and check["node"] == "long_matmul" and "node audit of" in check["detail"], check
    assert not [s for s in steps if s["name"] == "fp16_keep_fp32"]  # no search started

    check, steps = fp16_on_the_stage(with_audit=True)
    assert check["status"] == "passed" and "node audit of" in check["detail"], check
    record = next(s for s in steps if s["name"] == "fp16_keep_fp32")["records"][0]
    assert [k["node"] for k in record["kept"]] == ["long_matmul"]
    search = record["search"]
    assert [(n["node"], n["evaluator"]) for n in search["node_failures"]] == [("long_matmul", "webgpu-kernels")]
    assert "K = 4096" in search["node_failures"][0]["why"] or "4096" in search["node_failures"][0]["why"]
    assert search["minimal"] and search["trials"] == 1 and "failed" not in search, search  # one trial: the named node kept


@pytest.mark.slow
def test_a_failure_only_the_webgpu_kernels_show_is_ranked_and_searched_there(tmp_path):
    """Issue 26 must-have 4: the loudness head passes the host (the CPU EP computes fp16 in fp32)
    and is NaN on fp16 WebGPU kernels; the nodes whose fp16 output turns NaN/Inf there, against the
    fp32 intermediates, rank first, and the search keeps what fixes it."""
    webgpu_kernels = pytest.importorskip("pipeline.verify.engines.webgpu_kernels")
    if webgpu_kernels.unavailable_reason():
        pytest.skip(webgpu_kernels.unavailable_reason())
    from pipeline.precision.fp16 import convert_with_keeps
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.ranking import divergent_nodes
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators
    from fp16_models import loudness_model

    model, feeds = loudness_model()
    host = lambda path, f: run_model(path, f).outputs  # noqa: E731
    on_webgpu = lambda path, f: webgpu_kernels.run_on_webgpu(path, f).outputs  # noqa: E731
    plain = convert_with_keeps(model).model
    ranked = divergent_nodes(model, plain, feeds, host, on_webgpu)
    assert {stat.node for stat in ranked[:2]} == {"square", "loud_e2"}, [(s.node, s.why) for s in ranked]
    assert all("NaN or Inf" in stat.why for stat in ranked[:2])
    assert "loud_e2" not in {stat.node for stat in divergent_nodes(model, plain, feeds, host, host)}  # the CPU EP hides it

    reference_file = save(model, tmp_path / "ref.onnx")
    recipe = Recipe(name="loudness", path=None)
    evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
    context = Fp16Context(feeds, host, evaluators, LockFile(None), Progress.quiet())
    made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
    fp16 = next(v for v in made.variants if v.name == "fp16")
    kept = {k["node"]: k["why"] for k in fp16.kept_fp32}
    assert "loud_e2" in kept and kept["loud_e2"].startswith("search: webgpu-kernels: its fp16 output turns NaN or Inf")
    record = next(s for s in made.steps if s["name"] == "fp16_keep_fp32")["records"][0]
    assert record["search"]["ranked"][0]["why"].startswith("webgpu-kernels: its fp16 output turns NaN or Inf")


def test_the_search_ranks_and_keeps_nodes_inside_an_if_branch(tmp_path, host_only_search):
    """Issue 37: a head behind an If gave the search the If node alone as a candidate (keeping it
    fp32 leaves its branch's nodes fp16). Its branch's nodes are ranked from one run that exposes
    their values through the If, and the search keeps the one node inside the branch that needs fp32."""
    from fp16_models import overflow_in_if_model
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators

    model = overflow_in_if_model()
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 64)).astype(np.float32), "use_head": np.array(True)}
    run = lambda path, f: run_model(path, f).outputs  # noqa: E731
    ranked = [stat.node for stat in rank_nodes(model, feeds, run)]
    assert {"dc_remove", "pcm_scale", "dc_est"} == set(ranked[:3])  # the branch's cancellation, as in the main graph
    # the branch that does not run ranks none of its nodes
    assert "silence" not in ranked and "silence" in [stat.node for stat in rank_nodes(model, {**feeds, "use_head": np.array(False)}, run)]
    reference_file = save(model, tmp_path / "ref.onnx")
    recipe = Recipe(name="head", path=tmp_path / "head.toml")
    evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
    context = Fp16Context(feeds, run, evaluators, LockFile(tmp_path / "head.lock.json"), Progress.quiet())
    made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
    fp16 = next(v for v in made.variants if v.name == "fp16")
    assert [k["node"] for k in fp16.kept_fp32] == OVERFLOW_KEPT
    assert fp16.kept_fp32[0]["op"] == "Mul"  # the kept list names the op of a node inside a branch


def test_an_output_of_another_shape_is_fixed_first_by_a_search_of_its_own(tmp_path, host_only_search):
    """Issue 37: an output whose length fp16 decides differently (a comparison flips: no rounding
    op, so decision_paths leaves it) is a failure the search fixes first, over the nodes it
    depends on, before the numeric search over the rest; the report says which outputs and nodes."""
    from fp16_models import length_by_comparison_model
    from pipeline.precision.kept_nodes import Fp16Context
    from pipeline.precision.variants import make_variants
    from pipeline.progress import Progress
    from pipeline.verify.stages import fp16_evaluators

    model = length_by_comparison_model()
    feeds = {"x": np.random.default_rng(3).uniform(-1, 1, (1, 64)).astype(np.float32), "d_in": np.array([[2, 1, 2, 1, 2, 1, 1, 1]], np.float32)}
    reference_file = save(model, tmp_path / "ref.onnx")
    assert run_model(reference_file, feeds).outputs["y_len"].shape == (3,)
    recipe = Recipe(name="length", path=tmp_path / "length.toml")
    evaluators = fp16_evaluators(lambda: run_model(reference_file, feeds).outputs, feeds, recipe)
    context = Fp16Context(feeds, lambda path, f: run_model(path, f).outputs, evaluators, LockFile(tmp_path / "length.lock.json"), Progress.quiet())
    made = make_variants(model, recipe, hashlib.sha256(model_bytes(model)).hexdigest(), context)
    search = next(s for s in made.steps if s["name"] == "fp16_keep_fp32")["records"][0]["search"]
    assert "y_len: shape [0] != expected [3]" in search["first_failure"]
    # the comparison's float input, found among the 2 candidates `y_len` depends on
    assert search["shapes_first"] == {"outputs": ["y_len"], "candidates": 2, "kept": ["scale"], "minimal": True}
    fp16 = next(v for v in made.variants if v.name == "fp16")
    kept = {k["node"]: k["why"] for k in fp16.kept_fp32}
    assert sorted(kept) == sorted([*OVERFLOW_KEPT, "scale"]) and kept["scale"].endswith("keeps the shape fp32 gives `y_len`")
