"""The check record (one entry of report.json `checks`) and the comparison that fills it.

Every check of every stage is made here: the host and `webgpu-kernels` stages (stages.py), the
browser (browser/harness.py; browser/grid.py for an endpoint that ended in error), `pack build
--no-browser` (skipped runs) and `pack verify` (package.py). A check names its stage, EP, variant,
bundle (browser runs) and output (one check per output once a run has outputs; one check for the
whole run when it has none), its status, the figures (pipeline/verify/judgement/metrics.py), the bounds they
were judged against (pipeline/verify/judgement/thresholds.py) and, when it did not simply pass, why:

    {"stage": "host" | "webgpu-kernels" | "browser" | "default-load", "ep": "cpu" | "webgpu" | "wasm", "variant": "fp16",
     "bundle": "webgpu", "output": "y", "status": "passed" | "failed" | "not-verifiable" | "skipped" | "error" | "refused",
     "metrics": {...}, "threshold": {...}, "detail": "..."}

`default-load` checks (browser/default_load.py) judge the shipped loader's `load()` with the
manifest's defaults, as an app calls it: their `ep`/`variant`/`bundle` are where it landed.

`refused` is `pack verify`'s word for a failure on a (bundle, EP, variant) the build itself refused
(the manifest's refusal rule): the loader never runs it, so it fails nothing (`refused_by_build`).

plus stage facts (host crashes, the node a node audit blamed, a browser endpoint, a runtime).

An output the app decides from (its `decision`: pipeline/verify/judgement/decisions.py) has a
second check beside its numeric one, naming the decision's kind and what each run decided:

    {..., "output": "text", "decision": "ctc", "metrics": {"flips": 0, "near_ties": 1, ...},
     "threshold": {"flips": 0, "near_ties": 1}, "decided": {"reference": "1 2 1", "actual": "1 2 3 1"}}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, TypedDict

from pipeline.verify.judgement.decisions import BOUND_KEYS, decide
from pipeline.verify.judgement.metrics import verdict
from pipeline.verify.judgement.thresholds import SELF_REFERENCE_BOUNDS

if TYPE_CHECKING:
    import numpy as np

    from pipeline.precision.variants import Variant

Stage = Literal["host", "webgpu-kernels", "browser", "default-load"]
Status = Literal["passed", "failed", "not-verifiable", "skipped", "error", "refused"]
STATUSES: tuple[Status, ...] = ("passed", "failed", "not-verifiable", "skipped", "error", "refused")


class Check(TypedDict, total=False):
    stage: Stage
    ep: str
    variant: str
    bundle: str  # browser checks: the runtime bundle the run loaded
    output: str  # absent when the run produced no outputs to compare
    status: Status
    metrics: dict  # {} when nothing was compared
    threshold: dict  # {} when nothing was compared
    detail: str  # why, when not passed (and what a passed audit or self-reference check shows)
    decision: str  # a decision check: the output's decision kind (decisions.py)
    decided: dict  # a decision check: what fp32 and the variant decided, one line each


def check(stage: str, ep: str, variant: str, status: str, *, bundle: str | None = None, output: str | None = None,
          metrics: dict | None = None, threshold: dict | None = None, detail: str | None = None, **facts) -> Check:
    """One check record; `facts` are the stage's own keys (crashes, node, endpoint, runtime, ...)."""
    if status not in STATUSES:
        raise ValueError(f"check status {status!r}: not one of {', '.join(STATUSES)}")
    record: dict = {"stage": stage, "ep": ep, "variant": variant}
    if bundle is not None:
        record["bundle"] = bundle
    if output is not None:
        record["output"] = output
    record.update(status=status, metrics=metrics if metrics is not None else {}, threshold=threshold if threshold is not None else {})
    if detail:
        record["detail"] = detail
    record.update(facts)
    return record  # type: ignore[return-value]


def tagged(checks: list[Check], **facts) -> list[Check]:
    """`checks`, each with `facts` added (the browser endpoint and device, the runtime that ran it)."""
    return [{**entry, **facts} for entry in checks]  # type: ignore[typeddict-item]


def numeric_bounds(bounds: dict) -> dict:
    """The numeric check's part of an output's bounds (the rest are its decision check's)."""
    return {key: bound for key, bound in bounds.items() if key not in BOUND_KEYS}


