"""`pack publish`: upload built packages to S3 or Cloudflare R2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from pipeline.commands.common import cli_errors, print_json, progress_for
from pipeline.errors import PackError
from pipeline.publish.cors import set_cors, validate_origins
from pipeline.publish.upload_plan import PackagePlan, find_packages, plan_package, with_report
from pipeline.manifest import describe_run, package_verdict
from pipeline.publish.publisher import PublishResult, local_plan, publish as publish_plans
from pipeline.s3 import Target, check_bucket, is_r2, make_client, normalize_prefix
from pipeline.publish.transfer import MIB, MIN_PART_SIZE

DEFAULT_DIST = Path("dist")


def publish(
    dist: Annotated[
        Optional[list[Path]],
        typer.Argument(help="Package folders (dist/<name>) or folders of packages; default: every package in dist/."),
    ] = None,
    bucket: Annotated[Optional[str], typer.Option(envvar="PACK_BUCKET", help="Bucket name.")] = None,
    prefix: Annotated[
        str, typer.Option(envvar="PACK_PREFIX", help="Key prefix; objects go to <prefix>/<name>/<path>.")
    ] = "",
    endpoint_url: Annotated[
        Optional[str],
        typer.Option(envvar="PACK_ENDPOINT_URL", help="S3 API endpoint, e.g. https://<ACCOUNT_ID>.r2.cloudflarestorage.com."),
    ] = None,
    region: Annotated[
        Optional[str], typer.Option(envvar="PACK_REGION", help="Region ('auto' for R2, detected from the endpoint).")
    ] = None,
    profile: Annotated[
        Optional[str], typer.Option(help="AWS profile (default: AWS_PROFILE or the environment's keys).")
    ] = None,
    public_url: Annotated[
        Optional[str],
        typer.Option(envvar="PACK_PUBLIC_URL", help="Public base URL of the bucket (CDN, r2.dev or custom domain)."),
    ] = None,
    cors: Annotated[
        Optional[list[str]],
        typer.Option(envvar="PACK_CORS", help="Set a bucket CORS rule for GET/HEAD from ORIGIN (repeatable)."),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="Show what would change; change nothing. Without credentials or a reachable bucket: the full local plan.",
        ),
    ] = False,
    allow_failed: Annotated[
        bool,
        typer.Option(
            "--allow-failed",
            envvar="PACK_ALLOW_FAILED",
            help="Publish a package whose verification failed (each failed check is printed as a warning).",
        ),
    ] = False,
    with_report_page: Annotated[
        bool,
        typer.Option("--with-report", envvar="PACK_WITH_REPORT", help="Also upload each package's build reports, report.json and report.html (left out by default: they hold timings and outputs, not what apps load; the manifest lists neither)."),
    ] = False,
    prune: Annotated[
        bool, typer.Option("--prune", help="Delete objects under the prefix that no published manifest references.")
    ] = False,
    part_size: Annotated[
        int, typer.Option(envvar="PACK_PART_SIZE_MB", help="Multipart part size in MiB (>= 5); larger files go multipart.")
    ] = 8,
    no_check: Annotated[
        bool,
        typer.Option("--no-check", envvar="PACK_NO_CHECK", help="Skip the check from the outside (anonymous GETs of the public URL, as a browser)."),
    ] = False,
    check_origin: Annotated[
        Optional[list[str]],
        typer.Option(envvar="PACK_CHECK_ORIGIN", help="The app's origin that must be allowed by CORS (repeatable; default: each --cors origin)."),
    ] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print a JSON summary on stdout.")] = False,
) -> None:
    """Publish packages to S3 or R2: hashed files, then manifest, then loader; unchanged objects are skipped."""
    with cli_errors():
        progress = progress_for(json_output)
        if not bucket and not dry_run:
            raise PackError("no bucket: pass --bucket NAME or set PACK_BUCKET")
        if part_size * MIB < MIN_PART_SIZE:
            raise PackError(f"--part-size {part_size}: S3 and R2 need parts of at least 5 MiB")
        origins = validate_origins(cors or [])
        app_origins = validate_origins(check_origin or [])
        plans = _plan_all(dist, allow_none=bool(origins))
        if with_report_page:
            plans = [with_report(plan) for plan in plans]
        warnings = _trust_gate(plans, allow_failed)
        target = Target(
            bucket=bucket or "<bucket>",
            prefix=normalize_prefix(prefix),
            endpoint_url=endpoint_url or None,
            region=region or None,
            profile=profile or None,
            public_url=public_url or None,
        )
        client, unreachable = _connect(target, dry_run, has_bucket=bool(bucket))
        if client is None:
            result = local_plan(target, plans, with_urls=bool(bucket))
            result.remote_unchecked = unreachable
            rules = None
        else:
            target = replace(target, region=client.meta.region_name)  # as resolved (AWS_REGION, profile)
            rules = set_cors(client, target, origins, dry_run) if origins else None
            result = publish_plans(
                client, target, plans, part_size=part_size * MIB, dry_run=dry_run, prune_unreferenced=prune, progress=progress
            )
        result.warnings = warnings
        checked = client is not None and not dry_run and not no_check
        if is_r2(target.endpoint_url) and not target.public_url and plans and not checked:
            progress.note("note: the R2 API URL is not public; set --public-url / PACK_PUBLIC_URL to its public domain")
        if not json_output:
            _print_summary(result, rules, what_else=_unchecked_extras(prune, origins))
        checks = _check_from_outside(target, plans, origins, app_origins, progress, json_output) if checked else None
        if checks is not None:
            result.warnings += [warning for check in checks for warning in check.warnings]
        if json_output:
            print_json(_summary_json(result, rules, checks))
        errors = [error for check in checks or [] for error in check.errors]
        for error in errors:
            typer.echo(f"error: {error}", err=True)
        if errors:
            raise typer.Exit(1)


def _check_from_outside(target: Target, plans: list[PackagePlan], cors: list[str], app_origins: list[str], progress, json_output: bool):
    """Anonymous GETs of each package as a browser on the app's origin would make (pipeline/publish/check.py)."""
    from pipeline.publish.check import check_origins, check_package

    origins, required = check_origins(cors, app_origins)
    checks = []
    for plan in plans:
        progress.note(f"{plan.name}: checking the public URL as a browser would (anonymous GET, Origin {', '.join(origins)})")
        check = check_package(target, plan, origins, required)
        for warning in check.warnings:
            typer.echo(f"warning: {warning}", err=True)
        if not json_output:
            typer.echo(f"check {plan.name}: {check.status}")
            for line in check.lines:
                typer.echo(line)
            for note in check.notes:
                typer.echo(f"  note: {note}")
        checks.append(check)
    return checks


