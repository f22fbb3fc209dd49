"""Render report.html from a package folder: its manifest.json, report.json, sample file and
models, and report.data.npz (the outputs the browser produced; `pack verify`'s result).

`write_report` is called by `pack build` (on the staging folder, before it is moved into place),
`pack verify` and `pack report`. The host outputs of each variant (onnxruntime CPU, runs cached)
are computed here when report.data.npz does not hold them yet, and kept there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path

import jinja2
import numpy as np

from pipeline.cache import atomic_write
from pipeline.errors import PackError
from pipeline.manifest import read_manifest
from pipeline.progress import Progress
from pipeline.report import REPORT_HTML, figures
from pipeline.report.data import ReportData, load, save
from pipeline.report.record import read_record
from pipeline.sample_file import read_sample
from pipeline.verify.engines.browser.harness import run_label
from pipeline.verify.judgement.decisions import decide, kept_boxes, undecided
from pipeline.verify.judgement.metrics import LOWER_BOUNDS, compare, format_metrics
from pipeline.verify.judgement.thresholds import manifest_judging

STATUS_ORDER = {"failed": 0, "refused": 1, "not-verifiable": 2, "skipped": 3, "passed": 4}
DEFAULT_SAMPLE_RATE = 16000
HOST_LABEL = "cpu/{variant} (host)"
SMALL_FILE = 32_000  # files under this size share one bar in the sizes chart
MAX_LISTED = 40  # rows of a node list before "… and N more"


@dataclass
class Section:
    """One output's pictures."""

    name: str
    kind: str
    drawn_as: str
    shape: list[int]
    picture: str | None = None  # data URI
    players: list[dict] = field(default_factory=list)  # {"label", "uri", "caption"}
    runs: list[tuple[str, str]] = field(default_factory=list)  # (run label, its figure) as text beside the picture
    notes: list[str] = field(default_factory=list)


def write_report(package: Path, data: ReportData | None = None, progress: Progress | None = None) -> Path:
    """Render `package`/report.html. `data`: what a verification just produced (`pack build`,
    `pack verify`), kept in report.data.npz with the host outputs; None re-renders from the
    package's own report.data.npz (`pack report`)."""
    progress = progress or Progress.quiet()
    package = Path(package)
    manifest = read_manifest(package)
    report = read_record(package)
    kept = load(package)
    if data is None:
        data = kept
    else:  # the host outputs depend on the package alone: a `pack verify` keeps the build's
        data.outputs = {**{label: o for label, o in kept.outputs.items() if label.startswith("cpu/")}, **data.outputs}
    progress.note(f"report: drawing {manifest['name']}")
    inputs, reference = read_sample(package, manifest)
    if _add_host_outputs(package, manifest, inputs, data) or data is not kept:
        save(package, data)
    html = render_html(manifest, report, inputs, reference, data)
    target = package / REPORT_HTML
    try:
        atomic_write(target, html.encode("utf-8"))
    except OSError as error:
        raise PackError(f"{target}: cannot write ({error.strerror or error}); make the package folder writable") from None
    return target


def _add_host_outputs(package: Path, manifest: dict, feeds: dict[str, np.ndarray], data: ReportData) -> bool:
    """Each shipped variant's outputs on onnxruntime CPU (cached runs), unless kept already."""
    from pipeline.assets.chunks import runnable_model
    from pipeline.verify.engines.host import run_model

    added = False
    for name, variant in sorted(manifest["variants"].items()):
        label = HOST_LABEL.format(variant=name)
        if label in data.outputs or variant.get("precision") == "fp32":  # fp32 on the host is the reference
            continue
        try:  # as the loader hands it to onnxruntime-web: chunks reassembled, fp16w widened
            model = runnable_model(package, variant, name)
        except PackError:
            continue
        run = run_model(model, feeds)
        if run.outputs is not None:
            data.outputs[label] = run.outputs
            added = True
    return added


# ----- the page ------------------------------------------------------------------------------


