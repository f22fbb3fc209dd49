"""Every benchmark and measurement in scripts/bench/ runs in its smoke mode (`--smoke`: the smallest
input, one repetition) as a subprocess and prints its figures as JSON, which is parsed and checked
here: a refactor that breaks a benchmark fails this file, not the next person who measures.

The figures themselves are not judged against targets (a shared CI machine's times say little);
what is checked is that each benchmark produced the figures it exists for, and where they have a
known direction (fp16w is smaller than fp32, a broken output scores worse than fp16) that they
point the right way. Benchmarks that need Chromium carry the `browser` marker; one that needs a
tool this machine lacks (lavapipe's WebGPU, node, awscli) skips and names it."""

from __future__ import annotations

import ast
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.verify.engines import webgpu_kernels

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "scripts" / "bench"
SMOKE_TIMEOUT_S = 300  # a generous ceiling for a loaded 2-core machine; a smoke run takes seconds alone


def smoke(script: str, *args: str, json_flag: tuple[str, ...] = ("--json",)):
    """Run scripts/bench/`script` --smoke as a fresh process from the repository root; its stdout parsed as JSON."""
    command = [sys.executable, str(BENCH / script), "--smoke", *json_flag, *args]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=SMOKE_TIMEOUT_S)
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout)


def positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


SMOKE_TESTS = {}  # script name -> its test below (test_every_benchmark_has_a_smoke_test checks the folder against it)


def smoke_test(script: str):
    def register(test):
        SMOKE_TESTS[script] = test
        return test

    return register


@smoke_test("measure_flagship_real_size.py")
def test_measure_flagship_real_size_smoke(tmp_path):
    rows = smoke("measure_flagship_real_size.py", str(tmp_path / "dist"))
    assert [r["model"] for r in rows] == ["vocos"]
    row = rows[0]
    assert row["verdict"] == "verified" and 0 < row["fp16_bytes"] < row["fp32_bytes"], row
    assert positive(row["gmac"]) and positive(row["build_s"])


@smoke_test("bench_build.py")
def test_bench_build_smoke():
    figures = smoke("bench_build.py")
    assert figures["passed"] is True
    assert positive(figures["first_build_s"]) and positive(figures["noop_rebuild_s"])
    assert {"convert_s", "models_s", "files_s", "host_verify_s"} <= set(figures["timings"])
    assert "loader.js" in figures["files"] and any(path.endswith(".onnx") for path in figures["files"])
    assert all(positive(f["size"]) for f in figures["files"].values())


@smoke_test("bench_shared_cache.py")
def test_bench_shared_cache_smoke(chunked_packages):
    # chunked_packages: the session's builds leave onnxruntime-web and its brotli encodings in this
    # run's cache, which the smoke's machines start with (as CI's seed): its builds take seconds
    figures = smoke("bench_shared_cache.py", "--partial")
    (row,) = figures["targets"]
    assert figures["store"] == "folder" and row["store_objects"] > 0 and row["store_bytes"] > 0
    assert row["cold"]["entries_written"] > 0 and not row["cold"]["unchanged"]
    second = row["second"]
    # the second machine ran no stage: the cold machine's package, read from the store, byte for byte
    assert second["unchanged"] is True and second["entries_read"] > 0 and second["entries_written"] == 0, second
    assert row["identical"] is True and positive(row["cold_s"]) and positive(row["second_s"])
    partial = row["partial"]  # a looser bound: the stages run again, on entries read from the store
    assert partial["unchanged"] is False and partial["entries_read"] > 0 and positive(partial["seconds"]), partial


@smoke_test("bench_coding.py")
def test_bench_coding_smoke():
    figures = smoke("bench_coding.py")
    rows = {r["precision"]: r for r in figures["coding"] if r["model"] == "lama"}
    assert set(rows) == {"fp16", "fp16w", "fp32"} and len(figures["coding"]) == 3
    assert rows["fp16w"]["raw"] < 0.6 * rows["fp32"]["raw"]  # fp16w: the fp32 graph, its weights stored as fp16
    for row in figures["coding"]:
        assert 0 < row["planes_br"] < row["raw"] and 0 < row["plain_br"] < row["raw"], row
    assert figures["quality"] and all(positive(q["br"]) and q["bytes"] > 0 for q in figures["quality"])
    assert {p["width"] for p in figures["planes"]} == {2, 4}