def judged(expected: np.ndarray, actual: np.ndarray, kind: str, bounds: dict, parts: dict | None = None) -> tuple[dict, str, str | None]:
    """(figures, status, why not passed) of one output against its fp32 reference and its bounds:
    passed, failed, or not-verifiable when the reference is degenerate (metrics.verdict); `parts`:
    the slices normalised each by its own range."""
    return verdict(expected, actual, kind, numeric_bounds(bounds), parts)


def decision_check(base: dict, name: str, expected: np.ndarray, actual: np.ndarray, decision: dict, bounds: dict) -> Check:
    """The decision check of output `name` (decisions.decide), its bounds the decision's part."""
    figures, status, reason, shown = decide(expected, actual, decision, bounds)
    threshold = {key: bound for key, bound in bounds.items() if key in BOUND_KEYS}
    return check(**base, output=name, status=status, metrics=figures, threshold=threshold, detail=reason, decision=decision["kind"], decided=shown)


def output_checks(base: dict, reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray], bounds: dict[str, dict], kinds: dict[str, str], judging: dict[str, dict] | None = None) -> list[Check]:
    """One check per output of `reference`: its figures against `bounds[output]`, and its decision
    check where `judging[output]` ({"decision", "parts"}: thresholds.output_judging) names one.
    `base`: the record's stage, ep, variant (and facts)."""
    checks = []
    for name, expected in reference.items():
        how = (judging or {}).get(name) or {}
        metrics, status, reason = judged(expected, outputs[name], kinds.get(name, "tensor"), bounds[name], how.get("parts"))
        checks.append(check(**base, output=name, status=status, metrics=metrics, threshold=numeric_bounds(bounds[name]), detail=reason))
        if how.get("decision"):
            checks.append(decision_check(base, name, expected, outputs[name], how["decision"], bounds[name]))
    return checks


def output_failures(reference: dict[str, np.ndarray], outputs: dict[str, np.ndarray], bounds: dict[str, dict], kinds: dict[str, str], judging: dict[str, dict] | None = None) -> dict[str, str]:
    """{output: why} for each output of `reference` that fails its bounds or its decision (the fp16
    search's view: a decision failure is fixed as a numeric one is; an output with a degenerate
    reference or a sample that decides nothing blocks no candidate: the checks say not-verifiable)."""
    found = {}
    for name, expected in reference.items():
        how = (judging or {}).get(name) or {}
        _, status, reason = judged(expected, outputs[name], kinds.get(name, "tensor"), bounds[name], how.get("parts"))
        if status != "failed" and how.get("decision"):
            _, status, reason, _ = decide(expected, outputs[name], how["decision"], bounds[name])
            reason = f"{how['decision']['kind']} decision: {reason}"
        if status == "failed":
            found[name] = reason
    return found


def rounded_metrics(metrics: dict) -> dict:
    """Figures rounded to 6 significant digits (the browser's checks: its outputs cross as JSON);
    not to 6 decimals, which made a max_abs_of_range of 3.7e-7 a 0."""
    return {key: (float(f"{value:.6g}") if isinstance(value, float) else value) for key, value in metrics.items()}


def self_reference_checks(variant: Variant, outputs: dict[str, np.ndarray], declared: list[dict]) -> list[Check]:
    """A quantized source is its own reference: on the host it can only show that it runs, with
    finite outputs of the declared shapes, so its check is at best not-verifiable (never passed on a
    self-reference) and fails on a wrong shape or a non-finite value; the browser checks then compare
    against these outputs."""
    import numpy as np

    checks = []
    for entry in declared:
        value = outputs[entry["name"]]
        expected = entry["shape"]
        shape_ok = len(expected) == value.ndim and all(not isinstance(d, int) or d in (0, n) for d, n in zip(expected, value.shape))
        floating = value.dtype.kind == "f"
        metrics = {"shape_ok": shape_ok, "nan": int(np.isnan(value).sum()) if floating else 0, "inf": int(np.isinf(value).sum()) if floating else 0}
        if not shape_ok:
            metrics.update(shape=list(value.shape), expected_shape=expected)
        passed = shape_ok and not metrics["nan"] and not metrics["inf"]
        if not passed:
            detail = f"shape {list(value.shape)} vs declared {expected}" if not shape_ok else "non-finite outputs"
        else:
            detail = f"no fp32 reference ({variant.self_reference}): it runs with finite outputs of the declared shape, which judges nothing of its values"
        checks.append(check("host", "cpu", variant.name, "not-verifiable" if passed else "failed", output=entry["name"], metrics=metrics, threshold=dict(SELF_REFERENCE_BOUNDS), detail=detail))
    return checks