def render_html(manifest: dict, report: dict, inputs: dict, reference: dict, data: ReportData) -> str:
    verification = data.verification or {}
    checks = report.get("checks") or []
    if verification:  # a `pack verify`: its checks, beside the build's host checks it does not redo
        checks = [c for c in checks if c["stage"] == "host"] + verification["checks"]
    browser = verification.get("browser") if verification else report.get("browser")
    kernels = verification.get("webgpu_kernels") if verification else report.get("webgpu_kernels")
    # the one verdict: the package rule the build's exit code follows (report.json `passed`, the
    # manifest's verification.passed), or the exit code of the `pack verify` shown here
    passed = verification["passed"] if "passed" in verification else report["passed"]
    counts = {status: sum(c["status"] == status for c in checks) for status in STATUS_ORDER}
    context = {
        "name": manifest["name"],
        "description": manifest.get("description") or "",
        "license": manifest.get("license"),
        "passed": passed,
        "counts": counts,
        "by": verification.get("by") or "pack build",
        "written": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "source": report.get("source") or {},
        "runtime": manifest.get("runtime", {}).get("version"),
        "browser": _browser_line(browser),
        "refused": report.get("refused") or [],
        "checks": _check_rows(checks),
        "default_loads": _default_loads(checks),
        "narrowed": (manifest.get("verification") or {}).get("narrowedChains") or [],
        "outputs": _output_sections(manifest, report, inputs, reference, data),
        "repairs": _repairs(report.get("steps") or []),
        "kept": (manifest.get("fp16") or {}).get("keptFp32") or [],
        "fallback": _per_run(browser, "cpu_fallback"),
        "kernels": _per_run(browser, "slowest_kernels"),
        "kernel_stage": _kernel_stage(kernels),
        "sizes": _sizes(manifest),
        "visits": _first_visits(report.get("delivery")),
        "package_bytes": (report.get("delivery") or {}).get("package"),
        "timings": _timings(browser),
        "stage_times": report.get("timings") or {},
    }
    return _environment().get_template("report.html.j2").render(context)


