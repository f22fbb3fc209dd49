"""report.json: the build's record, its type and its one builder.

What a build found, stage by stage (every check, every repair and conversion step, the browser's
facts, the stage timings, the sizes a visitor downloads) and its verdict. It is not part of what
the loader needs: manifest.files does not list it (so a rebuild's new timings never change the
manifest), `pack publish` uploads it only with `--with-report` (beside report.html), and it is
written once per build, after the manifest (its `delivery` sizes count the manifest's bytes).
`pack build --json` prints it; report.html, `pack report` and the build summary read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from pipeline.errors import PackError
from pipeline.report import REPORT_JSON


class Source(TypedDict):
    uri: str | None  # as published: no path of the build machine (pipeline/source public_uri)
    file: str
    sha256: str  # of the model as loaded, before repairs
    checked: str  # what the file was checked against: "--sha256" | "recipe" | "lock" | "pinned now" | "unchecked"
    precision: str  # fp32 | fp16 | quantized
    precision_reason: str


class Refusal(TypedDict):
    bundle: str
    ep: str
    variant: str
    by: str  # the run that refuses it (pipeline.manifest.describe_run)
    engine: NotRequired[str]  # refused in this engine only (its own failed run), not in Chromium


class LoaderChoice(TypedDict):
    select: str  # the manifest's loader.select
    why: str


class Record(TypedDict):
    name: str
    passed: bool  # the package rule (pipeline.manifest.package_verdict), remote-browser policy included
    verdict: list[str]  # what fails the package; [] when it passed
    refused: list[Refusal] | None  # each (bundle, EP, variant) the refusal rule turns away; None: none
    checks: list[dict[str, Any]]  # host, webgpu-kernels and browser checks, in that order
    steps: list[dict[str, Any]]  # repairs, conversion, kernel-stage and layout steps, in run order
    timings: dict[str, float]  # "<stage>_s": wall seconds per stage
    source: Source
    license: str | None
    variants_refused: dict[str, str]  # variant -> why it was not made
    sample_rate: int | None  # the recipe's audio sample rate, for report.html's players
    webgpu_kernels: NotRequired[dict[str, Any]]  # facts of the webgpu-kernels stage, when it ran
    browser: NotRequired[dict[str, Any]]  # the browser stage's facts (absent under --no-browser)
    loader: LoaderChoice
    delivery: dict[str, Any]  # pipeline.assets.delivery.delivery_sizes of the written manifest


def make_record(
    *,
    name: str,
    passed: bool,
    verdict: list[str],
    refused: list[Refusal] | None,
    checks: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    timings: dict[str, float],
    source: Source,
    license: str | None,
    variants_refused: dict[str, str],
    sample_rate: int | None,
    loader: LoaderChoice,
    delivery: dict[str, Any],
    webgpu_kernels: dict[str, Any] | None = None,
    browser: dict[str, Any] | None = None,
) -> Record:
    """The one way report.json is made, from the stages' results (pipeline/build.py)."""
    record: dict[str, Any] = {
        "name": name,
        "passed": passed,
        "verdict": list(verdict),
        "refused": refused or None,
        "checks": list(checks),
        "steps": list(steps),
        "timings": dict(timings),
        "source": source,
        "license": license,
        "variants_refused": dict(variants_refused),
        "sample_rate": sample_rate,
    }
    if webgpu_kernels is not None:
        record["webgpu_kernels"] = webgpu_kernels
    if browser is not None:
        record["browser"] = browser
    record["loader"] = loader
    record["delivery"] = delivery
    return record  # type: ignore[return-value]


def write_record(package_dir: Path, record: Record) -> Path:
    """`package_dir`/report.json: indented, one trailing newline."""
    path = Path(package_dir) / REPORT_JSON
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    return path


def read_record(package_dir: Path) -> Record:
    """`package_dir`/report.json; PackError when it is missing or not JSON."""
    path = Path(package_dir) / REPORT_JSON
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PackError(f"{path}: not found; rebuild the package with `pack build`") from None
    except ValueError as error:
        raise PackError(f"{path}: not valid JSON ({error}); rebuild the package") from None
    if not isinstance(record, dict):
        raise PackError(f"{path}: not a JSON object; rebuild the package with `pack build`")
    return record  # type: ignore[return-value]
