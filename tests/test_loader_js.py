"""The loader's ES modules under node's own test runner (tests/js), and its output comparison
(web_template/loader/compare.js) against pipeline/verify/judgement/metrics.py on the same arrays."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pipeline.verify.judgement.metrics import compare

ROOT = Path(__file__).resolve().parents[1]
JS_TESTS = ROOT / "tests" / "js"
COMPARE_JS = ROOT / "web_template" / "loader" / "compare.js"

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (node --test)")


def test_node_test_suite_passes():
    files = sorted(str(path) for path in JS_TESTS.glob("*.test.mjs"))
    assert files, f"no *.test.mjs in {JS_TESTS}"
    # the brotli decoder the build ships (tests/js/brotli.test.mjs decodes with it)
    from pipeline.assets.decoder import decoder_paths
    from pipeline.progress import Progress

    env = {**os.environ, "PACK_TEST_BROTLI_DECODER": str(decoder_paths(Progress.quiet())["module"].parent)}
    result = subprocess.run(["node", "--test", "--test-reporter=tap", *files], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    failing = [line for line in result.stdout.splitlines() if line.lstrip().startswith("not ok")]
    assert result.returncode == 0 and not failing, "\n".join([*failing, result.stdout[-4000:], result.stderr[-2000:]])
    assert not [line for line in result.stdout.splitlines() if "# SKIP" in line], result.stdout[-4000:]
    passed = int(next(line.split()[-1] for line in result.stdout.splitlines() if line.startswith("# pass")))
    assert passed >= 40, result.stdout[-2000:]


def _js_metrics(cases: list[dict]) -> list[dict]:
    script = (
        f"import {{ compareTensor }} from {json.dumps(COMPARE_JS.as_uri())};\n"
        "import { readFileSync } from 'node:fs';\n"
        "const cases = JSON.parse(readFileSync(0, 'utf8'));\n"
        "const tensor = (t) => ({ type: t.type, dims: t.dims, data: Float32Array.from(t.data.map((v) => v === null ? NaN : v)) });\n"
        "console.log(JSON.stringify(cases.map((c) => compareTensor(tensor(c.reference), tensor(c.actual), c.kind, c.parts || null))));\n"
    )
    result = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(cases), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _detection_head(rng: np.random.Generator) -> tuple[np.ndarray, dict]:
    """A YOLO-style head [1, 4 + 3, 40]: boxes in pixels 0..320 beside class scores 0..1."""
    head = np.concatenate([rng.uniform(0, 320, (1, 4, 40)), rng.uniform(0, 1, (1, 3, 40))], axis=1).astype(np.float32)
    return head, {"axis": 1, "slices": [[0, 4], [4, None]]}


def test_compare_js_matches_the_python_metrics():
    rng = np.random.default_rng(0)
    cases = []
    for kind in ("tensor", "image", "audio"):
        reference = rng.standard_normal(700).astype(np.float32)  # audio: 2 full segments of 256 and a tail
        for scale in (0.0, 1e-4, 1e-2, 0.5):
            actual = (reference + scale * rng.standard_normal(700)).astype(np.float32)
            cases.append((kind, reference, actual))
    image = rng.uniform(0, 1, (2, 20, 19)).astype(np.float32)  # blocks with ragged edges
    noisy = (image + rng.normal(0, 0.01, image.shape)).astype(np.float32)
    noisy[1, 9:17, 3:11] += 0.2
    cases.append(("image", image, noisy))
    pixels = rng.integers(0, 256, (3, 17, 21)).astype(np.uint8)
    shifted = np.clip(pixels.astype(np.int16) + rng.choice([-2, -1, 0, 0, 0, 1], pixels.shape), 0, 255).astype(np.uint8)
    cases.append(("image", pixels, shifted))
    with_nan = cases[0][2].copy()
    with_nan[5] = np.nan
    cases.append(("tensor", cases[0][1], with_nan))
    encode = lambda a: {"type": str(a.dtype), "dims": list(a.shape), "data": [None if np.isnan(v) else float(v) for v in a.ravel()]}  # noqa: E731
    parts = [None] * len(cases)
    head, head_parts = _detection_head(rng)
    for scores_off in (0.0, 0.01):  # a detection head: boxes 0..320 beside scores 0..1, per part
        actual = head.copy()
        actual[0, 4:, 3] += scores_off
        cases.append(("tensor", head, actual))
        parts.append(head_parts)
    cases.append(("audio", head, head + np.float32(0.5)))  # an axis counted from the end, a stop past it
    parts.append({"axis": -2, "slices": [[0, 2], [2, 99]]})
    js = _js_metrics([{"kind": k, "reference": encode(r), "actual": encode(a), "parts": p} for (k, r, a), p in zip(cases, parts)])
    for (kind, reference, actual), part, got in zip(cases, parts, js):
        expected = compare(reference, actual, kind, part)
        assert set(got) == set(expected), (kind, got, expected)
        for key, value in expected.items():
            if isinstance(value, float):
                assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-3 if key.endswith("_db") else 1e-12), (kind, key)
            else:
                assert got[key] == value, (kind, key)


def test_compare_js_finds_the_same_degenerate_references_as_the_python_metrics():
    """degenerateReference (compare.js) and degenerate_reference (metrics.py) agree on which
    references cannot tell a right output from a wrong one, and an exact match reads "identical"
    in both, without infinite dB figures."""
    from pipeline.verify.judgement.metrics import degenerate_reference, format_metrics

    rng = np.random.default_rng(1)
    references = {
        "all zero": np.zeros(300, np.float32),
        "constant": np.full(300, 0.25, np.float32),
        "spread of two rounding steps": np.float32(1000) + np.float32(1000) * np.float32(2 ** -23) * rng.integers(0, 3, 300).astype(np.float32),
        "one zero value": np.zeros(1, np.float32),
        "one value": np.full(1, 3.5, np.float32),
        "signal": rng.standard_normal(300).astype(np.float32),
        "with NaN": np.where(np.arange(300) == 7, np.nan, 1.0).astype(np.float32),
    }
    encode = lambda a: {"type": str(a.dtype), "dims": list(a.shape), "data": [None if np.isnan(v) else float(v) for v in a.ravel()]}  # noqa: E731
    script = (
        f"import {{ compareTensor, degenerateReference, formatMetrics }} from {json.dumps(COMPARE_JS.as_uri())};\n"
        "import { readFileSync } from 'node:fs';\n"
        "const cases = JSON.parse(readFileSync(0, 'utf8'));\n"
        "const tensor = (t) => ({ type: t.type, dims: t.dims, data: Float32Array.from(t.data.map((v) => v === null ? NaN : v)) });\n"
        "console.log(JSON.stringify(cases.map((c) => ({ degenerate: degenerateReference(tensor(c), 'audio'),\n"
        "  same: formatMetrics(compareTensor(tensor(c), tensor(c), 'audio'), { snr_db: 25 }) }))));\n"
    )
    result = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps([encode(r) for r in references.values()]),
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for (name, reference), got in zip(references.items(), json.loads(result.stdout)):
        expected = degenerate_reference(reference, "audio")
        assert (got["degenerate"] is None) == (expected is None), (name, got, expected)
        assert (expected is None) == (name in ("one value", "signal")), (name, expected)
        if name != "with NaN":
            metrics = compare(reference, reference, "audio")
            assert metrics["identical"] and "snr_db" not in metrics
            assert got["same"] == format_metrics(metrics, {"snr_db": 25}) == "identical to the reference"


def test_decisions_js_decides_as_the_python_decisions():
    """decide (web_template/loader/decisions.js) and decisions.decide give the same figures, status
    and shown decisions on the same arrays, for every kind."""
    from pipeline.verify.judgement.decisions import decide
    from pipeline.verify.judgement.thresholds import threshold_for

    rng = np.random.default_rng(4)
    probs = rng.dirichlet(np.ones(7), (2, 9)).astype(np.float32)  # [2, 9, 7]
    near = probs.copy()
    near[0, 4, :2] = [0.301, 0.299]
    flipped = near.copy()
    flipped[0, 4, :2] = [0.299, 0.301]
    flipped[1, 2] = np.roll(flipped[1, 2], 1)
    ctc = probs.copy()
    ctc[:, ::2, 0] += 1.0  # every other step blank
    ctc_actual = ctc.copy()
    ctc_actual[0, 3] = np.roll(ctc_actual[0, 3], 2)
    head = np.concatenate([rng.uniform(20, 300, (1, 2, 30)), rng.uniform(5, 40, (1, 2, 30)), rng.uniform(0, 1, (1, 3, 30))], axis=1).astype(np.float32)
    moved = head + rng.normal(0, 0.5, head.shape).astype(np.float32) * np.array([1, 1, 1, 1, 0.01, 0.01, 0.01], np.float32)[None, :, None]
    moved[0, 4:, 5] = 0.0  # one box lost
    alpha = rng.uniform(0, 1, (1, 1, 12, 12)).astype(np.float32)
    vectors = rng.standard_normal((3, 16)).astype(np.float32)
    cases = [
        ({"kind": "logits", "axis": -1, "top_k": 3}, near, flipped, "fp16"),
        ({"kind": "probabilities", "axis": 1, "top_k": 2}, probs, near, "fp16"),
        ({"kind": "ctc", "axis": -1, "blank": 0}, ctc, ctc_actual, "fp16"),
        ({"kind": "ctc", "axis": 2, "blank": 0, "time_axis": 0}, ctc.transpose(1, 0, 2).copy(), ctc_actual.transpose(1, 0, 2).copy(), "fp16"),  # torch's [T, N, C]
        ({"kind": "detection", "axis": 1, "boxes": "cxcywh", "threshold": 0.5}, head, moved, "fp16"),
        ({"kind": "detection", "axis": 1, "boxes": "xywh", "threshold": 0.9}, head, head, "fp32"),
        ({"kind": "mask", "threshold": 0.5}, alpha, alpha + rng.normal(0, 0.02, alpha.shape).astype(np.float32), "fp16"),
        ({"kind": "embedding", "axis": -1}, vectors, vectors + rng.normal(0, 0.05, vectors.shape).astype(np.float32), "fp16"),
        ({"kind": "mask", "threshold": 2.0}, alpha, alpha, "fp32"),
    ]
    bounds = [threshold_for("image" if d["kind"] == "mask" else d["kind"], precision, "cpu") for d, _, _, precision in cases]
    bounds = [{**b, **threshold_for(d["kind"], p, "cpu")} for b, (d, _, _, p) in zip(bounds, cases)]
    encode = lambda a: {"type": "float32", "dims": list(a.shape), "data": [float(v) for v in a.ravel()]}  # noqa: E731
    script = (
        f"import {{ decide }} from {json.dumps((ROOT / 'web_template' / 'loader' / 'decisions.js').as_uri())};\n"
        "import { readFileSync } from 'node:fs';\n"
        "const cases = JSON.parse(readFileSync(0, 'utf8'));\n"
        "const tensor = (t) => ({ type: t.type, dims: t.dims, data: Float32Array.from(t.data) });\n"
        "console.log(JSON.stringify(cases.map((c) => decide(tensor(c.reference), tensor(c.actual), c.decision, c.bounds))));\n"
    )
    payload = [{"decision": d, "reference": encode(r), "actual": encode(a), "bounds": b} for (d, r, a, _), b in zip(cases, bounds)]
    result = subprocess.run(["node", "--input-type=module", "-e", script], input=json.dumps(payload), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    statuses = []
    for (decision, reference, actual, _), bound, got in zip(cases, bounds, json.loads(result.stdout)):
        figures, status, _, shown = decide(reference, actual, decision, bound)
        statuses.append(status)
        assert got["status"] == status and got["shown"] == shown, (decision, got, status, shown)
        assert set(got["figures"]) == set(figures), decision
        for key, value in figures.items():
            assert got["figures"][key] == pytest.approx(value, rel=1e-9, abs=1e-12), (decision, key)
    assert statuses == ["failed", "passed", "failed", "failed", "failed", "passed", "passed", "failed", "not-verifiable"], str(statuses)  # every verdict met