@smoke_test("bench_fp16_search.py")
def test_bench_fp16_search_smoke():
    figures = smoke("bench_fp16_search.py")
    for tool in ("pack", "auto_mixed_precision"):
        row = figures[tool]
        assert row["passes"] is True and row["trials"] >= 1 and positive(row["seconds"]), (tool, row)
        assert set(figures["planted"]) <= set(row["kept"]), (tool, row["kept"])  # each found the planted node


def test_bench_fp16_search_corpus_smoke(monkeypatch):
    """The conversion-time table runs (host check only here: the webgpu-kernels stage
    adds its own start-up to each row): one corpus export and the two generated exports, each a
    verified fp16; the VITS-style voice keeps its duration path in fp32 without a trial."""
    monkeypatch.setenv("PACK_WEBGPU_KERNELS", "off")
    figures = smoke("bench_fp16_search.py", "--corpus")
    rows = {row["model"].split(" ")[0]: row for row in figures["rows"]}
    assert len(rows) == 3 and {"paddle2onnx-style", "VITS-style"} <= set(rows), rows
    assert all(row["outcome"] == "fp16 passes" and positive(row["seconds"]) and row["evaluators"] == ["host cpu"] for row in rows.values()), rows
    assert rows["VITS-style"]["kept"] > 0 and rows["VITS-style"]["trials"] == 0, rows["VITS-style"]


@smoke_test("bench_fp16w_widen.py")
@pytest.mark.skipif(shutil.which("node") is None, reason="node not on PATH (the JS side of the widening runs under node)")
def test_bench_fp16w_widen_smoke():
    figures = smoke("bench_fp16w_widen.py")
    assert figures["fp16w_bytes"] < figures["fp32_bytes"] and figures["tensors"] == 64
    assert positive(figures["python_ms"]) and len(figures["js_ms"]) == 1 and positive(figures["js_ms"][0])


@smoke_test("bench_publish.py")
def test_bench_publish_smoke():
    figures = smoke("bench_publish.py")
    (row,) = figures["pack"]
    assert row["objects"] > 0 and positive(row["publish_s"]) and positive(row["republish_unchanged_cli_s"])
    assert figures["versus_aws_s3_sync"] is None  # no --aws


@pytest.mark.skipif(shutil.which("aws") is None, reason="awscli not on PATH (bench_publish.py --aws compares with `aws s3 sync`)")
def test_bench_publish_smoke_against_aws_s3_sync():
    figures = smoke("bench_publish.py", "--aws", shutil.which("aws"))
    comparison = figures["versus_aws_s3_sync"]
    assert all(positive(comparison[key]) for key in ("pack_full_s", "aws_full_s", "pack_unchanged_s", "aws_unchanged_s", "full_ratio"))


@smoke_test("measure_fp16_metrics.py")
def test_measure_fp16_metrics_smoke():
    (measured,) = smoke("measure_fp16_metrics.py")
    rows = measured["outputs"]["y"]["rows"]
    assert set(rows) == {"fp16", "zeros", "one short", "patch"}
    assert rows["fp16"]["rel_l2"] < 1e-2 < rows["patch"]["rel_l2"] and rows["zeros"]["rel_l2"] == pytest.approx(1.0)
    assert rows["one short"]["shape_ok"] is False


@smoke_test("measure_fp16w.py")
def test_measure_fp16w_smoke():
    (row,) = smoke("measure_fp16w.py")
    assert row["name"] == "lama" and row["fp16w_bytes"] < row["fp32_bytes"] and row["narrowed"] > 0
    assert row["outputs"] and all(o["rel_l2"] < 6.2e-4 for o in row["outputs"])  # fp16w's host bound (pipeline/verify/judgement/thresholds.py)


