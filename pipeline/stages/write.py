"""The write stage: manifest.json once, then report.json (its sizes count the manifest's bytes),
then report.html. The report records how the source was found and checked: the stage is keyed by
that record (the fetch's key, the bytes alone, does not hold it), so a reused package never names
another source."""

from __future__ import annotations

from pipeline.assets.delivery import delivery_sizes
from pipeline.manifest import write_manifest
from pipeline.report.data import ReportData
from pipeline.report.record import make_record, write_record
from pipeline.report.render import write_report
from pipeline.source import public_uri
from pipeline.stage_table import Artefacts, Stage
from pipeline.stages.contents import recipe_with_kinds
from pipeline.stages.context import StageContext


def run(artefacts: Artefacts, context: StageContext) -> dict:
    recipe, made, fetched, browser = recipe_with_kinds(artefacts), artefacts["made"], artefacts["fetched"], artefacts["browser"]
    loaded = artefacts["loaded"]  # the judgement with the default load's part
    staging, manifest, verdict = context.staging, loaded["manifest"], loaded["verdict"]
    manifest_size = write_manifest(staging, manifest).stat().st_size  # the one write of the manifest
    report = make_record(
        name=recipe.name,
        passed=verdict["passed"],
        verdict=verdict["verdict"],
        refused=verdict["refused"],
        checks=loaded["checks"],
        steps=artefacts["repair_steps"] + [artefacts["sample_step"]] + made.steps + artefacts["kernels"].steps + browser.steps,
        timings={f"{name}_s": seconds for name, seconds in artefacts["timings"].items()},
        source={"uri": public_uri(fetched.uri), "file": fetched.path.name, "sha256": artefacts["source_sha"], "checked": fetched.checked_against, "precision": made.precision, "precision_reason": made.precision_reason},
        license=recipe.license,
        variants_refused=made.refused,
        sample_rate=recipe.sample_rate,
        webgpu_kernels=artefacts["kernels"].facts,
        browser=browser.report,
        loader=verdict["loader"],
        delivery=delivery_sizes(manifest, manifest_size),
    )
    write_record(staging, report)  # after the manifest, once: not in manifest.files (pipeline/report)
    write_report(staging, ReportData(browser.outputs), context.progress)  # report.html: not in manifest.files either
    return {"report": report}


def source_record(artefacts: Artefacts) -> dict[str, str]:
    fetched = artefacts["fetched"]
    return {"uri": public_uri(fetched.uri), "file": fetched.path.name, "checked": fetched.checked_against}


STAGE = Stage(
    "write", run, settings=("recipe.name",),
    reads=("recipe", "outputs", "loaded", "made", "browser", "kernels", "repair_steps", "sample_step", "fetched", "source_sha", "timings"), makes=("report",),
    content=source_record,
    code=("pipeline.report",),  # report.html's template
    libraries=("jinja2", "numpy"),
)