def _connect(target: Target, dry_run: bool, has_bucket: bool):
    """(client, None), or under --dry-run (None, why the bucket could not be asked) instead of an error."""
    try:
        if not has_bucket:
            raise PackError("no bucket given (--bucket / PACK_BUCKET)")
        client = make_client(target)
        check_bucket(client, target)
        return client, None
    except PackError as error:
        if not dry_run:
            raise
        return None, str(error)


def _unchecked_extras(prune: bool, origins: list[str]) -> list[str]:
    extras = []
    if prune:
        extras.append("which objects --prune would delete")
    if origins:
        extras.append("the bucket's CORS rules")
    return extras


def _trust_gate(plans: list[PackagePlan], allow_failed: bool) -> list[str]:
    """Nothing unverified is served silently: a package whose verification failed is refused
    (naming each failed check) unless --allow-failed, which warns once per failed check; a package
    built without the browser checks is published with a warning. Returns the warnings printed."""
    warnings: list[str] = []

    def warn(text: str) -> None:
        warnings.append(text)
        typer.echo(f"warning: {text}", err=True)

    for plan in plans:
        for path in plan.unlisted:
            warn(f"{plan.root / path}: not listed in manifest.json, not uploaded; rebuild the package, or remove the file")
        verification = plan.manifest["verification"]
        passed, problems = package_verdict(plan.manifest)  # the build's rule
        if passed:
            for run in plan.failed:
                warn(f"{plan.name}: refused (the loader will not pick it; every chain keeps a verified variant): {describe_run(run)}")
        else:
            failed = plan.failed
            reasons = [describe_run(run) for run in failed] or problems
            if not allow_failed:
                raise PackError(
                    f"{plan.root}: verification failed, not publishing {plan.name}: {'; '.join(dict.fromkeys(problems + reasons))}; "
                    "fix the model or recipe and rebuild, or pass --allow-failed (PACK_ALLOW_FAILED=1) to publish it anyway"
                )
            for reason in reasons:
                warn(f"{plan.name}: publishing despite a failed check (--allow-failed): {reason}")
        if not verification["browser"]:
            warn(f"{plan.name}: never verified in a browser (built with --no-browser); run `pack verify {plan.root}` before serving it")
    return warnings