@smoke_test("bench_node_audit.py")
@pytest.mark.skipif(webgpu_kernels.unavailable_reason() is not None, reason=f"webgpu-kernels not available: {webgpu_kernels.unavailable_reason()}")
def test_bench_node_audit_smoke(chunked_packages):
    (result,) = smoke("bench_node_audit.py", str(chunked_packages["chunked"]), json_flag=("--json", "-"))
    assert len(result["seconds"]) == 1 and positive(result["seconds"][0])
    audited = result["audit"]["variants"]
    assert "fp16" in audited and audited["fp16"]["audited"] > 0 and not audited["fp16"]["failed"]


@smoke_test("bench_browser.py")
@pytest.mark.browser
def test_bench_browser_smoke():
    figures = smoke("bench_browser.py")
    assert len(figures["fixed_cost_s"]) == 1 and positive(figures["fixed_cost_s"][0])
    rows = figures["per_ep_median_ms"]
    assert {"webgpu/fp32", "wasm/fp32"} <= set(rows)
    assert all(positive(value) for row in rows.values() for value in row.values()), rows


@smoke_test("bench_ep.py")
@pytest.mark.browser
def test_bench_ep_smoke(chunked_packages):
    document = smoke("bench_ep.py", str(chunked_packages["single"]), json_flag=("--json", "-"))
    (package,) = document["packages"]
    results = {r["label"]: r for r in package["results"]}
    wasm = next(r for label, r in results.items() if label.startswith("wasm"))
    assert wasm["pages"] == 1 and positive(wasm["steady_ms"]) and positive(wasm["create_ms"]), wasm
    assert wasm["profile"]["ok"], wasm["profile"]
    assert document["measurements"][package["package"]], "no manifest measurements entries"


@smoke_test("measure_first_visit.py")
@pytest.mark.browser
def test_measure_first_visit_smoke(chunked_packages):
    (first,) = smoke("measure_first_visit.py", str(chunked_packages["single"]))
    assert first["visit"] == "first visit" and positive(first["first_result_ms"])
    assert first["wire_bytes"] > 0 and first["files"] > 0


def test_every_benchmark_has_a_smoke_test_and_says_how_to_run_it():
    scripts = {path.name for path in BENCH.glob("*.py")}
    assert scripts == set(SMOKE_TESTS), f"benchmarks without a smoke test here: {sorted(scripts - set(SMOKE_TESTS))}"
    for name in sorted(scripts):
        doc = " ".join((ast.get_docstring(ast.parse((BENCH / name).read_text())) or "").split())
        assert f"scripts/bench/{name}" in doc and "--smoke" in doc, f"{name}: its docstring must show how to run it, --smoke included"
        assert "side by side" in doc.lower() or " beside " in doc, f"{name}: its docstring must say what it compares side by side"


def test_the_product_imports_nothing_from_scripts_or_lab():
    for path in (REPO / "pipeline").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(name.split(".")[0] in ("scripts", "lab", "tests") for name in names), f"{path.relative_to(REPO)} imports {names}"


@smoke_test("measure_fp16_corpus.py")
def test_measure_fp16_corpus_smoke(tmp_path):
    [row] = smoke("measure_fp16_corpus.py", str(tmp_path / "dist"))
    assert (row["model"], row["exporter"], row["size"]) == ("lama", "torchscript", "small")
    # the Range over a Cast of a traced size (issue 26) converts: an fp16 model ships
    assert 0 < row["fp16_bytes"] < row["fp32_bytes"] and positive(row["build_s"]), row
    assert not row["verdict"].startswith("refused: converted model is invalid"), row


@smoke_test("measure_hosts.py")
@pytest.mark.browser
def test_measure_hosts_smoke(chunked_packages):
    nginx, plain = smoke("measure_hosts.py", str(chunked_packages["single"]))
    assert (nginx["isolated"], nginx["threads"]) == (True, min(nginx["cores"], 4)) and (plain["isolated"], plain["threads"]) == (False, 1)
    assert nginx["outputs_right"] and plain["outputs_right"], (nginx["outputs"], plain["outputs"])
    assert positive(nginx["wire_bytes"]) and 1 <= plain["ratio"] <= 1.15, plain