def _environment() -> jinja2.Environment:
    template = resources.files("pipeline.report")
    environment = jinja2.Environment(
        loader=jinja2.FunctionLoader(lambda name: (template / name).read_text(encoding="utf-8")),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["figure"] = figure
    return environment


def _browser_line(browser: dict | None) -> str | None:
    if not browser:
        return None
    adapter = browser.get("adapter") or {}
    if adapter.get("available"):
        name = " ".join(str(adapter.get(k)) for k in ("vendor", "architecture") if adapter.get(k)) or adapter.get("description") or "unnamed"
        f16 = "shader-f16" if "shader-f16" in (adapter.get("features") or []) else "no shader-f16"
        gpu = f"WebGPU adapter {name} ({f16})"
    else:
        gpu = f"no WebGPU adapter ({adapter.get('reason', 'unavailable')})"
    engines = "".join(f"; {_engine_text(engine, facts)}" for engine, facts in (browser.get("engines") or {}).items())
    return f"Chromium {browser.get('chromium')}{' --gpu' if browser.get('gpu') else ''}; {gpu}{engines}"


def _engine_text(engine: str, facts: dict) -> str:
    """"firefox/140.12.0 (no WebGPU adapter: …), 31 s" for another engine's browser checks."""
    seconds = f", {facts['seconds']:.0f} s" if facts.get("seconds") is not None else ""
    if facts.get("unavailable"):
        return f"{engine}: not verifiable ({facts['unavailable']}){seconds}"
    adapter = facts.get("adapter") or {}
    gpu = "WebGPU adapter " + (" ".join(str(adapter.get(k)) for k in ("vendor", "architecture") if adapter.get(k)) or "unnamed") if adapter.get("available") else f"no WebGPU adapter: {adapter.get('reason', 'unavailable')}"
    return f"{facts.get('version') or engine} ({gpu}){seconds}"


def _check_rows(checks: list[dict]) -> list[dict]:
    """Every check, failures first (then not verifiable, skipped, passed), each with its figures
    next to their bounds."""
    rows = []
    for index, check in enumerate(checks):
        # the label the outputs and timings use: "wasm/fp32" on the webgpu bundle, "[wasm bundle]" named
        run = run_label(check) if check.get("bundle") not in (None, "*") else f"{check['ep']}/{check['variant']}"
        metrics, threshold = check.get("metrics") or {}, check.get("threshold") or {}
        figures_ = [
            {"key": key, "value": metrics[key], "bound": bound, "op": "≥" if key in LOWER_BOUNDS else "≤", "ok": _within(key, metrics[key], bound)}
            for key, bound in threshold.items() if key in metrics and not metrics.get("identical")
        ]
        rows.append({
            "order": (STATUS_ORDER.get(check["status"], 9), index),
            "status": check["status"],
            "stage": check["stage"],
            "run": run,
            "runtime": check.get("runtime"),
            "engine": check.get("engine") if check.get("engine") != "chromium" else None,  # rows per engine; Chromium's unnamed
            "output": check.get("output") or "",
            "decision": check.get("decision"),
            # what fp32 and the variant decided (labels, decoded text, boxes), beside the figures
            "decided": check.get("decided") or {},
            "figures": figures_,
            "figure_text": format_metrics(metrics, threshold),
            "detail": check.get("detail") if check["status"] != "passed" or check.get("decision") else None,
        })
    return sorted(rows, key=lambda row: row["order"])


def _default_loads(checks: list[dict]) -> list[dict]:
    """One row per (engine, platform) default load: its status, where it landed, threads and the
    content process's peak memory for the first load and the reload ('' where not measured)."""
    rows: dict[tuple[str, str, bool], dict] = {}
    for check in checks:
        if check["stage"] != "default-load":
            continue
        key = (check.get("engine", "chromium"), check.get("platform", "desktop"), "narrowedTo" in check)
        memory = check.get("memory") or {}
        row = rows.setdefault(key, {
            "engine": key[0], "platform": key[1], "chain": " > ".join(check.get("chain") or []), "status": "passed",
            "landed": f"{check['ep']}/{check['variant']}" if check["variant"] != "*" else "", "threads": check.get("threads") or "",
            "first_mb": (memory.get("first") or {}).get("peakMb", ""), "reload_mb": (memory.get("reload") or {}).get("peakMb", ""),
            "narrowed_to": " > ".join(check["narrowedTo"]) if "narrowedTo" in check else "",
        })
        if STATUS_ORDER.get(check["status"], 9) < STATUS_ORDER.get(row["status"], 9):
            row["status"] = check["status"]
    return list(rows.values())


def _within(key: str, value, bound) -> bool:
    try:
        return value >= bound if key in LOWER_BOUNDS else value <= bound
    except TypeError:
        return False


def _repairs(steps: list[dict]) -> list[dict]:
    """Each repair or conversion step, its records as readable entries (`_entry`)."""
    repairs = []
    for step in steps:
        records = [_entry(record) for record in step.get("records") or []]
        repairs.append({"name": step.get("name"), "changed": bool(step.get("changed")), "records": records[:MAX_LISTED],
                        "more": max(0, len(records) - MAX_LISTED), "refused": step.get("refused")})
    return repairs


# The key that names a record or an item of a record's list: shown first, as code.
NAME_KEYS = ("node", "nodes", "initializer", "name")
# The key that says what happened or why: shown right after the name.
WORD_KEYS = ("what", "why", "warning", "lock", "default")


def _entry(value, key: str | None = None) -> dict:
    """A record (or any part of one) for the page as words, never JSON: {key, name, text, items,
    more}. A dict's name (NAME_KEYS) and words (WORD_KEYS) come first, then its other plain figures
    as "key value"; its lists and dicts become nested entries (at most MAX_LISTED each)."""
    entry = {"key": _words(key) if key else None, "name": None, "text": "", "items": [], "more": 0}
    if isinstance(value, dict):
        named = next((k for k in NAME_KEYS if value.get(k) not in (None, "", []) and _is_plain(value[k])), None)
        if named:
            name = value[named]
            entry["name"] = ", ".join(map(str, name)) if isinstance(name, list) else str(name)
        said = [k for k in WORD_KEYS if value.get(k) not in (None, "") and _is_plain(value[k])]
        rest = [(k, v) for k, v in value.items() if k != named and k not in said]
        entry["text"] = "; ".join([_plain(value[k]) for k in said] + [f"{_words(k)} {_plain(v)}" for k, v in rest if _is_plain(v)])
        entry["items"] = [_entry(v, k) for k, v in rest if not _is_plain(v)]
    elif isinstance(value, list) and not all(_is_plain(v) for v in value):
        entry["items"] = [_entry(v) for v in value[:MAX_LISTED]]
        entry["more"] = max(0, len(value) - MAX_LISTED)
    else:
        entry["text"] = _plain(value)
    if not (entry["name"] or entry["text"] or entry["items"]):
        entry["text"] = "none"  # an empty dict or list
    return entry


def _is_plain(value) -> bool:
    """A value said in a few words: a number, a string, None, or a list of those."""
    if isinstance(value, list):
        return all(_is_plain(v) and not isinstance(v, list) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def _plain(value) -> str:
    if isinstance(value, list):
        text = ", ".join(_plain(v) for v in value) if value else "none"
    elif value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = figure(value)
    else:
        text = str(value)
    return text if len(text) <= 300 else text[:299] + "…"


def _words(key: str) -> str:
    return str(key).replace("_", " ")


def figure(value) -> str:
    """A measured figure in 4 significant digits, small ones in powers of ten ("3.7e-7"): never
    "0" for a value that is not 0."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value)
    text = f"{value:.4g}"
    mantissa, _, exponent = text.partition("e")
    return f"{mantissa}e{int(exponent)}" if exponent else text


def _per_run(browser: dict | None, key: str) -> list[dict]:
    """[{run, items}] for each browser run that lists `key` (CPU-fallback nodes, slowest kernels)."""
    found = []
    for run in (browser or {}).get("runs") or []:
        items = run.get(key) or []
        if items:
            found.append({"run": run_label(run), "items": items[:MAX_LISTED], "more": max(0, len(items) - MAX_LISTED)})
    return found


def _kernel_stage(kernels: dict | None) -> list[dict]:
    """The webgpu-kernels stage's facts (adapter, EP options, per variant: nodes, times), as entries."""
    return [_entry(value, key) for key, value in (kernels or {}).items() if key != "checks"]


def _sizes(manifest: dict) -> dict:
    """The sizes chart and table: every file raw and brotli, the model variants labelled, small
    files (loader modules, page) on one bar."""
    variants = {spec["model"]: name for name, spec in manifest["variants"].items()}
    rows, small = [], [0, 0, 0]
    table = []
    for path, entry in sorted(manifest["files"].items(), key=lambda item: -item[1]["size"]):
        encoded = (entry.get("encodings") or {}).get("br", {}).get("size")
        label = f"{variants[path]} model" if path in variants else path.split("/")[-1]
        table.append({"path": path, "label": label, "raw": entry["size"], "br": encoded})
        if entry["size"] < SMALL_FILE and path not in variants:
            small[0] += 1
            small[1] += entry["size"]
            small[2] += encoded or entry["size"]
        else:
            rows.append((_chart_label(label), entry["size"], encoded))
    if small[0]:
        rows.append((f"{small[0]} small files", small[1], small[2] if small[2] != small[1] else None))
    total_raw = sum(r["raw"] for r in table)
    total_sent = sum(r["br"] or r["raw"] for r in table)
    return {"chart": figures.sizes_chart(rows) if rows else None, "table": table, "total_raw": total_raw, "total_sent": total_sent}


def _first_visits(delivery: dict | None) -> list[dict]:
    """What a visitor on each platform downloads before the first result (report.json `delivery`,
    pipeline/assets/delivery.py): one row per platform, then, where they apply, the visit of an
    adapter without the chosen variant's features and what the measured choice's trials add."""
    rows = []
    for platform, visit in ((delivery or {}).get("first_visit") or {}).items():
        what = f"{visit['bundle']} runtime bundle, {visit['variant'] or 'no'} model, manifest and loader"
        rows.append({"platform": platform, "chain": ", ".join(visit["chain"]), "what": what, "files": visit["files"], "bytes": visit["bytes"], "wire": visit["wire_bytes"], "sub": False})
        plain = visit.get("without_features")
        if plain:
            rows.append({"platform": platform, "chain": f"without {', '.join(plain['lacking'])}", "what": f"{plain['variant'] or 'no'} model instead",
                         "files": plain["files"], "bytes": plain["bytes"], "wire": plain["wire_bytes"], "sub": True})
        trials = visit.get("trials")
        if trials and trials["files"]:
            rows.append({"platform": platform, "chain": "trials", "what": "select: measured: the trials' sample and the other candidates' models",
                         "files": trials["files"], "bytes": trials["bytes"], "wire": trials["wire_bytes"], "sub": True})
    return rows


def _chart_label(label: str) -> str:
    return label if len(label) <= 34 else label[:16] + "…" + label[-16:]


def _timings(browser: dict | None) -> dict | None:
    eps = (browser or {}).get("eps") or {}
    timed = {label: run for label, run in eps.items() if any(run.get(k) for k in ("session_create_ms", "first_run_ms", "steady_run_ms"))}
    if not timed:
        return None
    return {"chart": figures.timings_chart(timed), "runs": timed}


# ----- pictures --------------------------------------------------------------------------------


def _output_sections(manifest: dict, report: dict, inputs: dict, reference: dict, data: ReportData) -> list[Section]:
    kinds = {o["name"]: o.get("kind", "tensor") for o in manifest["outputs"]}
    judging = manifest_judging(manifest)
    sample_rate = int(report.get("sample_rate") or DEFAULT_SAMPLE_RATE)
    rate_note = None if report.get("sample_rate") else f"played at {DEFAULT_SAMPLE_RATE} Hz: the recipe names no sample rate"
    sections = []
    for name, expected in reference.items():
        kind = kinds.get(name, "tensor")
        layout = figures.layout_of(kind, tuple(expected.shape))
        runs = _runs_of(name, expected, kind, data, judging.get(name) or {})
        section = Section(name, kind, layout.what, list(expected.shape))
        decision = (judging.get(name) or {}).get("decision")
        if decision:  # what the reference decides, beside each run's decision in its caption
            nothing = undecided(expected, decision)
            decided = f"nothing ({nothing})" if nothing else decide(expected, expected, decision, {})[3].get("reference")
            if decided:  # an embedding shows no decision, only its cosine
                section.notes.append(f"the reference decides ({decision['kind']}): {decided}")
        if not runs:
            section.notes.append("no variant output to compare: the package has no browser outputs or non-fp32 variants (run `pack verify` to record them)")
        cut = [label for label, array, _ in runs if array.shape != expected.shape]
        runs = [(label, array, caption) for label, array, caption in runs if array.shape == expected.shape]
        for label in cut:
            section.notes.append(f"{label}: the output kept is cut or of another shape; not drawn")
        section.runs = [(label, caption) for label, _, caption in runs]
        if layout.what == "image":
            pictures = [(n, a) for n, a in inputs.items() if figures.image_layout(a.shape)][:2]
            section.picture = figures.image_figure(pictures, expected, runs, layout)
        elif layout.what == "waveform":
            section.picture = figures.audio_figure(expected, runs, layout, sample_rate)
            section.players = _players(expected, runs, layout, sample_rate)
            if rate_note:
                section.notes.append(rate_note)
        elif layout.what == "spectrum":
            section.picture = figures.spectrum_figure(expected, runs, layout)
            section.notes.append("complex spectrum bins (real, imaginary): drawn as magnitude per bin, not played as sound")
        elif decision and decision["kind"] == "detection" and (pictures := [a for a in inputs.values() if figures.image_layout(a.shape)]):
            # boxes drawn on the sample image: the reference's, then each run's
            panels = [("reference", *kept_boxes(expected, decision))] + [(label, *kept_boxes(array, decision)) for label, array, _ in runs]
            section.picture = figures.boxes_figure(pictures[0], panels)
        elif runs:
            section.picture = figures.histogram_figure(expected, runs)
        sections.append(section)
    return sections


def _runs_of(name: str, expected: np.ndarray, kind: str, data: ReportData, judging: dict) -> list[tuple[str, np.ndarray, str]]:
    """(label, output, figure caption) per run that kept `name`; runs with byte-identical outputs
    share one entry (their labels joined). `judging`: the output's parts and decision (the caption
    then says what the run decided)."""
    groups: list[tuple[list[str], np.ndarray]] = []
    for label, outputs in sorted(data.outputs.items(), key=lambda item: (not item[0].startswith("cpu/"), item[0])):
        if name not in outputs:
            continue
        array = np.asarray(outputs[name])
        same = next((group for group in groups if group[1].shape == array.shape and group[1].dtype == array.dtype and np.array_equal(group[1], array, equal_nan=True)), None)
        if same:
            same[0].append(label)
        else:
            groups.append(([label], array))
    runs = []
    for labels, array in groups:
        caption = ""
        if array.shape == expected.shape:
            metrics = compare(expected, array, kind, judging.get("parts"))
            key = {"image": "psnr_db", "audio": "snr_db"}.get(kind)
            if metrics.get("identical"):
                caption = "identical to the reference"
            elif key in metrics:
                caption = f"{'PSNR' if key == 'psnr_db' else 'SNR'} {metrics[key]:.1f} dB"
            else:
                caption = f"rel_l2 {metrics.get('rel_l2', 0):.2g}"
            shown = decide(expected, array, judging["decision"], {})[3] if judging.get("decision") else {}
            if shown.get("actual"):
                caption += f"; decides {shown['actual']}"
        runs.append((", ".join(labels), array, caption))
    return runs


def _players(expected: np.ndarray, runs: list, layout: figures.Layout, sample_rate: int) -> list[dict]:
    """<audio> sources: the reference and each run, at one gain (the reference's peak to 0.9), so
    what differs by ear is the output, not the loudness."""
    reference = figures.waveform(expected, layout)
    peak = float(np.nanmax(np.abs(reference))) if reference.size else 0.0
    gain = 0.9 / peak if peak > 0 else 1.0
    players = [{"label": "fp32 reference (host)", "uri": figures.wav_uri(reference, sample_rate, gain), "caption": ""}]
    for label, array, caption in runs:
        players.append({"label": label, "uri": figures.wav_uri(figures.waveform(array, layout), sample_rate, gain), "caption": caption})
    return players