def _plan_all(dist: list[Path] | None, allow_none: bool) -> list[PackagePlan]:
    """Validate every package before any request: a bad one means nothing is uploaded."""
    if not dist and allow_none and not DEFAULT_DIST.exists():
        return []  # `pack publish --cors ORIGIN` alone only sets the CORS rule
    folders = [folder for root in (dist or [DEFAULT_DIST]) for folder in find_packages(root)]
    plans = [plan_package(folder) for folder in folders]
    seen: dict[str, Path] = {}
    for plan in plans:
        if plan.name in seen:
            raise PackError(f"{plan.root} and {seen[plan.name]}: both are package {plan.name!r}; publish one of them")
        seen[plan.name] = plan.root
    return plans


def _summary_json(result: PublishResult, rules: list[dict[str, Any]] | None, checks=None) -> dict[str, Any]:
    urls = result.loader_urls
    return {
        "uploaded": result.uploaded,
        "skipped": result.skipped,
        "deleted": result.deleted,
        "bytes": result.bytes,
        "seconds": round(result.seconds, 3),
        "dry_run": result.dry_run,
        "objects": [obj.as_json() for obj in result.objects],
        "loader_url": next(iter(urls.values())) if len(urls) == 1 else None,
        "loader_urls": urls,
        "cors": rules,
        "warnings": result.warnings,
        "remote_unchecked": result.remote_unchecked,
        "check": None if checks is None else [check.as_json() for check in checks],  # null: --no-check or --dry-run
        "errors": [error for check in checks or [] for error in check.errors],
    }


def _print_summary(result: PublishResult, rules: list[dict[str, Any]] | None, what_else: list[str]) -> None:
    if result.remote_unchecked is not None:
        _print_local_plan(result, what_else)
        return
    rate = result.bytes / result.seconds / 1e6 if result.seconds > 0 else 0.0
    verb = "would upload" if result.dry_run else "uploaded"
    line = (
        f"{verb} {result.uploaded} objects ({result.bytes / 1e6:.1f} MB), skipped {result.skipped} unchanged"
        + (f", {'would delete' if result.dry_run else 'deleted'} {result.deleted}" if result.deleted else "")
        + f" in {result.seconds:.1f} s"
        + (f" ({rate:.1f} MB/s)" if result.bytes and not result.dry_run else "")
    )
    typer.echo(("dry run, nothing changed: " if result.dry_run else "") + line)
    if rules is not None:
        typer.echo(f"CORS: GET/HEAD allowed from {', '.join(rules[-1]['AllowedOrigins'])}")
    for name, url in result.loader_urls.items():
        typer.echo(f"{name}: {url}")


def _print_local_plan(result: PublishResult, what_else: list[str]) -> None:
    """--dry-run without a bucket to ask: every object in upload order with its bytes and headers."""
    typer.echo("dry run, nothing changed: local plan, in upload order")
    width = max((len(obj.key) for obj in result.objects), default=0)
    for number, obj in enumerate(result.objects, 1):
        encoding = f"; Content-Encoding: {obj.content_encoding}" if obj.content_encoding else ""
        typer.echo(f"  {number:>3} {obj.key:<{width}}  {obj.bytes:>11,d} B  {obj.content_type}{encoding}; Cache-Control: {obj.cache_control}")
    typer.echo(f"would upload at most {result.uploaded} objects ({result.bytes / 1e6:.1f} MB)")
    unchecked = ", ".join(["which objects already exist (they would be skipped)", *what_else])
    typer.echo(f"not checked remotely: {unchecked}: {result.remote_unchecked}")