def skipped_runs(runs, why: str) -> list[Check]:
    """The browser checks of planned runs (browser/run_plan.py) that were not made (`--no-browser`)."""
    return [check("browser", run.ep, run.variant, "skipped", bundle=run.bundle, detail=why) for run in runs]


def contradicted_kernel_errors(kernel_checks: list[Check], browser_checks: list[Check]) -> list[Check]:
    """A `webgpu-kernels` run that errored (no outputs: the native EP plugin fails some `If`
    subgraphs with "All inputs must be tensors on WebGPU buffers") while the browser passed the same
    variant on WebGPU is evidence about the plugin, not the package: not-verifiable, with the error.
    A wrong output (figures) stays a failure."""
    passed_in_browser = {c["variant"] for c in browser_checks if c["ep"] == "webgpu" and c["status"] == "passed"}
    failed_in_browser = {c["variant"] for c in browser_checks if c["ep"] == "webgpu" and c["status"] == "failed"}
    fixed = []
    for entry in kernel_checks:
        if entry["status"] == "failed" and not entry.get("metrics") and entry["variant"] in passed_in_browser - failed_in_browser:
            entry = {**entry, "status": "not-verifiable", "detail": f"runtime error on the native WebGPU EP ({entry.get('detail', 'no outputs')}), contradicted by the browser, which ran {entry['variant']} on WebGPU and passed"}
        fixed.append(entry)
    return fixed


def refused_by_build(checks: list[Check], manifest: dict) -> list[Check]:
    """`checks` of a built package (`pack verify`), each failure on a (bundle, EP, variant) that the
    build's runs refuse (pipeline.manifest.refused) marked `refused`, naming the build's run: the
    loader never runs that triple, so it fails nothing. A failure on anything else stays failed.
    Another engine's check (`engine`) is judged by the build's runs as that engine reads them."""
    from pipeline.manifest import WILDCARD, describe_run, in_engine, refused

    marked = []
    for entry in checks:
        read = in_engine(manifest, entry["engine"]) if entry.get("engine") and entry["stage"] == "browser" else manifest
        run = refused(read, entry.get("bundle") or WILDCARD, entry["ep"], entry["variant"]) if entry["status"] == "failed" else None
        if run is not None:
            entry = {**entry, "status": "refused", "detail": f"refused by the build ({describe_run(run)}), so the loader never runs it; here: {entry.get('detail') or 'failed'}"}  # type: ignore[assignment]
        marked.append(entry)
    return marked


def any_failed(checks: list[Check]) -> bool:
    return any(entry["status"] == "failed" for entry in checks)


def webgpu_failures(checks: list[Check]) -> set[tuple[str | None, str]]:
    """(bundle, variant) of every failed WebGPU run among `checks`."""
    return {(c.get("bundle"), c["variant"]) for c in checks if c["ep"] == "webgpu" and c["status"] == "failed"}


def layout_verdict(nhwc: list[Check], nchw: list[Check]) -> str | None:
    """The layout rule, one for the webgpu-kernels and the browser stages: one layout serves every
    variant (epOptions.webgpu), so NCHW is adopted when the WebGPU runs it fails are a strict subset
    of those NHWC fails (an fp16 that misses its bound under both must not keep an fp32 on the layout
    that breaks it). The step's line when it is adopted, else None."""
    before, after = webgpu_failures(nhwc), webgpu_failures(nchw)
    if not after < before:
        return None
    fixed = ", ".join(sorted({variant for _, variant in before - after}))
    still = ", ".join(sorted({variant for _, variant in after}))
    return f"webgpu preferredLayout NCHW: {fixed} passes where NHWC failed" + (f" ({still} fails either way)" if still else "")

